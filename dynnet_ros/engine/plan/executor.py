"""The planned executor: segments as onnxruntime sessions, boundary tensors in one planned arena.

Per model (once): simplify → order → partition → one session per segment, all sharing the same
weight buffers. Per shape signature (once, then cached): evaluate every boundary tensor's
shape (RDP), give each an offset in the arena (``plan_offsets`` over segment-step lifetimes),
and pre-bind it through ``IOBinding`` to a pointer into the arena. Per run: bind the user's
feeds and fresh output arrays, run the segments in our order. Nothing is copied between
segments; tensors whose shape only execution reveals (nac) are left to onnxruntime and passed
on as ``OrtValue``s.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Mapping

import numpy as np
import onnx
import onnxruntime as ort

from dynnet_ros.engine.memtrim import pin_mmap_threshold
from dynnet_ros.engine.plan.arena import Arena, align
from dynnet_ros.engine.plan.cache import LruCache
from dynnet_ros.engine.plan.graph import GraphIndex, node_inputs, split_weights, subgraphs
from dynnet_ros.engine.plan.loader import external_data_dir
from dynnet_ros.engine.plan.memory_plan import lower_bound, plan_offsets
from dynnet_ros.engine.plan.partition import Segment, describe_segment, partition, sink_small_nodes
from dynnet_ros.engine.plan.shapes import ShapeSource, make_shape_source
from dynnet_ros.engine.plan.versions import Version, VersionManager

log = logging.getLogger(__name__)

Signature = tuple[tuple[str, tuple[int, ...]], ...]


@dataclass
class PlannerOptions:
    """Knobs of the planned engine (defaults are what the benchmarks chose; see docs/engine.md)."""

    threads: int | None = None
    granularity: str = "choose"            # choose (cheaper of auto/fine, see _choose_partition) | auto | fine | coarse
    small_bytes: int = 64 * 1024           # tensors below this stay inside a segment
    reference_side: int = 640              # symbol value used to size tensors when partitioning
    plan_cache_size: int = 16              # shape signatures whose plans are kept (LRU)
    optimization_level: str = "extended"   # onnxruntime level inside segments: basic | extended | all
    segment_arena: bool = False            # onnxruntime's own BFC arena inside each segment session
    shared_arena: bool = False             # one process-wide onnxruntime arena shared by all segment sessions
    shared_arena_strategy: int = 1         # its growth: 1 = kSameAsRequested, 0 = kNextPowerOfTwo
    versions: bool = True                  # shape-specialised segment sessions for hot signatures
    hot_after: int = 8                     # uses of a signature before its version is built
    version_budget_mb: float = 4.0         # bytes all versions may hold (their weight copies + sessions)
    simplify: bool = True
    use_rdp: bool = True
    order: str = "memory"                  # memory (exec_order) | model
    prepacking: bool = True                # onnxruntime's weight prepacking (a second copy of Gemm/MatMul B)
    # glibc serves blocks above this by mmap, so onnxruntime's per-run workspaces go back to the
    # OS instead of fragmenting the heap (+10 MB peak on depth without it). 128 KiB matters:
    # convolution working buffers are exactly 128 KiB at 2 threads (multiexit 40.5 vs 55.6 MB
    # peak at 192 KiB). Process-wide; costs a page fault per touched page of big allocations.
    mmap_threshold: int | None = 128 * 1024
    # False: every parallel op wakes its threads. True: onnxruntime's default (idle pools keep
    # spinning: 10x slower with 20-45 pools on 2 cores). "run": spin during a segment's run only
    # (force_spinning_stop) — no faster on an idle machine (16.1 vs 16.4 ms, pedestrian), 1.75x
    # slower next to a CPU-bound process (37.7 vs 21.5 ms), so not the default
    spinning: bool | str = False
    plan_branches: bool = True             # If: taken branch / Loop: body per iteration, as own plans (control.py, loop.py)
    light_segment_threads: int | None = 1  # threads for segments without Conv/Gemm/MatMul (None: same)
    nchwc_max_bytes: int = 2**20           # segments whose tensors stay below this use ORT_ENABLE_ALL (NCHWc)
    nchwc_shared_arena: bool = False       # NCHWc segments' reorder buffers from one shared onnxruntime arena
    in_place: bool = True                  # element-wise segments write over an input that dies there
    stem_bands: int = 4                    # at least this many row bands for the stem convs (plan/banded.py); 0 = off
    stem_min_bytes: int = 2**20            # ... when the first conv's output is at least this big (reference shape)
    stem_min_gain: float = 0.1             # ... and banding lowers the reference arena bound by this fraction
    global_threads: bool = False           # all segment sessions share onnxruntime's process-wide thread pool
    layout: str = "as-given"               # "nchwc": the graph is onnxruntime's blocked-layout rewrite (plan/layout.py)
    # Weights bound by reference (name -> OrtValue over memory someone else owns and may swap;
    # swap/streamed.py): sessions get them through add_initializer, which keeps the pointer only
    # with prepacking off, so setting this turns prepacking off.
    shared_weights: Mapping[str, ort.OrtValue] | None = None
    max_segment_weight_bytes: int | None = None  # cut segments holding more weight than this (swapping unit)


_LEVELS = {"basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
           "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
           "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}


@dataclass
class TensorSlot:
    """Where one boundary tensor lives for a given signature."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...] | None      # None: nac, onnxruntime allocates it
    offset: int | None = None          # byte offset in the arena (None: not in the arena)
    lifetime: tuple[int, int] = (0, 0)  # [first segment, last segment + 1)
    alias_of: str | None = None        # written in place over this (dying) input's bytes


@dataclass
class Plan:
    """Everything that depends only on the input shape signature."""

    signature: Signature
    slots: dict[str, TensorSlot]
    height: int
    lower_bound: int
    seconds: float
    arena_generation: int = -1
    bindings: list = field(default_factory=list)
    runners: list = field(default_factory=list)    # the runner each binding belongs to
    loose: list = field(default_factory=list)      # per segment: (inputs, outputs) not in the arena, bound per run
    bound_version: object = None                   # the Version the bindings were made for
    uses: int = 0


