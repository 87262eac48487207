"""Cut an ordered graph into sub-graphs (segments) that run as separate onnxruntime sessions.

Why segments: a tensor that crosses a segment boundary is allocated by *our* planner in one
arena (offsets per shape signature, no fragmentation, no arena growth by powers of two), and
the order between segments is ours, not onnxruntime's. Inside a segment onnxruntime keeps
its own fusions and layouts. The granularity is a trade: the planner keeps tensors inside a
segment when they are small (shape arithmetic) or when onnxruntime fuses them away anyway
(Conv→Relu), and cuts everywhere else, always at nac-producing nodes and control flow
(SoD² §4.3: those disable static planning of what follows).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from dynnet_ros.engine.plan.graph import CONTROL_FLOW_OPS, GraphIndex, node_inputs, node_name

# Producer -> consumer pairs onnxruntime fuses on CPU (the intermediate never materialises).
FUSABLE = {
    "FusedConv": {"BatchNormalization"},
    "Conv": {"Relu", "Clip", "Sigmoid", "Tanh", "LeakyRelu", "HardSigmoid", "BatchNormalization"},
    "ConvTranspose": {"BatchNormalization"},  # folded; an activation after it stays a kernel of its own
    # only where the BatchNormalization is folded into a Conv before it (_fuses): onnxruntime has no
    # BatchNormalization+activation kernel, so elsewhere the normalised tensor materialises
    "BatchNormalization": {"Relu", "Clip", "Sigmoid", "Tanh", "LeakyRelu", "HardSigmoid"},
    "Gemm": {"Relu", "Sigmoid", "Tanh"},
    "MatMul": {"Add"},
}
# Ops whose output sizes only execution reveals (RDP category EDO).
DATA_DEPENDENT_OPS = {"NonZero", "NonMaxSuppression", "Unique", "TopK", "Compress"}


@dataclass
class Segment:
    """One sub-graph: nodes (indices into the model graph) in the order they must run."""

    index: int
    nodes: list[int]
    inputs: list[str] = field(default_factory=list)     # activations from outside (graph inputs or boundaries)
    outputs: list[str] = field(default_factory=list)    # tensors used after this segment or graph outputs
    label: str = "all-known"                            # all-known | mixed-symbolic | nac
    kind: str = "ops"                                   # ops | control | dynamic

    def describe(self, graph: GraphIndex) -> dict:
        return {"index": self.index, "label": self.label, "kind": self.kind,
                "nodes": [node_name(graph.nodes[i], i) for i in self.nodes],
                "inputs": self.inputs, "outputs": self.outputs}


def sink_small_nodes(graph: GraphIndex, order: Sequence[int], is_small: Callable[[str], bool]) -> list[int]:
    """Move nodes whose outputs are all small (shape arithmetic) to just before their first consumer.

    Still a topological order (a node only moves later, never past a consumer), and it keeps
    shape chains next to the op they feed so they share its segment.
    """
    order = list(order)
    position = {n: i for i, n in enumerate(order)}
    movable = [n for n in order if graph.nodes[n].op_type not in CONTROL_FLOW_OPS
               and all(o and is_small(o) for o in graph.nodes[n].output)
               and not any(o in graph.outputs for o in graph.nodes[n].output)]
    # Process consumers-last so chains (Shape->Gather->Concat) sink together.
    for n in sorted(movable, key=lambda k: -position[k]):
        consumers = [c for o in graph.nodes[n].output for c in graph.consumers.get(o, [])]
        if not consumers:
            continue
        target = min(order.index(c) for c in consumers)
        current = order.index(n)
        if target - 1 > current:
            order.pop(current)
            order.insert(target - 1, n)
    return order


def cut_segments(graph: GraphIndex, order: Sequence[int], sizes: Mapping[str, int | None],
                 dims: Callable[[str], list | None], *, small_bytes: int = 64 * 1024,
                 granularity: str = "auto", category: Callable | None = None) -> list[Segment]:
    """Split ``order`` into contiguous segments.

    ``sizes``: bytes of each tensor at the planner's reference shape (None = not known there).
    ``granularity``: "auto" (cut unless the tensors that would become internal are small or
    fused away), "fine" (one segment per fusion group, even around small tensors), "coarse"
    (cut only at nac producers and control flow). ``category(node)``: RDP's operator category;
    EDO nodes (execution determines output) are cut like the known data-dependent ops.
    """
    if granularity not in ("auto", "fine", "coarse"):
        raise ValueError(f"granularity must be auto, fine or coarse, got {granularity!r}")
    nodes = graph.nodes
    segments: list[list[int]] = []
    current: list[int] = []

    def forced_cut(node_index: int) -> bool:
        node = nodes[node_index]
        if node.op_type in CONTROL_FLOW_OPS or node.op_type in DATA_DEPENDENT_OPS:
            return True
        return category is not None and category(node) == "EDO"

    for n in order:
        if not current:
            current.append(n)
            continue
        prev = current[-1]
        cut = forced_cut(n) or forced_cut(prev)
        if not cut and granularity != "coarse":
            cut = _should_cut(graph, current, n, sizes, small_bytes, granularity)
        if cut:
            segments.append(current)
            current = [n]
        else:
            current.append(n)
    if current:
        segments.append(current)
    return [describe_segment(graph, i, seg, dims) for i, seg in enumerate(segments)]


def _should_cut(graph: GraphIndex, current: list[int], n: int, sizes, small_bytes: int,
                granularity: str) -> bool:
    """Cut before ``n`` when joining would hide a big tensor from the arena."""
    prev = current[-1]
    if _fuses(graph, prev, n):
        return False
    produced = {o for m in current for o in graph.nodes[m].output if o}
    crossing = [t for t in node_inputs(graph.nodes[n]) if t in produced]
    small_current = all(_is_small_node(graph, m, sizes, small_bytes) for m in current)
    if not crossing:
        # independent work: keep shape arithmetic next to the op it feeds, cut otherwise
        return not (small_current or _is_small_node(graph, n, sizes, small_bytes))
    if granularity == "fine":
        return any(not _is_small(sizes, t, small_bytes) for t in crossing)
    members = set(current) | {n}
    hidden = [t for t in crossing if t not in graph.outputs
              and all(c in members for c in graph.consumers.get(t, []))]
    return any(not _is_small(sizes, t, small_bytes) for t in hidden)


def _fuses(graph: GraphIndex, producer: int, consumer: int) -> bool:
    p, c = graph.nodes[producer], graph.nodes[consumer]
    if c.op_type not in FUSABLE.get(p.op_type, ()):
        return False
    out = p.output[0]
    if not (graph.consumers.get(out, []) == [consumer] and out not in graph.outputs and c.input[0] == out):
        return False
    if p.op_type == "BatchNormalization":
        source = graph.producer.get(p.input[0])
        return source is not None and _fuses(graph, source, producer) and graph.nodes[source].op_type == "Conv"
    return True


def _is_small(sizes: Mapping[str, int | None], name: str, limit: int) -> bool:
    size = sizes.get(name)
    return size is not None and size <= limit


def _is_small_node(graph: GraphIndex, n: int, sizes, limit: int) -> bool:
    return all(_is_small(sizes, o, limit) for o in graph.nodes[n].output if o)


def describe_segment(graph: GraphIndex, index: int, members: list[int], dims) -> Segment:
    """A Segment for ``members`` (in run order): inputs, outputs, label and kind from the graph."""
    inside = set(members)
    produced = [o for m in members for o in graph.nodes[m].output if o]
    produced_set = set(produced)
    inputs: list[str] = []
    for m in members:
        for name in node_inputs(graph.nodes[m]):
            if name not in produced_set and not graph.is_weight(name) and name not in inputs:
                inputs.append(name)
    outputs = [o for o in produced if o in graph.outputs
               or any(c not in inside for c in graph.consumers.get(o, []))]
    ops = {graph.nodes[m].op_type for m in members}
    kind = "control" if ops & CONTROL_FLOW_OPS else ("dynamic" if ops & DATA_DEPENDENT_OPS else "ops")
    label = "all-known"
    for name in produced:
        d = dims(name)
        if d is None or any(x is None for x in d):
            label = "nac"
            break
        if any(not isinstance(x, (int, np.integer)) for x in d):
            label = "mixed-symbolic"
    return Segment(index, list(members), inputs, outputs, label, kind)
