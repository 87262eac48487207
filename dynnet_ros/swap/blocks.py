"""Split a model into sequential blocks at cut points crossed by few, small tensors.

SwapNet swaps *blocks* (consecutive layers).  We split once, finely, into *atoms* — the
smallest swappable unit, each with its own weightless onnxruntime session — at cut points where
the activations crossing the cut are smallest while the weight bytes between cuts stay balanced.
A *block* is then a run of consecutive atoms; the scheduler groups atoms into blocks per memory
budget, so a budget change regroups without rebuilding any session (paper §6: partition LUT).

Per atom: weight bytes ``s``, parameter depth ``d`` (number of weight tensors bound by
reference), and — as functions of the input size — FLOPs ``f``, peak activation bytes and the
bytes crossing its entry cut.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper

from dynnet_ros.swap.graphinfo import (GraphInfo, external_stub, fixed_input_model, infer_shapes, node_flops,
                                       node_reads, shape_bytes, tensor_nbytes)

#: Symbolic input dims with these names get these sizes for reference-shape estimates.
DEFAULT_SYMBOLS = {"H": 480, "W": 640, "height": 480, "width": 640}
DEFAULT_MAX_ATOMS = 16


@dataclass(frozen=True)
class Atom:
    """Nodes ``[start, end)`` of the top-level graph, run as one session."""

    index: int
    start: int
    end: int
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    weights: tuple[str, ...]
    weight_bytes: int
    params: int

    @property
    def depth(self) -> int:
        """Parameter depth d_i: how many tensors are bound by reference at assembly."""
        return len(self.weights)


@dataclass(frozen=True)
class AtomCosts:
    """Per-atom costs at one concrete input size."""

    flops: tuple[int, ...]
    act_bytes: tuple[int, ...]      # peak live activation bytes while the atom runs
    cut_bytes: tuple[int, ...]       # activation bytes crossing the atom's entry cut


def reference_shapes(model: onnx.ModelProto, symbols: dict[str, int] | None = None,
                     input_shapes: dict[str, list[int]] | None = None) -> dict[str, tuple[int, ...]]:
    """Concrete shape per graph input: explicit shapes win, then named symbols, then defaults."""
    bound = {**DEFAULT_SYMBOLS, **(symbols or {})}
    inits = {init.name for init in model.graph.initializer}
    shapes: dict[str, tuple[int, ...]] = {}
    for value in model.graph.input:
        if value.name in inits:
            continue
        if input_shapes and value.name in input_shapes:
            shapes[value.name] = tuple(int(d) for d in input_shapes[value.name])
            continue
        dims = []
        for axis, dim in enumerate(value.type.tensor_type.shape.dim):
            if dim.HasField("dim_value"):
                dims.append(int(dim.dim_value))
            elif dim.dim_param in bound:
                dims.append(int(bound[dim.dim_param]))
            else:
                dims.append(1 if axis < 2 else 224)
        shapes[value.name] = tuple(dims)
    return shapes


def symbols_from_feeds(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]]) -> dict[str, int]:
    """Bind each named input dim to its runtime size (used as a cache key for costs)."""
    bound: dict[str, int] = {}
    for value in model.graph.input:
        if value.name not in shapes:
            continue
        for dim, size in zip(value.type.tensor_type.shape.dim, shapes[value.name]):
            if dim.dim_param:
                bound[dim.dim_param] = int(size)
    return bound


def _weights_until(info: GraphInfo) -> list[int]:
    """cw[p]: bytes of distinct weights first read by nodes before position p (p = 0..N)."""
    seen: set[str] = set()
    running = 0
    cumulative = []
    for index in range(len(info.nodes)):
        cumulative.append(running)
        for name in info.node_weights(index):
            if name not in seen:
                seen.add(name)
                running += tensor_nbytes(info.initializers[name])
    cumulative.append(running)
    return cumulative


def choose_cuts(info: GraphInfo, table: dict, max_atoms: int = DEFAULT_MAX_ATOMS) -> list[int]:
    """Cut positions (node indices where a new atom starts), balancing weight bytes per atom and
    preferring the cheapest crossing within a window around each balanced target."""
    count = len(info.nodes)
    weights = _weights_until(info)
    total = weights[-1]
    weighted_nodes = sum(1 for i in range(count) if info.node_weights(i))
    atoms = max(1, min(max_atoms, weighted_nodes, count))
    if atoms == 1 or total == 0:
        return []
    cost: dict[int, tuple[int, bool]] = {}
    for position in range(1, count):
        crossing = info.crossing(position)
        sizes = [shape_bytes(table.get(name)) for name in crossing]
        cost[position] = (sum(b for b, _ in sizes), all(exact for _, exact in sizes))
    cuts: list[int] = []
    half_window = total / atoms / 2
    for j in range(1, atoms):
        target = total * j / atoms
        lo = cuts[-1] + 1 if cuts else 1
        window = [p for p in range(lo, count) if abs(weights[p] - target) <= half_window]
        window = [p for p in window if cost[p][1]] or window
        if not window:
            continue
        best = min(window, key=lambda p: (cost[p][0], abs(weights[p] - target)))
        # A cut that leaves no weights on one side only adds session overhead.
        if weights[best] == (weights[cuts[-1]] if cuts else 0) or weights[best] == total:
            continue
        cuts.append(best)
    return cuts


def split(model: onnx.ModelProto, *, max_atoms: int = DEFAULT_MAX_ATOMS,
          input_shapes: dict[str, tuple[int, ...]] | None = None) -> list[Atom]:
    """Atoms of ``model`` (top-level nodes must be topologically sorted, as ONNX requires)."""
    info = GraphInfo(model)
    if not info.nodes:
        raise ValueError("model has no nodes to split")
    shapes = input_shapes or reference_shapes(model)
    table = infer_shapes(fixed_input_model(model, shapes))
    cuts = choose_cuts(info, table, max_atoms)
    bounds = [0] + cuts + [len(info.nodes)]
    atoms = []
    for index, (start, end) in enumerate(zip(bounds[:-1], bounds[1:])):
        produced: set[str] = set()
        reads: list[str] = []
        weights: list[str] = []
        for node_index in range(start, end):
            for name in info.reads[node_index]:
                if name in info.initializers:
                    if info.is_weight(name) and name not in weights:
                        weights.append(name)
                elif name not in produced and name not in reads:
                    reads.append(name)
            produced.update(o for o in info.nodes[node_index].output if o)
        outputs = [name for name in sorted(produced, key=lambda n: (info.producer[n], n))
                   if info.last_use.get(name, -1) >= end]
        atoms.append(Atom(
            index=index, start=start, end=end, inputs=tuple(reads), outputs=tuple(outputs),
            weights=tuple(weights),
            weight_bytes=sum(tensor_nbytes(info.initializers[w]) for w in weights),
            params=sum(int(np.prod(info.initializers[w].dims)) for w in weights)))
    return atoms


def atom_costs(model: onnx.ModelProto, atoms: list[Atom], shapes: dict[str, tuple[int, ...]]) -> AtomCosts:
    """FLOPs, peak activation bytes and entry-cut bytes of every atom at one input size."""
    info = GraphInfo(model)
    table = infer_shapes(fixed_input_model(model, shapes))
    nbytes = {name: shape_bytes(table.get(name))[0] for name in info.producer}
    flops, acts, cuts = [], [], []
    for atom in atoms:
        entry = info.crossing(atom.start) if atom.start > 0 else list(info.graph_inputs)
        entry_bytes = sum(nbytes.get(n, 0) for n in entry)
        peak_inner = 0
        for position in range(atom.start, atom.end):
            live = sum(nbytes.get(name, 0) for name, prod in info.producer.items()
                       if atom.start <= prod <= position and info.last_use.get(name, -1) >= position)
            peak_inner = max(peak_inner, live)
        flops.append(sum(node_flops(info.nodes[i], table) for i in range(atom.start, atom.end)))
        acts.append(entry_bytes + peak_inner)
        cuts.append(entry_bytes)
    return AtomCosts(tuple(flops), tuple(acts), tuple(cuts))


def symbolic_types(model: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    """TypeProto per tensor from symbolic shape inference (dims stay symbolic or unknown)."""
    inferred = onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False)
    graph = inferred.graph
    return {value.name: value.type for value in list(graph.input) + list(graph.value_info) + list(graph.output)}


def atom_skeleton(model: onnx.ModelProto, atom: Atom, types: dict[str, onnx.TypeProto],
                  weight_offsets: dict[str, int] | None, location: str) -> onnx.ModelProto:
    """A weightless model of one atom: its nodes, small constants inline, weights as stubs.

    With ``weight_offsets=None`` the weights are included (the input of per-atom optimisation).
    """
    info_inits = {init.name: init for init in model.graph.initializer}
    nodes = list(model.graph.node)[atom.start:atom.end]
    needed = set()
    for node in nodes:
        needed.update(node_reads(node))

    def value(name: str) -> onnx.ValueInfoProto:
        info = onnx.ValueInfoProto()
        info.name = name
        if name in types:
            info.type.CopyFrom(types[name])
        return info

    initializers = []
    for name in sorted(needed & set(info_inits)):
        if name in atom.weights and weight_offsets is not None:
            initializers.append(external_stub(info_inits[name], location, weight_offsets[name]))
        else:
            initializers.append(info_inits[name])
    graph = helper.make_graph(nodes, f"atom_{atom.index}", [value(n) for n in atom.inputs],
                              [value(n) for n in atom.outputs], initializer=initializers)
    skeleton = helper.make_model(graph, opset_imports=list(model.opset_import))
    skeleton.ir_version = model.ir_version
    return skeleton


@dataclass
class Block:
    """Consecutive atoms swapped in and out together."""

    atoms: tuple[int, ...]
    weight_bytes: int
    depth: int
    pinned: bool = False

    @property
    def first(self) -> int:
        return self.atoms[0]


@dataclass
class Partition:
    """A grouping of the atoms into blocks, with what the scheduler predicted for it."""

    bounds: tuple[int, ...]                # atom index where each block starts, plus the end
    pinned: tuple[bool, ...]
    predicted_ms: float = math.nan
    predicted_peak_bytes: int = 0
    resident_limit: int = 2
    blocks: list[Block] = field(default_factory=list)
    #: while the last block runs, prefetch the next frame's first swapped block (it then stays
    #: resident between frames; the scheduler counts it at the last block's peak)
    wrap: bool = False
    #: streamed prefetch: per block, the most bytes of later swapped blocks (in order, the
    #: wrapped block last) that may be resident while it runs; None = whole-block prefetch
    ahead: tuple[int, ...] | None = None

    def build(self, atoms: list[Atom]) -> "Partition":
        self.blocks = []
        for k, (a, b) in enumerate(zip(self.bounds[:-1], self.bounds[1:])):
            members = atoms[a:b]
            self.blocks.append(Block(tuple(range(a, b)), sum(m.weight_bytes for m in members),
                                     sum(m.depth for m in members), self.pinned[k]))
        return self

    @property
    def count(self) -> int:
        return len(self.bounds) - 1
