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
import weakref
from collections.abc import Hashable, Mapping
from dataclasses import replace

import numpy as np
import onnxruntime as ort

from dynnet_ros.bytesize import MB
from dynnet_ros.engine.modelio.onnx_proto import ModelProto, NodeProto, TensorProto
from dynnet_ros.engine.plan.arena import Arena, align
from dynnet_ros.engine.plan.banded import BandedRunner, find_stem
from dynnet_ros.engine.plan.cache import LruCache
from dynnet_ros.engine.plan.cost_model import (
    MAC_OPS,
    CutChoice,
    ModelFacts,
    NodeCost,
    choose,
    merge_curve,
    single_session,
)
from dynnet_ros.engine.plan.cost_table import cost_table
from dynnet_ros.engine.plan.exec_order import order_for_executor
from dynnet_ros.engine.plan.graph import GraphIndex, node_inputs, split_weights, subgraphs
from dynnet_ros.engine.plan.memory_plan import lower_bound, plan_offsets
from dynnet_ros.engine.plan.options import PlannerOptions
from dynnet_ros.engine.plan.ort_types import value_types
from dynnet_ros.engine.plan.segmentation import Segment, cut_segments, describe_segment, sink_small_nodes
from dynnet_ros.engine.plan.shapes import ShapeSource, make_shape_source
from dynnet_ros.engine.plan.simplify import simplify
from dynnet_ros.engine.plan.versions import Version, VersionManager
from dynnet_ros.engine.rdp.ops.ort_contrib import nchwc_block_size
from dynnet_ros.engine.runtime.base import ExecutorStats
from dynnet_ros.engine.runtime.binding import Plan, Signature, TensorSlot, bind_plan, plan_buffers
from dynnet_ros.engine.runtime.control_flow import IfRunner
from dynnet_ros.engine.runtime.hooks import BranchRunner, SegmentHook
from dynnet_ros.engine.runtime.loop import LoopRunner
from dynnet_ros.engine.runtime.ort_executor import default_threads
from dynnet_ros.engine.runtime.run_loop import collect_outputs, run_segments
from dynnet_ros.engine.runtime.segments import (
    HEAVY_OPS,
    NoSession,
    SegmentRunner,
    build_nodes_model,
    has_fused_sum,
    segment_session_options,
)
from dynnet_ros.memtrim import pin_mmap_threshold, release_memory

log = logging.getLogger(__name__)

# Element-wise ops whose onnxruntime CPU kernels declare MayInplace (output over input 0) and
# compute each output element from the same-index input element (binary ops: also input 1).
_IN_PLACE_OPS = {"Relu", "LeakyRelu", "Sigmoid", "Tanh", "HardSigmoid", "Clip", "Abs", "Neg", "Exp", "Sqrt",
                 "Add", "Sub", "Mul", "Div"}
_SESSION_BYTES = 256 * 1024  # what one more onnxruntime session costs beyond its weights (docs/engine.md)


class NothingToSave(ValueError):
    """The cost model found no cut set that saves memory over one plain onnxruntime session.

    Raised before any session is built; the planned backend then runs one plain session and
    reports ``choice.reason`` (backends/cpu_planned.py). ``reference_inputs``: the input shapes
    the choice was weighed at."""

    def __init__(self, choice: CutChoice, reference_inputs: Mapping[str, tuple[int, ...]]) -> None:
        super().__init__(choice.reason)
        self.choice = choice
        self.reference_inputs = dict(reference_inputs)


class CutsChosen(Exception):
    """The cut choice made under ``PlannerOptions.decide_only``: the model is to be cut (``choice``
    is None where the cost model did not run), weighed at ``reference_inputs`` (input shapes).
    Not a ValueError: nothing failed."""

    def __init__(self, choice: CutChoice | None, reference_inputs: Mapping[str, tuple[int, ...]]) -> None:
        super().__init__("cut set chosen" if choice is None else choice.reason)
        self.choice = choice
        self.reference_inputs = dict(reference_inputs)


def _names_read(node: NodeProto) -> list[str]:
    """Inputs of ``node`` and every name its subgraphs read (an If's branch weights)."""
    names = list(node_inputs(node))
    for graph in subgraphs(node):
        names += [t.name for t in graph.initializer]
        for inner in graph.node:
            names += _names_read(inner)
    return names


