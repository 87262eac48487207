"""Facts about a model graph that block partitioning needs: producers, consumers, weights, shapes.

Why a module of its own: the block splitter, the cost estimates and the store all ask the same
questions ("which tensors cross position p?", "how big is tensor t at this input size?") and
must agree on the answers, including for names that control-flow sub-graphs capture from the
outer scope.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, shape_inference

from dynnet_ros.engine.model_io import pin_input_dims

#: Initializers at or below this size stay inside the skeleton (shape constants, scales, small
#: biases): swapping them would cost more in bookkeeping than the bytes are worth, and some of
#: them (Reshape targets, Resize scales) must be visible to onnxruntime's graph optimiser.
INLINE_LIMIT_BYTES = 4096


def dtype_of(elem_type: int) -> np.dtype:
    return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))


def tensor_nbytes(init: TensorProto) -> int:
    count = int(np.prod(init.dims)) if len(init.dims) else 1
    return count * dtype_of(init.data_type).itemsize


def subgraph_outer_refs(node: onnx.NodeProto) -> set[str]:
    """Names a control-flow node's sub-graphs read from the enclosing scope."""
    refs: set[str] = set()
    for attr in node.attribute:
        graphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
        for graph in graphs:
            defined = {i.name for i in graph.input} | {i.name for i in graph.initializer}
            for inner in graph.node:
                defined.update(o for o in inner.output if o)
            for inner in graph.node:
                for name in list(inner.input) + sorted(subgraph_outer_refs(inner)):
                    if name and name not in defined:
                        refs.add(name)
    return refs


def node_reads(node: onnx.NodeProto) -> list[str]:
    """Every top-level name a node needs: its inputs plus what its sub-graphs capture."""
    names = [n for n in node.input if n]
    extra = sorted(subgraph_outer_refs(node) - set(names))
    return names + extra


@dataclass
class GraphInfo:
    """Producer/consumer index of a model's top-level graph, in its (topological) node order."""

    model: onnx.ModelProto
    nodes: list[onnx.NodeProto] = field(init=False)
    initializers: dict[str, TensorProto] = field(init=False)
    graph_inputs: list[str] = field(init=False)
    graph_outputs: list[str] = field(init=False)
    producer: dict[str, int] = field(init=False)       # tensor -> node index (-1 = graph input)
    last_use: dict[str, int] = field(init=False)       # tensor -> last reading node (N = graph output)
    reads: list[list[str]] = field(init=False)

    def __post_init__(self) -> None:
        graph = self.model.graph
        self.nodes = list(graph.node)
        self.initializers = {init.name: init for init in graph.initializer}
        self.graph_inputs = [i.name for i in graph.input if i.name not in self.initializers]
        self.graph_outputs = [o.name for o in graph.output]
        self.producer = {name: -1 for name in self.graph_inputs}
        self.reads = [node_reads(node) for node in self.nodes]
        self.last_use = {}
        for index, node in enumerate(self.nodes):
            for name in self.reads[index]:
                if name not in self.initializers and name not in self.producer:
                    raise ValueError(f"node {index} ({node.op_type}) reads '{name}' before it is produced; "
                                     "the graph is not topologically sorted")
                self.last_use[name] = index
            for name in node.output:
                if name:
                    self.producer[name] = index
        end = len(self.nodes)
        for name in self.graph_outputs:
            self.last_use[name] = end

    def is_weight(self, name: str) -> bool:
        """A large initializer: swapped with its block rather than kept in the skeleton."""
        init = self.initializers.get(name)
        return init is not None and tensor_nbytes(init) > INLINE_LIMIT_BYTES

    def node_weights(self, index: int) -> list[str]:
        return [n for n in self.reads[index] if self.is_weight(n)]

    def crossing(self, position: int) -> list[str]:
        """Activations alive across the cut just before node ``position``."""
        return [name for name, prod in self.producer.items()
                if prod < position <= self.last_use.get(name, -2)]


