"""A read-only index over an ONNX graph that the planner's passes share.

Why: simplification, partitioning, ordering and the executor all ask the same questions —
who produces a tensor, who consumes it, which names are weights, which tensors a control-flow
body reads from the enclosing scope — and answering them once keeps each pass small.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

from dynnet_ros.engine.modelio import onnx_proto
from dynnet_ros.engine.modelio.onnx_proto import (
    AttributeProto,
    GraphProto,
    ModelProto,
    NodeProto,
    TensorProto,
    tensor_dtype_to_np_dtype,
    to_array,
)
from dynnet_ros.engine.plan.ort_types import ort_element_types

log = logging.getLogger(__name__)

# Ops whose body graphs read outer-scope tensors and whose work depends on runtime values.
CONTROL_FLOW_OPS = frozenset({"If", "Loop", "Scan"})


def subgraphs(node: NodeProto) -> list[GraphProto]:
    """Body graphs attached to a node (If branches, Loop/Scan bodies)."""
    out = []
    for attr in node.attribute:
        if attr.type == AttributeProto.GRAPH:
            out.append(attr.g)
        elif attr.type == AttributeProto.GRAPHS:
            out.extend(attr.graphs)
    return out


def all_graphs(graph: GraphProto):
    """``graph`` and every graph nested in it (If branches, Loop/Scan bodies), depth first."""
    yield graph
    for node in graph.node:
        for sub in subgraphs(node):
            yield from all_graphs(sub)


def outer_scope_inputs(graph: GraphProto) -> set[str]:
    """Names a body graph uses but does not define (inputs from the enclosing scope)."""
    defined = {v.name for v in graph.input} | {t.name for t in graph.initializer}
    used: set[str] = set()
    for node in graph.node:
        for name in node.input:
            if name and name not in defined:
                used.add(name)
        for body in subgraphs(node):
            used |= {n for n in outer_scope_inputs(body) if n not in defined}
        defined.update(o for o in node.output if o)
    return used - defined


def node_inputs(node: NodeProto) -> list[str]:
    """Explicit inputs plus the outer-scope tensors read by the node's body graphs."""
    names = [n for n in node.input if n]
    for body in subgraphs(node):
        names.extend(sorted(outer_scope_inputs(body)))
    return list(dict.fromkeys(names))  # first occurrence of each, in order


def node_name(node: NodeProto, index: int) -> str:
    return node.name or f"{node.op_type}_{index}"


@dataclass
class GraphIndex:
    """Producers, consumers, dtypes and weights of one model's top-level graph."""

    model: ModelProto
    producer: dict[str, int] = field(default_factory=dict)
    consumers: dict[str, list[int]] = field(default_factory=dict)
    dtypes: dict[str, np.dtype] = field(default_factory=dict)
    elem_types: dict[str, int] = field(default_factory=dict)
    initializers: dict[str, TensorProto] = field(default_factory=dict)
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    weights: dict[str, np.ndarray] = field(default_factory=dict)  # values of placeholder initializers

    @classmethod
    def build(cls, model: ModelProto, type_hints: dict[str, int] | None = None,
              weights: dict[str, np.ndarray] | None = None, infer: bool = True) -> GraphIndex:
        """``type_hints``: element types known from elsewhere (RDP, or the model before
        simplification, for tensors whose producer became a contrib op onnx cannot infer).
        ``weights``: values of the placeholder initializers of a skeleton model (see
        split_weights). ``infer=False`` skips onnx shape inference (the hints type everything)."""
        index = cls(model)
        index.weights = weights or {}
        graph = model.graph
        index.initializers = {t.name: t for t in graph.initializer}
        index.inputs = [v.name for v in graph.input if v.name not in index.initializers]
        index.outputs = [v.name for v in graph.output]
        for i, node in enumerate(graph.node):
            for name in node.output:
                if name:
                    index.producer[name] = i
            for name in node_inputs(node):
                index.consumers.setdefault(name, []).append(i)
        index._infer_types(type_hints or {}, infer)
        return index

    def _infer_types(self, hints: dict[str, int], infer: bool = True) -> None:
        """Element types of every tensor (shape-independent, so inference on the raw model is enough)."""
        inferred = self.model
        if infer:
            try:
                inferred = onnx_proto.onnx_library().shape_inference.infer_shapes(self.model, strict_mode=False)
            except Exception as exc:  # noqa: BLE001 - onnx's C++ inference raises several unrelated types
                # a model onnx cannot infer still runs, typed by the hints and onnxruntime below
                log.info("onnx shape inference failed on %s (%s); typing from hints and onnxruntime",
                         self.model.graph.name or "the model", exc)
        values = list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output)
        for value in values:
            if value.type.HasField("tensor_type") and value.type.tensor_type.elem_type:
                self.elem_types[value.name] = value.type.tensor_type.elem_type
        for name, elem in hints.items():
            self.elem_types.setdefault(name, elem)
        for name, tensor in self.initializers.items():
            self.elem_types[name] = tensor.data_type
        # what neither RDP nor onnx typed (ops outside onnx's schemas, rules that gave up), onnxruntime
        # does: a cut is never refused for lack of a type
        untyped = [name for node in self.model.graph.node for name in node.output
                   if name and name not in self.elem_types]
        if untyped:
            self.elem_types.update(ort_element_types(self.model, untyped))
        no_dtype = []
        for name, elem in self.elem_types.items():
            try:
                self.dtypes[name] = np.dtype(tensor_dtype_to_np_dtype(elem))
            except KeyError:  # UNDEFINED or a type onnx maps to no numpy dtype
                no_dtype.append(name)
        if no_dtype:
            log.debug("no numpy dtype for %d tensor(s), e.g. %s", len(no_dtype), no_dtype[:5])

    @property
    def nodes(self):
        return self.model.graph.node

    def is_weight(self, name: str) -> bool:
        return name in self.initializers

    def initializer_array(self, name: str) -> np.ndarray:
        if name in self.weights:
            return self.weights[name]
        return to_array(self.initializers[name])


