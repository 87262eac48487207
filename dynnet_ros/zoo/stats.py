"""Parameter, weight-size and MAC counts of a model at a given input size.

Why our own counter: onnxruntime has no FLOP counter and the zoo's numbers (docs, tests, the
`dynnet zoo info` table) only need the dominant ops. Shapes come from ONNX shape inference on a
copy whose H, W are pinned (and the batch to one frame); MACs are counted for Conv, Gemm and MatMul
(elementwise ops, pooling and Resize are ignored, as is usual). `If` branches are counted as
taken (an upper bound for the gated model).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dynnet_ros.engine.modelio import onnx_proto
from dynnet_ros.engine.modelio.onnx_proto import (
    AttributeProto,
    GraphProto,
    ModelProto,
    NodeProto,
    TensorProto,
    tensor_dtype_to_np_dtype,
)

from .graph import BATCH


@dataclass(frozen=True)
class ModelStats:
    params: int            # float elements in initializers (incl. hand-designed and BN)
    weight_bytes: int      # bytes of all initializers
    macs: int              # multiply-accumulates of Conv/Gemm/MatMul at the given size
    height: int
    width: int

    @property
    def weight_mb(self) -> float:
        return self.weight_bytes / 1e6

    @property
    def gflops(self) -> float:
        """2 FLOPs per MAC, in units of 1e9."""
        return 2.0 * self.macs / 1e9


def _initializer_sizes(graph: GraphProto) -> tuple[int, int]:
    params = nbytes = 0
    for init in graph.initializer:
        n = int(np.prod(init.dims)) if init.dims else 1
        itemsize = tensor_dtype_to_np_dtype(init.data_type).itemsize
        nbytes += n * itemsize
        if init.data_type in (TensorProto.FLOAT, TensorProto.FLOAT16):
            params += n
    return params, nbytes


def _pinned(model: ModelProto, height: int, width: int) -> ModelProto:
    pinned = ModelProto()
    pinned.CopyFrom(model)
    for inp in pinned.graph.input:
        for dim in inp.type.tensor_type.shape.dim:
            if dim.dim_param == "H":
                dim.dim_value = height
            elif dim.dim_param == "W":
                dim.dim_value = width
            elif dim.dim_param == BATCH:
                dim.dim_value = 1
    return onnx_proto.onnx_library().shape_inference.infer_shapes(pinned, data_prop=True)


def _shapes(graph: GraphProto, known: dict[str, list[int | None]]) -> None:
    for vi in list(graph.input) + list(graph.value_info) + list(graph.output):
        dims = vi.type.tensor_type.shape.dim
        known[vi.name] = [d.dim_value if d.HasField("dim_value") else None for d in dims]
    for init in graph.initializer:
        known[init.name] = list(init.dims)


@dataclass(frozen=True)
class LayerCost:
    """MACs and weight elements of one Conv/Gemm/MatMul node at a pinned input size."""

    node: str
    op_type: str
    macs: int
    params: int
    out_shape: tuple[int, ...]


def _concrete(dims: list[int | None] | None) -> list[int] | None:
    """``dims`` when every dimension is known (an empty list is a known scalar shape), else None."""
    if dims is None or None in dims:
        return None
    return [d for d in dims if d is not None]


def _node_cost(node: NodeProto, known: dict[str, list[int | None]]) -> LayerCost | None:
    if node.op_type not in ("Conv", "Gemm", "MatMul"):
        return None
    out = _concrete(known.get(node.output[0]))
    first = _concrete(known.get(node.input[0]))
    weight = _concrete(known.get(node.input[1], []))
    if not out or not first or weight is None:
        raise ValueError(f"cannot count MACs of {node.name}: shape unknown after inference")
    if node.op_type == "Conv":
        macs = int(np.prod(out)) * int(np.prod(weight[1:]))
    else:
        trans_a = any(at.name == "transA" and at.i for at in node.attribute)
        k = first[-2] if trans_a else first[-1]
        macs = int(np.prod(out)) * k
    params = 0
    for name in node.input[1:]:
        dims = _concrete(known.get(name))
        if dims is not None:
            params += int(np.prod(dims))
    return LayerCost(node.name, node.op_type, macs, params, tuple(out))


def _graph_layers(graph: GraphProto, known: dict[str, list[int | None]], out: list[LayerCost]) -> None:
    _shapes(graph, known)
    for node in graph.node:
        cost = _node_cost(node, known)
        if cost is not None:
            out.append(cost)
        for attr in node.attribute:   # If/Loop bodies: count the then-branch (upper bound)
            if attr.type == AttributeProto.GRAPH and attr.name in ("then_branch", "body"):
                _graph_layers(attr.g, dict(known), out)


def layer_costs(model: ModelProto, height: int = 480, width: int = 640) -> list[LayerCost]:
    """Per-node MACs/params of the Conv/Gemm/MatMul nodes (If then-branches included)."""
    out: list[LayerCost] = []
    _graph_layers(_pinned(model, height, width).graph, {}, out)
    return out


def model_stats(model: ModelProto, height: int = 480, width: int = 640) -> ModelStats:
    """Params, weight bytes and MACs of ``model`` with H, W pinned to ``height`` x ``width``."""
    params, nbytes = _initializer_sizes(model.graph)
    macs = sum(c.macs for c in layer_costs(model, height, width))
    return ModelStats(params, nbytes, macs, height, width)