def light_model(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy whose large initializers keep only name/type/dims (fast to copy and infer over)."""
    light = onnx.ModelProto()
    graph = model.graph
    light.ir_version = model.ir_version
    light.opset_import.extend(model.opset_import)
    light.functions.extend(model.functions)
    light.graph.name = graph.name
    light.graph.node.extend(graph.node)
    light.graph.input.extend(graph.input)
    light.graph.output.extend(graph.output)
    light.graph.value_info.extend(graph.value_info)
    for init in graph.initializer:
        if tensor_nbytes(init) > INLINE_LIMIT_BYTES:
            light.graph.initializer.append(external_stub(init, "__weightless__"))
        else:
            light.graph.initializer.append(init)
    return light


def external_stub(init: TensorProto, location: str, offset: int | None = None) -> TensorProto:
    """Initializer metadata with its data declared external (valid ONNX external data).

    Without an offset the stub only keeps name/type/dims (for inference over a weightless graph).
    """
    stub = TensorProto()
    stub.name = init.name
    stub.data_type = init.data_type
    stub.dims.extend(init.dims)
    stub.data_location = TensorProto.EXTERNAL
    entries = [("location", location)]
    if offset is not None:
        entries += [("offset", str(offset)), ("length", str(tensor_nbytes(init)))]
    for key, value in entries:
        entry = stub.external_data.add()
        entry.key, entry.value = key, value
    return stub


def fixed_input_model(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]]) -> onnx.ModelProto:
    """A copy with the given input shapes pinned (for shape inference at one concrete size)."""
    return pin_input_dims(light_model(model), shapes)


def infer_shapes(model: onnx.ModelProto) -> dict[str, tuple[tuple[int | None, ...] | None, np.dtype]]:
    """name -> (shape with None for unknown dims, or None for unknown rank; dtype), all scopes."""
    inferred = shape_inference.infer_shapes(model, check_type=False, strict_mode=False, data_prop=True)
    table: dict[str, tuple[tuple[int | None, ...] | None, np.dtype]] = {}

    def visit(graph: onnx.GraphProto) -> None:
        for value in list(graph.input) + list(graph.value_info) + list(graph.output):
            tensor_type = value.type.tensor_type
            if not value.type.HasField("tensor_type") or tensor_type.elem_type == 0:
                continue
            shape = None
            if tensor_type.HasField("shape"):
                shape = tuple(int(d.dim_value) if d.HasField("dim_value") else None for d in tensor_type.shape.dim)
            table.setdefault(value.name, (shape, dtype_of(tensor_type.elem_type)))
        for init in graph.initializer:
            table.setdefault(init.name, (tuple(int(d) for d in init.dims), dtype_of(init.data_type)))
        for node in graph.node:
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    visit(attr.g)
                for sub in attr.graphs:
                    visit(sub)

    visit(inferred.graph)
    return table


def shape_bytes(entry) -> tuple[int, bool]:
    """(bytes, exact): unknown dims count as 1 so data-dependent tensors still get a size."""
    if entry is None:
        return 0, False
    shape, dtype = entry
    if shape is None:
        return dtype.itemsize, False
    exact = all(d is not None for d in shape)
    count = int(np.prod([1 if d is None else d for d in shape])) if shape else 1
    return count * dtype.itemsize, exact


def node_flops(node: onnx.NodeProto, shapes: dict) -> int:
    """Multiply-adds x2 for Conv/Gemm/MatMul, one op per output element otherwise.

    Control-flow nodes count their largest branch (only one runs).
    """
    def shape(name):
        entry = shapes.get(name)
        return None if entry is None else entry[0]

    def elems(name) -> int:
        s = shape(name)
        return int(np.prod([1 if d is None else d for d in s])) if s else 1

    op = node.op_type
    out = node.output[0] if node.output else ""
    if op in ("Conv", "ConvTranspose", "FusedConv"):
        w = shape(node.input[1])
        if w and all(d is not None for d in w):
            if op == "ConvTranspose":
                return 2 * elems(node.input[0]) * int(np.prod(w[1:]))
            return 2 * elems(out) * int(np.prod(w[1:]))
        return elems(out)
    if op in ("Gemm", "MatMul", "FusedMatMul", "FusedGemm"):
        a = shape(node.input[0])
        trans_a = next((x.i for x in node.attribute if x.name == "transA"), 0)
        if a and a[-1 if not trans_a else -2] is not None:
            k = a[-2] if trans_a else a[-1]
            return 2 * elems(out) * int(k)
        return elems(out)
    total = 0
    for attr in node.attribute:
        graphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
        branch = [sum(node_flops(n, shapes) for n in g.node) for g in graphs]
        total = max([total] + branch)
    return total + sum(elems(o) for o in node.output if o)