def _is_big(tensor: TensorProto, min_bytes: int) -> bool:
    """Big float weights leave the graph; integer tensors small enough to be shapes stay (RDP reads them)."""
    nbytes = _tensor_nbytes(tensor)
    if tensor.data_type in _INT_TYPES and nbytes <= 4096 * 8:
        return False
    return nbytes >= min_bytes


_INT_TYPES = {TensorProto.INT64, TensorProto.INT32, TensorProto.INT16, TensorProto.INT8,
              TensorProto.UINT8, TensorProto.BOOL}


_DIRECT: dict[int, type[np.generic]] = {TensorProto.FLOAT: np.float32, TensorProto.DOUBLE: np.float64,
           TensorProto.FLOAT16: np.float16, TensorProto.INT64: np.int64,
           TensorProto.INT32: np.int32, TensorProto.INT16: np.int16, TensorProto.INT8: np.int8,
           TensorProto.UINT8: np.uint8, TensorProto.UINT16: np.uint16,
           TensorProto.UINT32: np.uint32, TensorProto.UINT64: np.uint64, TensorProto.BOOL: np.bool_}


def weight_array(tensor: TensorProto) -> np.ndarray:
    """The tensor's values with a single copy (``raw_data`` is viewed, not converted twice)."""
    if tensor.HasField("raw_data") and tensor.data_type in _DIRECT:
        dtype = np.dtype(_DIRECT[tensor.data_type]).newbyteorder("<")
        return np.frombuffer(tensor.raw_data, dtype=dtype).reshape(tuple(tensor.dims))
    return to_array(tensor)


def split_weights(model: ModelProto, min_bytes: int = 1024) -> tuple[ModelProto, dict[str, np.ndarray]]:
    """(skeleton, weights): the graph with big initializers as placeholders, and their values once."""
    weights = {t.name: weight_array(t) for t in model.graph.initializer
               if t.data_location != TensorProto.EXTERNAL and _is_big(t, min_bytes)}
    return strip_weights(model, min_bytes), weights


def strip_weights(model: ModelProto, min_bytes: int = 1024) -> ModelProto:
    """Copy of ``model`` whose big initializers keep name/type/dims but no data.

    Why: sub-models, inference and specialised versions need the graph's structure, not its
    weights; the weights live once, as numpy arrays handed to every session through
    ``SessionOptions.add_initializer``.
    """
    out = ModelProto()
    graph = model.graph
    out.ir_version = model.ir_version
    out.opset_import.extend(model.opset_import)
    out.producer_name = model.producer_name
    out.graph.name = graph.name
    out.graph.node.extend(graph.node)
    out.graph.input.extend(graph.input)
    out.graph.output.extend(graph.output)
    out.graph.value_info.extend(graph.value_info)
    out.functions.extend(model.functions)
    out.metadata_props.extend(model.metadata_props)
    for tensor in graph.initializer:
        if tensor.data_location == TensorProto.EXTERNAL:
            out.graph.initializer.append(tensor)
        elif _is_big(tensor, min_bytes):
            out.graph.initializer.append(weight_placeholder(tensor.name, tensor.data_type, list(tensor.dims),
                                                            _tensor_nbytes(tensor)))
        else:
            out.graph.initializer.append(tensor)
    return out


SHARED_WEIGHTS_LOCATION = "dynnet-shared-weights"


def weight_placeholder(name: str, data_type: int, dims: list[int], nbytes: int) -> TensorProto:
    """An initializer marked as external data; sessions receive the real buffer through
    ``SessionOptions.add_external_initializers`` (injected before graph optimisation, so
    onnxruntime's Conv+BN and similar fusions still see the values — ``add_initializer`` is not)."""
    tensor = TensorProto(name=name, data_type=data_type, dims=dims)
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", SHARED_WEIGHTS_LOCATION), ("offset", "0"), ("length", str(nbytes))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    return tensor


def _tensor_nbytes(tensor: TensorProto) -> int:
    count = int(np.prod(tensor.dims)) if tensor.dims else 1
    try:
        return count * np.dtype(tensor_dtype_to_np_dtype(tensor.data_type)).itemsize
    except KeyError:  # UNDEFINED or a type onnx maps to no numpy dtype: no size to count
        return 0