class SegmentRunner:
    """One segment compiled into an onnxruntime session over shared weights."""

    def __init__(self, segment: Segment, graph: GraphIndex, skeleton: onnx.ModelProto,
                 weights: Mapping[str, ort.OrtValue], options: ort.SessionOptions,
                 input_shapes: Mapping[str, tuple[int, ...]] | None = None,
                 model: onnx.ModelProto | None = None,
                 shared: Mapping[str, ort.OrtValue] | None = None) -> None:
        self.segment = segment
        model = model or build_segment_model(segment, graph, skeleton, input_shapes)
        folder = external_data_dir(skeleton)
        if folder:  # weights referenced in the model file itself: onnxruntime reads them from there
            options.add_session_config_entry("session.model_external_initializers_file_folder_path", folder)
        used = [i.name for i in model.graph.initializer if i.name in weights]
        if used:
            options.add_external_initializers(used, [weights[n] for n in used])
        for name in {i.name for i in model.graph.initializer if shared and i.name in shared} - set(used):
            options.add_initializer(name, shared[name])  # by reference: the OrtValue's memory is used as is
        try:
            self.session = ort.InferenceSession(model.SerializeToString(), sess_options=options,
                                                providers=["CPUExecutionProvider"])
        except Exception as exc:
            raise ValueError(f"onnxruntime cannot load segment {segment.index} "
                             f"({[graph.nodes[n].op_type for n in segment.nodes]}): "
                             f"{str(exc).strip().splitlines()[0]}") from exc


class _NoSession:
    """Stands in for a segment whose work is done elsewhere (an If run by its branch plans)."""

    session = None

    def __init__(self, segment: Segment) -> None:
        self.segment = segment


def build_segment_model(segment: Segment, graph: GraphIndex, skeleton: onnx.ModelProto,
                        input_shapes: Mapping[str, tuple[int, ...]] | None = None) -> onnx.ModelProto:
    """A standalone model for one segment: boundary tensors as inputs/outputs, weights as placeholders.

    ``input_shapes`` pins the inputs to concrete shapes (a specialised version); otherwise every
    input has an unknown shape and the session is generic.
    """
    return build_nodes_model([graph.nodes[n] for n in segment.nodes], segment, graph, skeleton, input_shapes)


def build_nodes_model(nodes: list[onnx.NodeProto], segment: Segment, graph: GraphIndex, skeleton: onnx.ModelProto,
                      input_shapes: Mapping[str, tuple[int, ...]] | None = None) -> onnx.ModelProto:
    """A standalone model running ``nodes`` with ``segment``'s inputs and outputs."""
    weights_used: list[str] = []
    for node in nodes:
        for name in node_inputs(node):
            if graph.is_weight(name) and name not in weights_used:
                weights_used.append(name)
    skeleton_inits = {t.name: t for t in skeleton.graph.initializer}
    shapes = input_shapes or {}
    inputs = [onnx.helper.make_tensor_value_info(name, graph.elem_types[name],
                                                 list(shapes[name]) if name in shapes else None)
              for name in segment.inputs]
    outputs = [onnx.helper.make_tensor_value_info(name, graph.elem_types.get(name, 0), None)
               for name in segment.outputs]
    sub = onnx.helper.make_graph(nodes, f"segment_{segment.index}", inputs, outputs,
                                 [skeleton_inits[w] for w in weights_used])
    model = onnx.helper.make_model(sub, opset_imports=list(graph.model.opset_import))
    model.ir_version = graph.model.ir_version
    model.functions.extend(graph.model.functions)
    return model


def _reference_shapes(graph: GraphIndex, side: int) -> dict[str, tuple[int, ...]]:
    """Pin every dynamic input dim to ``side`` (batch-like dims named N/batch to 1)."""
    shapes = {}
    for value in graph.model.graph.input:
        if value.name not in graph.inputs:
            continue
        dims = []
        for d in value.type.tensor_type.shape.dim:
            if d.HasField("dim_value"):
                dims.append(int(d.dim_value))
            elif (d.dim_param or "").lower() in ("n", "batch", "batch_size", "b"):
                dims.append(1)
            else:
                dims.append(side)
        shapes[value.name] = tuple(dims)
    return shapes