def _macs_per_output(node: NodeProto, initializers: Mapping[str, TensorProto]) -> int:
    """Multiply-accumulates per output element of a Conv/Gemm/MatMul over a weight (1 when the
    second operand is an activation: its size is not known here, the bytes moved count instead)."""
    weight = initializers.get(node.input[1]) if len(node.input) > 1 else None
    if weight is None or len(weight.dims) < 2:
        return 1
    dims = [int(d) for d in weight.dims]
    if node.op_type in ("MatMul", "FusedMatMul"):
        return dims[-2]
    if node.op_type in ("Gemm", "FusedGemm"):
        trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
        return dims[1] if trans_b else dims[0]
    return int(np.prod(dims[1:], dtype=np.int64))  # convolutions: C_in / group x kernel


def reference_shapes(graph: GraphIndex, side: int) -> dict[str, tuple[int, ...]]:
    """Pin every dynamic input dim to ``side``; batch-like dims to 1: named N/batch, a first dim
    with neither value nor name, or the first dim of an input of rank 3 or more (NCHW, NCL,
    NHWC) whatever its name — exporters name it freely (paddle2onnx: ``p2o.DynamicDimension.0``),
    and sizing a batch of ``side`` images would weigh every cut at hundreds of times the size a
    node feeds."""
    shapes = {}
    for value in graph.model.graph.input:
        if value.name not in graph.inputs:
            continue
        dims: list[int] = []
        rank = len(value.type.tensor_type.shape.dim)
        for d in value.type.tensor_type.shape.dim:
            if d.HasField("dim_value") and d.dim_value >= 0:  # -1 marks a dynamic dim in some exporters
                dims.append(int(d.dim_value))
            elif (d.dim_param or "").lower() in ("n", "batch", "batch_size", "b") or not (dims or d.dim_param) \
                    or (not dims and rank >= 3):
                dims.append(1)
            else:
                dims.append(side)
        shapes[value.name] = tuple(dims)
    return shapes

