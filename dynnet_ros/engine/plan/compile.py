"""Planning a model once: analyse, simplify, order, cut into segments, band the stem, price the cuts.

Why a function of its own: everything the planned engine decides about a model before any
onnxruntime session exists is a pure function of the model and the ``PlannerOptions``. The
executor (``engine/runtime``) only runs a ``Plan``; the cut verdict's child process
(``backends/cpu_planned.decide``) compiles one and reads its cut choice without building
anything; and a plan that says "one plain session" (``Plan.one_session``) is a value the caller
looks at, not an exception it must catch.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from dynnet_ros.bytesize import MB
from dynnet_ros.engine.modelio.onnx_proto import ModelProto, NodeProto, TensorProto
from dynnet_ros.engine.plan.arena import align
from dynnet_ros.engine.plan.banded import find_stem
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
from dynnet_ros.engine.plan.memory_plan import lower_bound
from dynnet_ros.engine.plan.options import PlannerOptions, default_threads
from dynnet_ros.engine.plan.ort_types import value_types
from dynnet_ros.engine.plan.segmentation import Segment, cut_segments, describe_segment, sink_small_nodes
from dynnet_ros.engine.plan.shapes import ShapeSource, make_shape_source
from dynnet_ros.engine.plan.simplify import SimplifyReport, simplify

log = logging.getLogger(__name__)

#: what one more onnxruntime session costs beyond its weights (docs/engine.md)
SESSION_BYTES = 256 * 1024

Shape = tuple[int, ...]


@dataclass(frozen=True)
class Plan:
    """What the planner decided for one model under one set of options; an executor runs it.

    Equal inputs give equal plans (the fields compared). ``weights`` (the in-memory weights,
    simplification's folded arrays included) are handed over to the one executor built from
    the plan (``take_weights``), which drops each as soon as onnxruntime holds its copy; that
    executor also owns ``graph`` from then on.
    """

    options: PlannerOptions
    skeleton: ModelProto                      # the simplified graph, weights stripped
    original_nodes: int                            # nodes of the model as given
    reference_inputs: dict[str, Shape]             # input shapes the plan is weighed at
    reference_sizes: dict[str, int | None]         # bytes of every node output at those shapes
    input_sizes: dict[str, int]                    # bytes of every graph input at those shapes
    order: tuple[int, ...]                         # execution order (node indices)
    segments: tuple[Segment, ...]
    granularity: str                               # the cut granularity taken (auto | fine | coarse)
    stem: int | None                               # index of the banded stem segment, if any
    cut_choice: CutChoice | None                   # the cost model's choice (None: it did not run)
    graph: GraphIndex = field(compare=False, repr=False)
    shape_source: ShapeSource = field(compare=False, repr=False)
    simplify_report: SimplifyReport | None = field(compare=False, repr=False, default=None)
    weights: dict[str, np.ndarray] = field(compare=False, repr=False, default_factory=dict)
    _handed_over: list[bool] = field(compare=False, repr=False, default_factory=list)

    @property
    def one_session(self) -> bool:
        """The cost model found no cut set that saves memory: run one plain onnxruntime session."""
        return self.cut_choice is not None and self.cut_choice.fallback

    def take_weights(self) -> dict[str, np.ndarray]:
        """The in-memory weights, for the one executor built from this plan (ValueError on a second)."""
        if self._handed_over:
            raise ValueError("this Plan's weights went to the executor built from it; compile the model again")
        self._handed_over.append(True)
        return self.weights

    def itemsize(self, name: str) -> int:
        return itemsize(self.graph, name)

    def node_weight_bytes(self, n: int) -> int:
        return node_weight_bytes(self.graph, n)

    def weight_bytes_of(self, segment: Segment) -> int:
        return sum(self.node_weight_bytes(n) for n in segment.nodes)

    def stem_band_count(self, first_node: int) -> int:
        return stem_band_count(self.graph, self.reference_sizes, self.options.stem_bands, first_node)

    def reference_lower_bound(self, segments: list[Segment] | tuple[Segment, ...]) -> int:
        return reference_lower_bound(self.graph, self.reference_sizes, segments)


def compile_plan(model: ModelProto, options: PlannerOptions | None = None) -> Plan:
    """The plan of ``model`` under ``options``: RDP analysis, simplification, execution order,
    segments, banded stem and the cost model's cut choice. Builds no onnxruntime session for
    running (onnxruntime may type tensors nothing else types). ValueError where the graph cannot
    be cut (a boundary tensor of unknown element type)."""
    return _Planner(model, options or PlannerOptions()).plan()


def names_read(node: NodeProto) -> list[str]:
    """Inputs of ``node`` and every name its subgraphs read (an If's branch weights)."""
    names = list(node_inputs(node))
    for graph in subgraphs(node):
        names += [t.name for t in graph.initializer]
        for inner in graph.node:
            names += names_read(inner)
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


def itemsize(graph: GraphIndex, name: str) -> int:
    dtype = graph.dtypes.get(name)
    return dtype.itemsize if dtype is not None else 4


def node_weight_bytes(graph: GraphIndex, n: int) -> int:
    total = 0
    for name in node_inputs(graph.nodes[n]):
        tensor = graph.initializers.get(name)
        if tensor is not None:
            total += int(np.prod(tensor.dims, dtype=np.int64)) * itemsize(graph, name)
    return total


def stem_band_count(graph: GraphIndex, reference_sizes: Mapping[str, int | None], stem_bands: int,
                    first_node: int) -> int:
    """Bands for the stem: a band of its intermediate ~1 MB at the reference shape (4..16)."""
    mid_bytes = reference_sizes.get(graph.nodes[first_node].output[0]) or 0
    return min(16, max(stem_bands, -(-mid_bytes // MB)))


def reference_lower_bound(graph: GraphIndex, reference_sizes: Mapping[str, int | None],
                          segments: list[Segment] | tuple[Segment, ...]) -> int:
    """Max bytes of boundary tensors live at once at the reference shape (unknown sizes: 0)."""
    last: dict[str, int] = {}
    for seg in segments:
        for name in seg.inputs:
            last[name] = max(last.get(name, -1), seg.index)
    buffers = []
    for seg in segments:
        for name in seg.outputs:
            size = reference_sizes.get(name)
            if size and name not in graph.outputs:
                buffers.append((seg.index, max(last.get(name, seg.index), seg.index) + 1, align(size)))
    return int(lower_bound(buffers)) if buffers else 0


class _Planner:
    """The working state of one ``compile_plan`` call (segments are replaced step by step)."""

    def __init__(self, model: ModelProto, options: PlannerOptions) -> None:
        self.options = opts = options
        self.original_nodes = len(model.graph.node)
        self.simplify_report: SimplifyReport | None = None
        # Weights leave the proto once (one copy); every pass below works on the skeleton.
        skeleton, weights = split_weights(model)
        # Analyse the model as given: simplification keeps tensor names, so the analysis (and
        # the element types) of the original describe every tensor of the simplified graph.
        self.shape_source: ShapeSource = make_shape_source(skeleton, use_rdp=opts.use_rdp)
        rdp = self.shape_source.analysis
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
        self.weights = weights
        self.skeleton = skeleton
        self.reference_sizes = self._reference_sizes()
        self._input_sizes = {n: int(np.prod(shape, dtype=np.int64)) * itemsize(self.graph, n)  # graph inputs
                             for n, shape in self._reference_inputs(opts.reference_side).items()}
        self.granularity = opts.granularity

    def plan(self) -> Plan:
        opts = self.options
        self.order = self._execution_order()
        self.segments = self._choose_partition()
        if opts.max_segment_weight_bytes:
            self.segments = self._cut_heavy_segments(self.segments, opts.max_segment_weight_bytes)
        self._stem = self._band_stem()
        cut_choice: CutChoice | None = None
        if opts.cost_model and opts.shared_weights is None and not opts.max_segment_weight_bytes:
            cut_choice = self._choose_cuts()
        if cut_choice is None or not cut_choice.fallback:
            self._check_boundary_types()
        return Plan(options=opts, skeleton=self.skeleton, original_nodes=self.original_nodes,
                    reference_inputs=self._reference_inputs(opts.reference_side),
                    reference_sizes=self.reference_sizes, input_sizes=self._input_sizes, order=tuple(self.order),
                    segments=tuple(self.segments), granularity=self.granularity, stem=self._stem,
                    cut_choice=cut_choice, graph=self.graph, shape_source=self.shape_source,
                    simplify_report=self.simplify_report, weights=self.weights)

    def _reference_lower_bound(self, segments: list[Segment]) -> int:
        return reference_lower_bound(self.graph, self.reference_sizes, segments)

    def _weight_bytes_of(self, segment: Segment) -> int:
        return sum(node_weight_bytes(self.graph, n) for n in segment.nodes)

    def _choose_partition(self) -> list[Segment]:
        """Segments for ``options.granularity``; "choose" takes the cheaper of the "auto" and
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
            costs[granularity] = (self._reference_lower_bound(segments) + SESSION_BYTES * len(segments), segments)
        self.granularity = min(costs, key=lambda g: costs[g][0])
        return costs[self.granularity][1]

    def _cost_facts(self) -> ModelFacts:
        """The graph at the reference shape as the cost model sees it (cost_model.py)."""
        sizes: dict[str, int | None] = {**self._input_sizes, **self.reference_sizes}
        nodes = []
        for node in self.graph.nodes:
            reads = tuple(n for n in dict.fromkeys(names_read(node)) if not self.graph.is_weight(n))
            outputs = tuple(o for o in node.output if o)
            moved = sum(sizes.get(t) or 0 for t in reads + outputs)
            macs = 0
            if node.op_type in MAC_OPS and outputs:
                elements = (sizes.get(outputs[0]) or 0) // max(itemsize(self.graph, outputs[0]), 1)
                macs = elements * _macs_per_output(node, self.graph.initializers)
            nodes.append(NodeCost(reads, outputs, macs=macs, moved_bytes=moved))
        return ModelFacts(nodes, sizes, frozenset(self.graph.outputs),
                          mmap_threshold=self.options.mmap_threshold or 128 * 1024, session_bytes=SESSION_BYTES,
                          weights={n: node_weight_bytes(self.graph, n) for n in range(len(self.graph.nodes))})

    def _choose_cuts(self) -> CutChoice:
        """Merge segments where the cost model says a cut costs more time than its memory is worth;
        a choice whose ``fallback`` is set where no cut set saves memory (one plain session).

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
            return choice
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
        band_bytes /= stem_band_count(self.graph, self.reference_sizes, self.options.stem_bands, first_node)
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
                weight = node_weight_bytes(self.graph, n)
                if group and weight and held + weight > cap:
                    groups.append(group)
                    group, held = [], 0
                group.append(n)
                held += weight
            groups.append(group)
        if len(groups) == len(segments):
            return segments
        return [describe_segment(self.graph, i, g, self.shape_source.dims) for i, g in enumerate(groups)]

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
            sizes = {n: (None if s is None else int(np.prod(s, dtype=np.int64)) * itemsize(self.graph, n))
                     for n, s in shapes.items()}
            self._limit_shape_fallback(self._reference_inputs(side), sizes)
            return sizes
        return {n: None for n in names}

    def _limit_shape_fallback(self, shapes: Mapping[str, tuple[int, ...]], sizes: Mapping[str, int | None]) -> None:
        """Keep the shape source's slower fallback only for big tensors RDP leaves unknown."""
        self.shape_source.limit_fallback(shapes, sizes, self.options.small_bytes)

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