class PlannedExecutor:
    """Executor (see backends.base) running a model as planned segments over one arena."""

    name = "cpu-planned"

    def __init__(self, model: onnx.ModelProto, options: PlannerOptions | None = None, *,
                 arena: Arena | None = None) -> None:
        """``arena``: share one arena between executors that never run at the same time (the
        branches of If nodes); by default the executor owns its arena."""
        self.options = options or PlannerOptions()
        opts = self.options
        if opts.mmap_threshold:
            pin_mmap_threshold(opts.mmap_threshold)
        self.original_nodes = len(model.graph.node)
        self.simplify_report = None
        # Weights leave the proto once (one copy); every pass below works on the skeleton.
        skeleton, weights = split_weights(model)
        # Analyse the model as given: simplification keeps tensor names, so the analysis (and
        # the element types) of the original describe every tensor of the simplified graph.
        self.shape_source: ShapeSource = make_shape_source(skeleton, use_rdp=opts.use_rdp)
        rdp = getattr(getattr(self.shape_source, "rdp", None), "result", None)
        # RDP types every tensor it analyses (contrib ops of a laid-out graph included); onnx's
        # shape inference is only run when it does not (it keeps onnx's library resident)
        rdp_types = {name: info.dtype for name, info in rdp.tensors.items() if info.dtype} if rdp else {}
        infer = not all(o in rdp_types for node in skeleton.graph.node for o in node.output if o)
        original_types = GraphIndex.build(skeleton, rdp_types, infer=infer).elem_types
        if opts.simplify:
            from dynnet_ros.engine.plan.simplify import simplify

            skeleton, self.simplify_report = simplify(skeleton, use_rdp=opts.use_rdp and rdp is not None, rdp=rdp,
                                                      weights=weights)
        self.graph = GraphIndex.build(skeleton, original_types, weights, infer=infer)
        self._lock = threading.Lock()
        # In-memory weights (file-backed ones stay in the file) go to the sessions as OrtValues.
        self._weight_arrays = weights
        self.weights = {n: ort.OrtValue.ortvalue_from_numpy(a) for n, a in weights.items()}
        self.skeleton = skeleton
        self.reference_sizes = self._reference_sizes()
        self._input_sizes = {n: int(np.prod(shape, dtype=np.int64)) * self._itemsize(n)  # graph inputs
                             for n, shape in _reference_shapes(self.graph, opts.reference_side).items()}
        self.order = self._execution_order()
        self.segments = self._choose_partition()
        if opts.max_segment_weight_bytes:
            self.segments = self._cut_heavy_segments(self.segments, opts.max_segment_weight_bytes)
        self._stem = self._band_stem()
        self._check_boundary_types()
        self.branch_runners = self._build_branch_runners(weights)
        if self._stem is not None:
            self.branch_runners[self._stem] = self._build_banded_runner(self.segments[self._stem])
        in_memory = set(weights)
        self.runners = self._build_runners(weights)
        # onnxruntime copied the in-memory weights into its sessions; ours are no longer needed
        # (weights that are graph outputs themselves are kept to return them).
        self._released_weights = set(in_memory)  # in-memory weights now only inside the generic sessions
        self._weight_arrays = {n: a for n, a in weights.items() if n in self.graph.outputs}
        self.graph.weights = self._weight_arrays
        self.weights = {}
        weights.clear()  # simplify's folded arrays too: only onnxruntime's copies remain
        self._producer_segment = {o: s.index for s in self.segments for n in s.nodes
                                  for o in self.graph.nodes[n].output if o}
        self._last_use = self._last_uses()
        self._owns_arena = arena is None
        self.arena = arena if arena is not None else Arena()
        self.plans: LruCache[Plan] = LruCache(opts.plan_cache_size)
        self.last_plan: Plan | None = None
        self._segment_weight_bytes = [self._weight_bytes_of(s) for s in self.segments]
        #: called around every segment (swap/residency.py: weights in before, out after)
        self.segment_hook = None
        self.versions = VersionManager(self._build_version, hot_after=opts.hot_after,
                                       budget_bytes=int(opts.version_budget_mb * 2**20), enabled=opts.versions)
        self._warm_up()
        _release_build_garbage()

    # ------------------------------------------------------------------ build
    def _build_branch_runners(self, weights: Mapping[str, np.ndarray]) -> dict[int, object]:
        """If/Loop segments whose branches/body can be planned on their own (else onnxruntime's
        If/Loop runs them); plan/control.py, plan/loop.py."""
        from dynnet_ros.engine.plan.control import IfRunner
        from dynnet_ros.engine.plan.loop import LoopRunner

        kinds = {"If": IfRunner, "Loop": LoopRunner}
        runners: dict[int, object] = {}
        if not self.options.plan_branches:
            return runners
        branch_arena = None
        nested = replace(self.options, versions=False)
        for seg in self.segments:
            node = self.graph.nodes[seg.nodes[0]]
            if seg.kind != "control" or len(seg.nodes) != 1 or node.op_type not in kinds:
                continue
            ranks = {}
            for name in seg.inputs:
                dims = self.shape_source.dims(name)
                if dims is not None:
                    ranks[name] = len(dims)
            branch_arena = branch_arena or Arena()
            try:
                runners[seg.index] = kinds[node.op_type](node, self.graph, self.skeleton, weights, ranks, nested,
                                                         branch_arena)
            except ValueError as exc:
                log.info("%s %s stays with onnxruntime's %s: %s", node.op_type, node.name, node.op_type, exc)
        self._branch_arena = branch_arena
        return runners

    def _choose_partition(self) -> list[Segment]:
        """Segments for ``options.granularity``; "choose" takes the cheaper of partition's "auto" and
        "fine" cuts by a cost model: lower bound of the boundary tensors at the reference shape +
        one session's overhead per segment.

        Why: a finer cut exposes more tensors to our arena with shorter lifetimes (depth's lower
        bound at 640 px: 25.8 MB auto vs 20.3 MB fine; multiexit 12.5 vs 9.4) but costs sessions
        (~0.1-0.25 MB each) and a little CPU; measured peaks follow this model (depth -4.3 MB,
        multiexit -1.4 MB with fine; lane, gated, pedestrian unchanged, so they keep auto).
        """
        opts = self.options

        def cut(granularity: str) -> list[Segment]:
            return partition(self.graph, self.order, self.reference_sizes, self.shape_source.dims,
                             small_bytes=opts.small_bytes, granularity=granularity,
                             category=self.shape_source.category)

        if opts.granularity != "choose":
            self.granularity = opts.granularity
            return cut(opts.granularity)
        costs = {}
        for granularity in ("auto", "fine"):  # ties keep auto (fewer sessions)
            segments = cut(granularity)
            costs[granularity] = (self._reference_lower_bound(segments) + _SESSION_BYTES * len(segments), segments)
        self.granularity = min(costs, key=lambda g: costs[g][0])
        return costs[self.granularity][1]

    def _band_stem(self) -> int | None:
        """Merge a bandable stem's two conv segments into one banded segment (plan/banded.py);
        its index, or None. Only where the stem's intermediate is big enough to matter."""
        from dynnet_ros.engine.plan.banded import find_stem

        opts = self.options
        if not opts.stem_bands or opts.stem_bands < 2:
            return None
        found = find_stem(self.graph, self.reference_sizes, opts.stem_min_bytes)
        if found is None:
            return None
        first_node, seconds = found
        if any(not self.graph.is_weight(i) for n in seconds for i in self.graph.nodes[n].input[1:] if i):
            return None
        # The stem becomes one segment where the first conv's segment was: the seconds only read
        # its output (and weights), so running them right after it keeps a topological order.
        position = {n: i for i, n in enumerate(self.order)}
        stem = [first_node] + sorted(seconds, key=position.__getitem__)
        groups: list[list[int]] = []
        for segment in self.segments:
            nodes = list(segment.nodes)
            if first_node in nodes:
                k = nodes.index(first_node)
                before, after = [n for n in nodes[:k] if n not in stem], [n for n in nodes[k + 1:] if n not in stem]
                groups += [g for g in (before, stem, after) if g]
            elif any(n not in stem for n in nodes):
                groups.append([n for n in nodes if n not in stem])
        segments = [describe_segment(self.graph, i, g, self.shape_source.dims) for i, g in enumerate(groups)]
        index = groups.index(stem)
        segments[index] = replace(segments[index], kind="banded")
        # worth it only where the stem sets the peak: bands cost copies and session calls
        sizes = self.reference_sizes
        band_bytes = (sum(sizes.get(t) or 0 for n in stem for t in self.graph.nodes[n].output)
                      + self._input_sizes.get(self.graph.nodes[first_node].input[0], 0))
        band_bytes /= self._stem_band_count(first_node)
        if self._reference_lower_bound(segments) + band_bytes > \
                (1 - self.options.stem_min_gain) * self._reference_lower_bound(self.segments):
            return None
        self.segments = segments
        return index

    def _cut_heavy_segments(self, segments: list[Segment], cap: int) -> list[Segment]:
        """Split op segments whose weights exceed ``cap`` into runs of nodes under it.

        Why: a swapped model needs one segment's weights resident at once; deep layers at low
        resolution land in one segment (their tensors are small) with most of the weights."""
        groups: list[list[int]] = []
        for seg in segments:
            if seg.kind != "ops" or len(seg.nodes) == 1 or self._weight_bytes_of(seg) <= cap:
                groups.append(list(seg.nodes))
                continue
            group, held = [], 0
            for n in seg.nodes:
                weight = self._node_weight_bytes(n)
                if group and weight and held + weight > cap:
                    groups.append(group)
                    group, held = [], 0
                group.append(n)
                held += weight
            groups.append(group)
        if len(groups) == len(segments):
            return segments
        return [describe_segment(self.graph, i, g, self.shape_source.dims) for i, g in enumerate(groups)]

    def _node_weight_bytes(self, n: int) -> int:
        total = 0
        for name in node_inputs(self.graph.nodes[n]):
            tensor = self.graph.initializers.get(name)
            if tensor is not None:
                total += int(np.prod(tensor.dims, dtype=np.int64)) * self._itemsize(name)
        return total

    def segment_weight_names(self) -> list[list[str]]:
        """Per segment, the shared (by-reference) weights it reads, subgraphs included."""
        shared = self.options.shared_weights or {}
        result = []
        for seg in self.segments:
            names: list[str] = []
            for n in seg.nodes:
                for name in _names_read(self.graph.nodes[n]):
                    if name in shared and name not in names:
                        names.append(name)
            result.append(names)
        return result

    def _stem_band_count(self, first_node: int) -> int:
        """Bands for the stem: a band of its intermediate ~1 MB at the reference shape (4..16)."""
        mid_bytes = self.reference_sizes.get(self.graph.nodes[first_node].output[0]) or 0
        return min(16, max(self.options.stem_bands, -(-mid_bytes // 2**20)))

    def _build_banded_runner(self, segment: Segment):
        from dynnet_ros.engine.plan.banded import BandedRunner
        from dynnet_ros.engine.rdp.ops.ort_contrib import nchwc_block_size

        first, seconds = self.graph.nodes[segment.nodes[0]], [self.graph.nodes[n] for n in segment.nodes[1:]]
        options = lambda: self._session_options(segment)  # noqa: E731 - one fresh SessionOptions per session

        def make_session(node: onnx.NodeProto) -> ort.InferenceSession:
            inputs = [node.input[0]]
            single = Segment(segment.index, [], inputs=inputs, outputs=[node.output[0]])
            model = build_nodes_model([node], single, self.graph, self.skeleton)
            return SegmentRunner(single, self.graph, self.skeleton, self.weights, options(), model=model,
                                 shared=self.options.shared_weights).session

        mid_channels = int(self.graph.initializers[first.input[1]].dims[0])
        return BandedRunner(first, seconds, make_session, nchwc_block_size() or 1, mid_channels,
                            bands=self._stem_band_count(segment.nodes[0]), workspace=f"__stem_workspace_{segment.index}")

    def _reference_lower_bound(self, segments: list[Segment]) -> int:
        """Max bytes of boundary tensors live at once at the reference shape (unknown sizes: 0)."""
        last: dict[str, int] = {}
        for seg in segments:
            for name in seg.inputs:
                last[name] = max(last.get(name, -1), seg.index)
        buffers = []
        for seg in segments:
            for name in seg.outputs:
                size = self.reference_sizes.get(name)
                if size and name not in self.graph.outputs:
                    buffers.append((seg.index, max(last.get(name, seg.index), seg.index) + 1, align(size)))
        return int(lower_bound(buffers)) if buffers else 0

    def _build_runners(self, weights: dict[str, np.ndarray]) -> list:
        """One session per segment; each in-memory weight is dropped as soon as the last session
        using it exists (onnxruntime copied it), so building never holds two copies of all
        weights at once (depth, whose BatchNorm-folded weights are all in memory: -45 MB peak)."""
        last_user: dict[str, int] = {}
        for seg in self.segments:
            for n in seg.nodes:
                for name in node_inputs(self.graph.nodes[n]):
                    if name in weights:
                        last_user[name] = seg.index
        keep = set(self.graph.outputs)
        opts = self.options
        runners: list = []
        for seg in self.segments:
            if seg.index in self.branch_runners:
                runners.append(_NoSession(seg))
                continue
            runners.append(SegmentRunner(seg, self.graph, self.skeleton, self.weights, self._session_options(seg),
                                         shared=opts.shared_weights))
            for name in [w for w, last in last_user.items() if last == seg.index and w not in keep]:
                self.weights.pop(name, None)
                weights.pop(name, None)
                del last_user[name]
        return runners

    def _session_options(self, segment: Segment | None = None) -> ort.SessionOptions:
        from dynnet_ros.engine.backends.cpu import default_threads

        opts = self.options
        so = ort.SessionOptions()
        so.log_severity_level = 3
        threads = opts.threads or default_threads()
        if opts.global_threads and _use_global_pool(threads):
            # one process-wide pool (sized once) instead of one pool per segment session
            so.use_per_session_threads = False
        else:
            so.intra_op_num_threads = threads
            so.inter_op_num_threads = 1
            if segment is not None and opts.light_segment_threads and not any(
                    self.graph.nodes[n].op_type in _HEAVY_OPS for n in segment.nodes):
                # waking a thread pool costs more than memory-bound element-wise work gains from it
                so.intra_op_num_threads = min(threads, opts.light_segment_threads)
            if opts.spinning == "run":
                # spin between the ops of this segment's run (no futex wake per parallel op), stop
                # when the run ends so idle pools never steal the cores the next segment needs
                so.add_session_config_entry("session.force_spinning_stop", "1")
            elif not opts.spinning:
                # every segment session has its own pool; spinning workers of the segment that just
                # finished would steal the cores the next segment needs
                so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        so.graph_optimization_level = _LEVELS[opts.optimization_level]
        nchwc = segment is not None and opts.nchwc_max_bytes and \
            self._segment_peak_tensor(segment) <= opts.nchwc_max_bytes
        if nchwc:
            # NCHWc kernels are faster but need reorder buffers the size of the segment's tensors:
            # worth it where tensors are small (deep, many-channel layers), not at full resolution
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.enable_cpu_mem_arena = opts.segment_arena
        so.enable_mem_pattern = False  # patterns are per shape; our arena plans across shapes instead
        if opts.shared_arena or (nchwc and opts.nchwc_shared_arena):
            _register_shared_arena(opts.shared_arena_strategy)
            so.add_session_config_entry("session.use_env_allocators", "1")
        if not opts.prepacking or opts.shared_weights is not None:
            so.add_session_config_entry("session.disable_prepacking", "1")
        return so

    def _segment_peak_tensor(self, segment: Segment) -> int:
        """Largest tensor the segment reads or writes at the reference shape (unknown = huge)."""
        names = segment.inputs + [o for n in segment.nodes for o in self.graph.nodes[n].output if o]
        sizes = [self.reference_sizes.get(n, self._input_sizes.get(n)) for n in names]
        return max((1 << 62 if s is None else s) for s in sizes) if sizes else 0

    def _reference_sizes(self) -> dict[str, int | None]:
        names = [o for node in self.graph.nodes for o in node.output if o]
        for side in (self.options.reference_side, 512, 320, 224):
            try:
                shapes = self.shape_source.shapes(_reference_shapes(self.graph, side), names)
            except ValueError:
                continue
            sizes = {n: (None if s is None else int(np.prod(s, dtype=np.int64)) * self._itemsize(n))
                     for n, s in shapes.items()}
            self._limit_shape_fallback(_reference_shapes(self.graph, side), sizes)
            return sizes
        return {n: None for n in names}

    def _limit_shape_fallback(self, shapes: Mapping[str, tuple[int, ...]], sizes: Mapping[str, int | None]) -> None:
        """Keep onnx-inference fallback only for big tensors RDP leaves unknown (see CombinedShapes)."""
        rdp = getattr(self.shape_source, "rdp", None)
        if rdp is None or not hasattr(self.shape_source, "limit_fallback"):
            return
        known = rdp.shapes(shapes, list(sizes))
        self.shape_source.limit_fallback(n for n, size in sizes.items()
                                         if known.get(n) is None and size is not None
                                         and size > self.options.small_bytes)

    def _itemsize(self, name: str) -> int:
        dtype = self.graph.dtypes.get(name)
        return dtype.itemsize if dtype is not None else 4

    def _execution_order(self) -> list[int]:
        order = list(range(len(self.graph.nodes)))
        if self.options.order == "memory":
            order = memory_order(self.graph, self.reference_sizes) or order
        return sink_small_nodes(self.graph, order,
                                lambda t: (self.reference_sizes.get(t) or 1 << 62) <= self.options.small_bytes)

    def _check_boundary_types(self) -> None:
        for seg in self.segments:
            for name in seg.inputs + seg.outputs:
                if name not in self.graph.elem_types:
                    raise ValueError(f"element type of boundary tensor {name!r} is unknown; "
                                     f"the planned engine cannot cut the graph there")

    def _last_uses(self) -> dict[str, int]:
        last: dict[str, int] = {}
        for seg in self.segments:
            for name in seg.inputs:
                last[name] = max(last.get(name, -1), seg.index)
        return last

    def _warm_up(self) -> None:
        """Plan the reference signature once so lazy imports and first-call costs are paid at load,
        not by the first inference (keeps first-run latency near steady state)."""
        try:
            self.plan_for(_reference_shapes(self.graph, self.options.reference_side))
        except ValueError:
            plan_offsets([(0, 1, 64), (0, 2, 64)])

    # ------------------------------------------------------------------ plan
    def plan_for(self, feeds_shapes: Mapping[str, tuple[int, ...]]) -> Plan:
        """The cached plan for this signature, or a new one (ValueError if a constraint breaks)."""
        signature: Signature = tuple(sorted((k, tuple(v)) for k, v in feeds_shapes.items()))
        plan = self.plans.get(signature)
        if plan is not None:
            return plan
        start = time.perf_counter()
        boundary = [o for s in self.segments for o in s.outputs]
        shapes = self.shape_source.shapes(dict(feeds_shapes), boundary)
        slots: dict[str, TensorSlot] = {}
        for name in boundary:
            dtype = self.graph.dtypes.get(name, np.dtype(np.float32))
            slot = TensorSlot(name, dtype, shapes.get(name))
            first = self._producer_segment[name]
            slot.lifetime = (first, max(self._last_use.get(name, first), first) + 1)
            slots[name] = slot
        for index, runner in self._banded_runners():
            outs = [slots.get(name) for name in runner.outputs]
            if any(out is None or out.shape is None for out in outs):
                raise ValueError(f"the banded stem's outputs {runner.outputs} have no known shape")
            size = runner.workspace_bytes(tuple(feeds_shapes[runner.image]), [out.shape for out in outs])
            slot = TensorSlot(runner.workspace, np.dtype(np.uint8), (size,))
            slot.lifetime = (index, index + 1)
            slots[runner.workspace] = slot
            boundary = boundary + [runner.workspace]
        in_arena = {n for n, s in slots.items() if s.shape is not None and n not in self.graph.outputs}
        roots = self._alias_in_place(slots, in_arena) if self.options.in_place else {}
        # one buffer per root: an in-place chain x -> relu(x) -> add(.., y) shares x's bytes,
        # and that buffer lives from x's producer to the chain's last reader
        ends = {n: slots[n].lifetime[1] for n in in_arena if n not in roots}
        for name, root in roots.items():
            ends[root] = max(ends[root], slots[name].lifetime[1])
        planned = [slots[n] for n in boundary if n in in_arena and n not in roots]
        buffers = [(s.lifetime[0], ends[s.name],
                    max(align(int(np.prod(s.shape, dtype=np.int64)) * s.dtype.itemsize), 1)) for s in planned]
        offsets, height = plan_offsets(buffers) if buffers else ([], 0)
        for slot, offset in zip(planned, offsets):
            slot.offset = int(offset)
        for name, root in roots.items():
            slots[name].offset, slots[name].alias_of = slots[root].offset, root
        plan = Plan(signature, slots, int(height), int(lower_bound(buffers)) if buffers else 0,
                    time.perf_counter() - start)
        self.plans.put(signature, plan)
        return plan

    def _banded_runners(self):
        from dynnet_ros.engine.plan.banded import BandedRunner

        return [(i, r) for i, r in self.branch_runners.items() if isinstance(r, BandedRunner)]

    def _alias_in_place(self, slots: Mapping[str, TensorSlot], in_arena: set[str]) -> dict[str, str]:
        """Outputs written over an input's bytes: {output: root tensor whose buffer it shares}.

        Only one-node segments of element-wise ops whose onnxruntime CPU kernels allow in-place
        work (each output element depends only on the same input element), over an arena input of
        the same shape and dtype whose last reader is this segment — so nothing reads the
        input's old values afterwards. onnxruntime's own planner reuses buffers the same way.
        """
        roots: dict[str, str] = {}
        for seg in self.segments:
            if len(seg.nodes) != 1 or len(seg.outputs) != 1 or seg.kind != "ops":
                continue
            node = self.graph.nodes[seg.nodes[0]]
            out = seg.outputs[0]
            if node.op_type not in _IN_PLACE_OPS or out not in in_arena:
                continue
            target = slots[out]
            for name in node.input[:2]:
                src = slots.get(name)
                if (src is None or name not in in_arena or src.shape != target.shape or src.dtype != target.dtype
                        or src.lifetime[1] != seg.index + 1):
                    continue
                root = roots.get(name, name)
                roots[out] = root
                break
        return roots

    def _weight_bytes_of(self, segment: Segment) -> int:
        return sum(self._node_weight_bytes(n) for n in segment.nodes)

    def _build_version(self, signature: Signature) -> Version | None:
        """Background thread: specialised runners for the segments whose input shapes this plan knows."""
        start = time.perf_counter()
        plan = self.plans.peek(signature)  # no LRU touch from the worker
        if plan is None:
            return None
        feeds = dict(signature)
        budget = self.versions.budget_bytes
        # cheapest first: segments without weights cost only their session
        order = sorted(range(len(self.segments)), key=lambda i: self._segment_weight_bytes[i])
        runners, cost = {}, 0
        for i in order:
            seg = self.segments[i]
            if seg.kind != "ops" or any(name in self._released_weights for n in seg.nodes
                                        for name in node_inputs(self.graph.nodes[n])):
                continue  # control flow stays generic; released in-memory weights cannot be re-read
            shapes = {}
            for name in seg.inputs:
                slot = plan.slots.get(name)
                shape = feeds.get(name) if name in feeds else (slot.shape if slot is not None else None)
                if shape is None:
                    break
                shapes[name] = tuple(shape)
            else:
                extra = self._segment_weight_bytes[i] + _SESSION_BYTES
                if cost + extra > budget:
                    continue
                options = self._session_options(seg)
                options.enable_mem_pattern = True  # static shapes: onnxruntime can pre-plan the segment
                runners[i] = SegmentRunner(seg, self.graph, self.skeleton, self.weights, options, shapes,
                                           shared=self.options.shared_weights)
                cost += extra
        if not runners:
            return None
        return Version(signature, runners, cost, time.perf_counter() - start)

    def _bind_plan(self, plan: Plan, version: Version | None = None) -> None:
        """Pre-bind every arena tensor of ``plan`` (redone when the arena moves or a version lands)."""
        plan.bindings = []
        plan.runners = []
        plan.loose = []
        for k, generic in enumerate(self.runners):
            runner = version.runners.get(k, generic) if version is not None else generic
            plan.runners.append(runner)
            seg = runner.segment
            plan.loose.append(([n for n in seg.inputs if plan.slots.get(n) is None or plan.slots[n].offset is None],
                               [n for n in seg.outputs if plan.slots[n].offset is None]))
            if runner.session is None:  # an If planned by its branches: nothing to bind
                plan.bindings.append(None)
                continue
            io = runner.session.io_binding()
            for name in seg.inputs:
                slot = plan.slots.get(name)
                if slot is not None and slot.offset is not None:
                    io.bind_input(name, "cpu", 0, slot.dtype, slot.shape, self.arena.address(slot.offset))
            for name in seg.outputs:
                slot = plan.slots[name]
                if slot.offset is not None:
                    io.bind_output(name, "cpu", 0, slot.dtype, slot.shape, self.arena.address(slot.offset))
                else:
                    io.bind_output(name, "cpu")
            plan.bindings.append(io)
        plan.arena_generation = self.arena.generation
        plan.bound_version = version

    # ------------------------------------------------------------------ run
    def run(self, feeds: Mapping[str, np.ndarray],
            out: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """Run on ``feeds``; ``out`` optionally gives arrays to write graph outputs into."""
        with self._lock:
            return self._run(feeds, out or {})

    def _value(self, name: str, plan: Plan, feeds, results, dynamic) -> np.ndarray:
        slot = plan.slots.get(name)
        if slot is not None and slot.offset is not None:
            return self.arena.view(slot.offset, slot.dtype, slot.shape)
        if name in feeds:
            return feeds[name]
        if name in results:
            return results[name]
        if name in dynamic:
            return dynamic[name].numpy()
        raise RuntimeError(f"input {name!r} was not produced")

    def _run(self, feeds: Mapping[str, np.ndarray], out: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        # raw pointers are bound below; np.require keeps 0-d feeds 0-d (a Loop body's iteration number)
        feeds = {k: np.require(v, requirements="C") for k, v in feeds.items()}
        plan = self.plan_for({k: v.shape for k, v in feeds.items()})
        self.arena.ensure(plan.height)
        version = self.versions.get(plan.signature)
        if plan.arena_generation != self.arena.generation or plan.bound_version is not version:
            self._bind_plan(plan, version)
        plan.uses += 1
        self.last_plan = plan
        results: dict[str, np.ndarray] = {}
        dynamic: dict[str, ort.OrtValue] = {}
        graph_outputs = set(self.graph.outputs)
        hook = self.segment_hook
        if hook is None:
            self._run_segments(plan, feeds, out, results, dynamic, graph_outputs)
        else:
            hook.frame_start()
            try:
                self._run_segments(plan, feeds, out, results, dynamic, graph_outputs, hook)
            except BaseException:
                hook.abort()
                raise
            hook.frame_end()
        return self._collect_outputs(plan, feeds, results, dynamic)

    def _run_segments(self, plan: Plan, feeds, out, results, dynamic, graph_outputs, hook=None) -> None:
        previous = None
        for runner, io, (loose_inputs, loose_outputs) in zip(plan.runners, plan.bindings, plan.loose):
            seg = runner.segment
            if hook is not None:
                if previous is not None:
                    hook.after(previous)
                hook.before(seg.index)
                previous = seg.index
            if io is not None and not loose_inputs and not loose_outputs:  # all in the arena, bound once
                self._run_segment(runner, io, plan)
                continue
            if io is None:  # If: only the taken branch runs, as its own plan
                values = {name: self._value(name, plan, feeds, results, dynamic) for name in seg.inputs}
                views = {name: (self.arena.view(plan.slots[name].offset, plan.slots[name].dtype,
                                                plan.slots[name].shape)
                                if plan.slots[name].offset is not None else None) for name in seg.outputs}
                for name in seg.outputs:
                    if views[name] is None and name in out and plan.slots[name].shape == out[name].shape:
                        views[name] = out[name]
                special = self.branch_runners[seg.index]
                workspace = getattr(special, "workspace", None)
                if workspace is not None:  # a banded stem's band buffers
                    slot = plan.slots[workspace]
                    views[workspace] = self.arena.view(slot.offset, slot.dtype, slot.shape)
                produced = special.run(values, views)
                for name, array in produced.items():
                    slot = plan.slots.get(name)  # None: an output of the If/Loop nobody reads
                    if slot is not None and slot.offset is None:
                        results[name] = array
                continue
            for name in loose_inputs:
                if name in feeds:
                    value = feeds[name]
                elif name in results:
                    value = results[name]
                elif name in dynamic:
                    io.bind_ortvalue_input(name, dynamic[name])
                    continue
                else:
                    raise RuntimeError(f"segment {seg.index} input {name!r} was not produced")
                io.bind_input(name, "cpu", 0, value.dtype, value.shape, value.ctypes.data)
            fresh: list[str] = []
            for name in loose_outputs:
                slot = plan.slots[name]
                if slot.shape is not None and name in graph_outputs:
                    given = out.get(name)
                    array = given if given is not None and given.shape == slot.shape and \
                        given.dtype == slot.dtype and given.flags.c_contiguous else np.empty(slot.shape, slot.dtype)
                    results[name] = array
                    io.bind_output(name, "cpu", 0, slot.dtype, slot.shape, array.ctypes.data)
                else:
                    io.bind_output(name, "cpu")  # reset: onnxruntime allocates at the real size
                    fresh.append(name)
            self._run_segment(runner, io, plan)
            if fresh:
                values = io.get_outputs()
                for k, name in enumerate(seg.outputs):
                    if name in fresh:
                        dynamic[name] = values[k]
        if hook is not None and previous is not None:
            hook.after(previous)

    def _collect_outputs(self, plan: Plan, feeds, results, dynamic) -> dict[str, np.ndarray]:
        outputs: dict[str, np.ndarray] = {}
        for name in self.graph.outputs:
            if name in results:
                outputs[name] = results[name]
            elif name in dynamic:
                outputs[name] = dynamic[name].numpy()
            elif name in feeds:
                outputs[name] = np.array(feeds[name], copy=True)
            elif self.graph.is_weight(name):
                outputs[name] = self.graph.initializer_array(name)
            else:
                slot = plan.slots[name]
                outputs[name] = self.arena.view(slot.offset, slot.dtype, slot.shape).copy()
        return outputs

    @staticmethod
    def _run_segment(runner, io, plan: Plan) -> None:
        try:
            runner.session.run_with_iobinding(io)
        except Exception as exc:
            raise ValueError(f"segment {runner.segment.index} failed at input shapes "
                             f"{dict(plan.signature)}: {str(exc).strip().splitlines()[0]}") from exc

    @staticmethod
    def plan_buffers(plan: Plan) -> list[tuple[int, int, int]]:
        """The (start, end, nbytes) buffers the plan placed (for reports and planner comparisons)."""
        ends = {n: s.lifetime[1] for n, s in plan.slots.items() if s.offset is not None and s.alias_of is None}
        for slot in plan.slots.values():
            if slot.alias_of is not None:
                ends[slot.alias_of] = max(ends[slot.alias_of], slot.lifetime[1])
        return [(slot.lifetime[0], ends[slot.name], max(align(int(np.prod(slot.shape, dtype=np.int64))
                                                              * slot.dtype.itemsize), 1))
                for slot in plan.slots.values() if slot.offset is not None and slot.alias_of is None]

    def arena_tensor(self, name: str) -> np.ndarray | None:
        """View of a boundary tensor in the arena for the last plan (tests check zero-copy with it)."""
        plan = self.last_plan
        slot = None if plan is None else plan.slots.get(name)
        if slot is None or slot.offset is None:
            return None
        return self.arena.view(slot.offset, slot.dtype, slot.shape)

    def engine_stats(self) -> dict:
        """What Engine.stats() reports for the planned backend."""
        plan = self.last_plan
        return {
            "arena_bytes": self.arena.capacity,
            "plan": {
                "height_bytes": None if plan is None else plan.height,
                "lower_bound_bytes": None if plan is None else plan.lower_bound,
                "planning_ms": None if plan is None else round(plan.seconds * 1e3, 3),
                "cache": {"entries": len(self.plans), "hits": self.plans.hits, "misses": self.plans.misses,
                          "evictions": self.plans.evictions, "max_entries": self.plans.max_entries},
                "segments": len(self.segments),
                "granularity": self.granularity,
                "nodes": {"model": self.original_nodes, "executed": len(self.graph.nodes)},
                "shape_source": self.shape_source.name,
                "layout": self.options.layout,
            },
            "kernel_versions": self.versions.stats(),
            "loops": [vars(r.stats) for r in self.branch_runners.values() if hasattr(r, "stats")],
        }

    def close(self) -> None:
        self.versions.close()
        with self._lock:
            self.plans.clear()
            self.last_plan = None  # its bindings hold sessions
            self.runners = []
            for runner in self.branch_runners.values():
                runner.close()
            if self._owns_arena:
                self.arena.release()


# Element-wise ops whose onnxruntime CPU kernels declare MayInplace (output over input 0) and
# compute each output element from the same-index input element (binary ops: also input 1).
_IN_PLACE_OPS = {"Relu", "LeakyRelu", "Sigmoid", "Tanh", "HardSigmoid", "Clip", "Abs", "Neg", "Exp", "Sqrt",
                 "Add", "Sub", "Mul", "Div"}
_HEAVY_OPS = {"Conv", "FusedConv", "ConvTranspose", "Gemm", "MatMul", "FusedMatMul", "Attention", "LSTM", "GRU"}
_SESSION_BYTES = 256 * 1024  # what one more onnxruntime session costs beyond its weights (measured ~0.15 MB)


def _names_read(node: onnx.NodeProto) -> list[str]:
    """Inputs of ``node`` and every name its subgraphs read (an If's branch weights)."""
    names = list(node_inputs(node))
    for graph in subgraphs(node):
        names += [t.name for t in graph.initializer]
        for inner in graph.node:
            names += _names_read(inner)
    return names


def _release_build_garbage() -> None:
    """Collect the analysis/build temporaries and hand freed heap pages back to the OS.

    Why: building (RDP, inference, 20-50 session creations) leaves megabytes of freed but
    still-mapped heap; ``malloc_trim`` returns them once, without changing allocator settings.
    """
    import gc

    gc.collect()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass
_SHARED_ARENA = False
_GLOBAL_POOL: int | None = None


def _use_global_pool(threads: int) -> bool:
    """Size onnxruntime's process-wide thread pool once; True when segments can use it.

    Why: one pool per segment session means 20-45 pools whose threads wake and sleep around
    every segment, each thread with its own glibc malloc arena; a single pool is what a
    plain session has. Only possible before onnxruntime's environment exists, so the first
    executor's thread count wins (later ones with another count keep per-session pools).
    """
    global _GLOBAL_POOL
    if _GLOBAL_POOL is None:
        try:
            from onnxruntime.capi import _pybind_state

            _pybind_state.set_global_thread_pool_sizes(int(threads), 1)
            _GLOBAL_POOL = int(threads)
        except Exception as exc:  # environment already created (a session exists): keep per-session pools
            log.info("global onnxruntime thread pool unavailable: %s", exc)
            _GLOBAL_POOL = 0
    return _GLOBAL_POOL == int(threads)


def _register_shared_arena(strategy: int = 1) -> None:
    """One BFC arena for all segment sessions (1 = grow as requested, 0 = by powers of two).

    Process-wide and registered once: the first executor's strategy wins."""
    global _SHARED_ARENA
    if _SHARED_ARENA:
        return
    info = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
    ort.create_and_register_allocator(info, ort.OrtArenaCfg(0, int(strategy), -1, -1))
    _SHARED_ARENA = True


def memory_order(graph: GraphIndex, sizes: Mapping[str, int | None]) -> list[int] | None:
    """Peak-minimising topological order from the planner's exec_order module, when present."""
    try:
        from dynnet_ros.engine.plan import exec_order
    except ImportError:
        return None
    try:
        return exec_order.order_for_executor(graph, sizes)
    except AttributeError:
        return None