class PlannedExecutor:
    """Executor (see runtime.base) running a model as planned segments over one arena."""

    name = "cpu-planned"

    def __init__(self, model: ModelProto, options: PlannerOptions | None = None, *,
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
        rdp_types.update(value_types(opts.shared_weights or {}))  # weights handed in by reference (swap)
        infer = not all(o in rdp_types for node in skeleton.graph.node for o in node.output if o)
        original_types = GraphIndex.build(skeleton, rdp_types, infer=infer).elem_types
        if opts.simplify:
            skeleton, self.simplify_report = simplify(skeleton, use_rdp=opts.use_rdp and rdp is not None, rdp=rdp,
                                                      weights=weights, fold_weights=opts.fold_weights)
        self.graph = GraphIndex.build(skeleton, original_types, weights, infer=infer)
        self._lock = threading.Lock()
        # In-memory weights (file-backed ones stay in the file) go to the sessions as OrtValues.
        self._weight_arrays = weights
        self.weights = {n: ort.OrtValue.ortvalue_from_numpy(a) for n, a in weights.items()}
        self.skeleton = skeleton
        self.reference_sizes = self._reference_sizes()
        self._input_sizes = {n: int(np.prod(shape, dtype=np.int64)) * self._itemsize(n)  # graph inputs
                             for n, shape in self._reference_inputs(opts.reference_side).items()}
        self.order = self._execution_order()
        self.segments = self._choose_partition()
        if opts.max_segment_weight_bytes:
            self.segments = self._cut_heavy_segments(self.segments, opts.max_segment_weight_bytes)
        self._stem = self._band_stem()
        self.cut_choice: CutChoice | None = None
        if opts.cost_model and opts.shared_weights is None and not opts.max_segment_weight_bytes:
            self.cut_choice = self._choose_cuts()
        if opts.decide_only:
            raise CutsChosen(self.cut_choice, self._reference_inputs(opts.reference_side))
        self._check_boundary_types()
        self.branch_runners = self._build_branch_runners(weights)
        if self._stem is not None:
            self.branch_runners[self._stem] = self._build_banded_runner(self.segments[self._stem])
        in_memory = set(weights)
        self.runners = self._build_runners(weights)
        # onnxruntime copied the in-memory weights into its sessions; ours are dropped here
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
        self.segment_hook: SegmentHook | None = None
        # specialised runners by (segment, input shapes): signatures that differ only where a segment
        # does not look (e.g. after a global pooling) share its session; a runner lives while a version holds it
        self._specialised: weakref.WeakValueDictionary[tuple, SegmentRunner] = weakref.WeakValueDictionary()
        self.versions = VersionManager(self._build_version, hot_after=opts.hot_after,
                                       budget_bytes=int(opts.version_budget_mb * MB), enabled=opts.versions)
        self._warm_up()
        # building (RDP, inference, 20-50 session creations) leaves freed but still-mapped heap
        release_memory()

    # ------------------------------------------------------------------ build
    def _build_branch_runners(self, weights: Mapping[str, np.ndarray]) -> dict[int, BranchRunner]:
        """If/Loop segments whose branches/body can be planned on their own (else onnxruntime's
        If/Loop runs them); runtime/control_flow.py, runtime/loop.py."""
        kinds: dict[str, type[IfRunner] | type[LoopRunner]] = {"If": IfRunner, "Loop": LoopRunner}
        runners: dict[int, BranchRunner] = {}
        if not self.options.plan_branches:
            return runners
        branch_arena = None
        # a branch or body is planned as it is: its If/Loop segment already chose to be planned
        nested = replace(self.options, versions=False, cost_model=False)
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
                                                         branch_arena, PlannedExecutor)
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
            return cut_segments(self.graph, self.order, self.reference_sizes, self.shape_source.dims,
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

    def _cost_facts(self) -> ModelFacts:
        """The graph at the reference shape as the cost model sees it (cost_model.py)."""
        sizes: dict[str, int | None] = {**self._input_sizes, **self.reference_sizes}
        nodes = []
        for node in self.graph.nodes:
            reads = tuple(n for n in dict.fromkeys(_names_read(node)) if not self.graph.is_weight(n))
            outputs = tuple(o for o in node.output if o)
            moved = sum(sizes.get(t) or 0 for t in reads + outputs)
            macs = 0
            if node.op_type in MAC_OPS and outputs:
                elements = (sizes.get(outputs[0]) or 0) // max(self._itemsize(outputs[0]), 1)
                macs = elements * _macs_per_output(node, self.graph.initializers)
            nodes.append(NodeCost(reads, outputs, macs=macs, moved_bytes=moved))
        return ModelFacts(nodes, sizes, frozenset(self.graph.outputs),
                          mmap_threshold=self.options.mmap_threshold or 128 * 1024, session_bytes=_SESSION_BYTES,
                          weights={n: self._node_weight_bytes(n) for n in range(len(self.graph.nodes))})

    def _choose_cuts(self) -> CutChoice:
        """Merge segments where the cost model says a cut costs more time than its memory is worth,
        or stop at one plain session where no cut set saves memory (``NothingToSave``).

        Why: every segment costs a ``Run`` and every tensor kept inside one is allocated per run,
        and which of the two weighs more is this machine's figure (cost_table.py)."""
        opts = self.options
        facts = self._cost_facts()
        table = opts.cost_table or cost_table(opts.threads or default_threads(), opts.mmap_threshold)
        fixed = {i for i, s in enumerate(self.segments) if s.kind != "ops" or i == self._stem}
        curve = merge_curve(facts, table, [s.nodes for s in self.segments], lambda i: i not in fixed)
        choice = choose(curve, single_session(facts, table), session=single_session(facts, table, lean=True),
                        memory_target=opts.memory_target,
                        fallback_min_saving=opts.fallback_min_saving, sized=facts.sized)
        if opts.curve_segments is not None:  # the timed verdict's point (backends/cut_timing.py)
            timed = next((p for p in curve if p.sessions == opts.curve_segments), None)
            if timed is None:
                log.info("no cut set of %d segments on this curve; the cost model's pick is used",
                         opts.curve_segments)
            else:
                choice = CutChoice(choice.curve, timed, choice.onnxruntime, opts.curve_reason or choice.reason)
        if choice.fallback:
            raise NothingToSave(choice, self._reference_inputs(opts.reference_side))
        if len(choice.chosen.groups) != len(self.segments):
            stem_nodes = None if self._stem is None else self.segments[self._stem].nodes
            kinds = {tuple(s.nodes): s.kind for s in self.segments}
            segments = []
            for i, group in enumerate(choice.chosen.groups):
                segment = describe_segment(self.graph, i, list(group), self.shape_source.dims)
                segments.append(replace(segment, kind=kinds.get(tuple(group), segment.kind)))
            self.segments = segments
            self._stem = None if stem_nodes is None else next(i for i, s in enumerate(segments)
                                                                if s.nodes == stem_nodes)
        return choice

    def _band_stem(self) -> int | None:
        """Merge a bandable stem's two conv segments into one banded segment (plan/banded.py);
        its index, or None. Only where the stem's intermediate is big enough to matter."""
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
        band_bytes: float = (sum(sizes.get(t) or 0 for n in stem for t in self.graph.nodes[n].output)
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
            group: list[int] = []
            held = 0
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
        return min(16, max(self.options.stem_bands, -(-mid_bytes // MB)))

    def _build_banded_runner(self, segment: Segment):
        first, seconds = self.graph.nodes[segment.nodes[0]], [self.graph.nodes[n] for n in segment.nodes[1:]]
        options = lambda: self._session_options(segment)  # noqa: E731 - one fresh SessionOptions per session

        def make_session(node: NodeProto) -> ort.InferenceSession:
            inputs = [node.input[0]]
            single = Segment(segment.index, [], inputs=inputs, outputs=[node.output[0]])
            model = build_nodes_model([node], single, self.graph, self.skeleton)
            return SegmentRunner(single, self.graph, self.skeleton, self.weights, options(), model=model,
                                 shared=self.options.shared_weights).session

        mid_channels = int(self.graph.initializers[first.input[1]].dims[0])
        return BandedRunner(first, seconds, make_session, nchwc_block_size() or 1, mid_channels,
                            bands=self._stem_band_count(segment.nodes[0]),
                            workspace=f"__stem_workspace_{segment.index}")

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
                runners.append(NoSession(seg))
                continue
            runners.append(SegmentRunner(seg, self.graph, self.skeleton, self.weights, self._session_options(seg),
                                         shared=opts.shared_weights))
            for name in [w for w, last in last_user.items() if last == seg.index and w not in keep]:
                self.weights.pop(name, None)
                weights.pop(name, None)
                del last_user[name]
        return runners

    def _session_options(self, segment: Segment | None = None) -> ort.SessionOptions:
        opts = self.options
        light = segment is not None and not any(self.graph.nodes[n].op_type in HEAVY_OPS for n in segment.nodes)
        nchwc = bool(segment is not None and opts.nchwc_max_bytes
                     and self._segment_peak_tensor(segment) <= opts.nchwc_max_bytes)
        fused_sum = segment is not None and has_fused_sum([self.graph.nodes[n] for n in segment.nodes])
        return segment_session_options(opts, light=light, nchwc=nchwc, fused_sum=fused_sum)

    def _segment_peak_tensor(self, segment: Segment) -> int:
        """Largest tensor the segment reads or writes at the reference shape (unknown = huge)."""
        names = segment.inputs + [o for n in segment.nodes for o in self.graph.nodes[n].output if o]
        sizes = [self.reference_sizes.get(n, self._input_sizes.get(n)) for n in names]
        return max((1 << 62 if s is None else s) for s in sizes) if sizes else 0

    def _reference_inputs(self, side: int) -> dict[str, tuple[int, ...]]:
        """Input shapes the plan is sized at: ``options.reference_shapes`` where given (the size a
        node will feed), every other input with its dynamic dims at ``side``."""
        given = self.options.reference_shapes or {}
        return {name: tuple(int(d) for d in given[name]) if name in given else shape
                for name, shape in reference_shapes(self.graph, side).items()}

    def _reference_sizes(self) -> dict[str, int | None]:
        names = [o for node in self.graph.nodes for o in node.output if o]
        for side in (self.options.reference_side, 512, 320, 224):
            try:
                shapes = self.shape_source.shapes(self._reference_inputs(side), names)
            except ValueError:
                continue
            sizes = {n: (None if s is None else int(np.prod(s, dtype=np.int64)) * self._itemsize(n))
                     for n, s in shapes.items()}
            self._limit_shape_fallback(self._reference_inputs(side), sizes)
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
            order = order_for_executor(self.graph, self.reference_sizes) or order
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
            self.plan_for(self._reference_inputs(self.options.reference_side))
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
            out_shapes: list[tuple[int, ...]] = []
            for name in runner.outputs:
                out = slots.get(name)
                if out is None or out.shape is None:
                    raise ValueError(f"the banded stem's outputs {runner.outputs} have no known shape")
                out_shapes.append(out.shape)
            size = runner.workspace_bytes(tuple(feeds_shapes[runner.image]), out_shapes)
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
                    max(align(int(np.prod(s.placed_shape(), dtype=np.int64)) * s.dtype.itemsize), 1)) for s in planned]
        offsets, height = plan_offsets(buffers) if buffers else ([], 0)
        for slot, offset in zip(planned, offsets):
            slot.offset = int(offset)
        for name, root in roots.items():
            slots[name].offset, slots[name].alias_of = slots[root].offset, root
        plan = Plan(signature, slots, int(height), int(lower_bound(buffers)) if buffers else 0,
                    time.perf_counter() - start)
        self.plans.put(signature, plan)
        return plan

    def _banded_runners(self) -> list[tuple[int, BandedRunner]]:
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

    def _build_version(self, signature: Hashable) -> Version | None:
        """Background thread: specialised runners for the segments whose input shapes this plan knows."""
        start = time.perf_counter()
        plan = self.plans.peek(signature)  # no LRU touch from the worker
        if plan is None:
            return None
        feeds = dict(plan.signature)  # the key the plan is cached under
        budget = self.versions.budget_bytes
        # cheapest first: segments without weights cost only their session
        order = sorted(range(len(self.segments)), key=lambda i: self._segment_weight_bytes[i])
        runners: dict[int, object] = {}
        cost = 0
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
                key = (i, tuple(sorted(shapes.items())))
                shared = self._specialised.get(key)
                if shared is not None:  # another signature's version has this segment at these shapes
                    runners[i] = shared
                    continue
                extra = self._segment_weight_bytes[i] + _SESSION_BYTES
                if cost + extra > budget:
                    continue
                options = self._session_options(seg)
                options.enable_mem_pattern = True  # static shapes: onnxruntime can pre-plan the segment
                runners[i] = self._specialised[key] = SegmentRunner(seg, self.graph, self.skeleton, self.weights,
                                                                    options, shapes,
                                                                    shared=self.options.shared_weights)
                cost += extra
        if not runners:
            return None
        return Version(signature, runners, cost, time.perf_counter() - start)

    def _bind_plan(self, plan: Plan, version: Version | None = None) -> None:
        """Pre-bind every arena tensor of ``plan`` (redone when the arena moves or a version lands)."""
        bind_plan(plan, self.runners, self.arena, version)

    # ------------------------------------------------------------------ run
    def run(self, feeds: Mapping[str, np.ndarray],
            out: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """Run on ``feeds``; ``out`` optionally gives arrays to write graph outputs into."""
        with self._lock:
            return self._run(feeds, out or {})

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
            run_segments(plan, self.arena, self.branch_runners, feeds, out, results, dynamic, graph_outputs)
        else:
            hook.frame_start()
            try:
                run_segments(plan, self.arena, self.branch_runners, feeds, out, results, dynamic, graph_outputs,
                             hook)
            except BaseException:  # any exit, interrupts included: the hook's frame ends; re-raised
                hook.abort()
                raise
            hook.frame_end()
        return collect_outputs(plan, self.arena, self.graph, feeds, results, dynamic)

    #: The (start, end, nbytes) buffers a plan placed (for reports and planner comparisons).
    plan_buffers = staticmethod(plan_buffers)

    def arena_tensor(self, name: str) -> np.ndarray | None:
        """View of a boundary tensor in the arena for the last plan (tests check zero-copy with it)."""
        plan = self.last_plan
        slot = None if plan is None else plan.slots.get(name)
        if slot is None or slot.offset is None:
            return None
        return slot.view(self.arena)

    def fit_arena(self, shapes: Mapping[str, tuple[int, ...]]) -> bool:
        """Give back the arena when it is larger than the plan for ``shapes`` needs (the next run
        allocates that plan's height): the arena is grow-only, and an engine under a memory budget
        would otherwise hold a larger input size's activations while it runs a smaller one. True
        when the arena was released."""
        needed = self.arena_bytes_at(shapes)
        if needed is None or align(max(needed, 1)) >= self.arena.capacity or not self._owns_arena:
            return False
        self.arena.release()
        return True

    def arena_bytes_at(self, shapes: Mapping[str, tuple[int, ...]]) -> int | None:
        """The arena height of the plan for ``shapes`` (None where these shapes cannot be planned)."""
        try:
            return int(self.plan_for(shapes).height)
        except (ValueError, KeyError):
            return None

    def executor_stats(self) -> ExecutorStats:
        """What Engine.engine_stats() reports for the planned backend."""
        plan = self.last_plan
        return ExecutorStats(arena_bytes=self.arena.capacity, details={
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
                "cuts": None if self.cut_choice is None else self.cut_choice.describe(),
            },
            "kernel_versions": self.versions.stats(),
            "loops": [vars(r.stats) for r in self.branch_runners.values() if hasattr(r, "stats")],
        })

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


