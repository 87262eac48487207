"""Split fully-connected layers whose weight is too big to swap as one piece.

Why: a swapped model can run in no less memory than the largest weight one step needs. The
depth model's first FC weight is 24 MB of its 50 MB; at a budget that leaves room for 25 % of
the weights it could never be resident. ``Gemm(A, B, C)`` over output columns ``[c0, c1)`` is
``Gemm(A, B[:, c0:c1], C[c0:c1])`` (B transposed: rows), so k pieces and a ``Concat`` along
axis 1 compute the same matrix, and each piece needs only its own slice of B. The activation of
onnxruntime's ``FusedGemm`` is element-wise, so it splits the same way.

Only the graph changes here; the weight slices are described as ``(source tensor, axis, start,
stop)`` and cut by the store writer (swap/weight_file.py), which reads one tensor at a time.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dynnet_ros.engine.modelio.onnx_proto import ModelProto, NodeProto, TensorProto, get_attribute_value, make_node
from dynnet_ros.engine.plan.graph import node_inputs

#: (domain, op_type) of the fully-connected ops that split by output columns
SPLITTABLE = {("", "Gemm"), ("com.microsoft", "FusedGemm")}


@dataclass(frozen=True)
class Slice:
    """A piece of a source initializer: ``source[..., start:stop]`` along ``axis``."""

    source: str
    axis: int
    start: int
    stop: int


def _attr(node: NodeProto, name: str, default):
    for attribute in node.attribute:
        if attribute.name == name:
            return get_attribute_value(attribute)
    return default


def _columns_axis(node: NodeProto) -> int:
    """The axis of B that indexes output columns."""
    return 0 if _attr(node, "transB", 0) else 1


def split_large_gemms(model: ModelProto, max_bytes: int) -> dict[str, Slice]:
    """Rewrite ``model`` in place; returns the new initializers as slices of the old ones.

    A node is split when its B is a 2-D float initializer above ``max_bytes``, A is not
    transposed, and C is absent, a scalar-like broadcast or a 1-D bias of the output width.
    """
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    slices: dict[str, Slice] = {}
    nodes: list[NodeProto] = []
    for node in graph.node:
        pieces = _split(node, inits, max_bytes, slices)
        nodes.extend(pieces or [node])
    del graph.node[:]
    graph.node.extend(nodes)
    # If/Loop bodies read initializers of the enclosing graph too: those stay
    used = {name for node in graph.node for name in node_inputs(node)} | {o.name for o in graph.output}
    kept = [t for t in graph.initializer if t.name in used] + [inits[name] for name in slices]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    return slices


def _split(node: NodeProto, inits: dict[str, TensorProto], max_bytes: int,
           slices: dict[str, Slice]) -> list[NodeProto] | None:
    if (node.domain, node.op_type) not in SPLITTABLE or len(node.input) < 2 or _attr(node, "transA", 0):
        return None
    weight = inits.get(node.input[1])
    if weight is None or len(weight.dims) != 2 or weight.data_type != TensorProto.FLOAT:
        return None
    nbytes = int(np.prod(weight.dims)) * 4
    if nbytes <= max_bytes:
        return None
    axis = _columns_axis(node)
    width = int(weight.dims[axis])
    bias = inits.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
    if len(node.input) > 2 and node.input[2] and bias is None:
        return None  # a computed bias: leave the node alone
    count = -(-nbytes // max_bytes)
    step = -(-width // count)
    splits_bias = bias is not None and int(np.prod(bias.dims)) == width and len(bias.dims) in (1, 2)
    if bias is not None and not splits_bias and int(np.prod(bias.dims)) != 1:
        return None
    pieces, outputs = [], []
    for k, start in enumerate(range(0, width, step)):
        stop = min(width, start + step)
        w_name = f"{weight.name}__cols{k}"
        dims = list(weight.dims)
        dims[axis] = stop - start
        inits[w_name] = _declare(w_name, weight.data_type, dims)
        slices[w_name] = Slice(weight.name, axis, start, stop)
        inputs = [node.input[0], w_name]
        if bias is not None:
            if splits_bias:
                b_name = f"{bias.name}__cols{k}"
                b_dims = [stop - start] if len(bias.dims) == 1 else [1, stop - start]
                inits[b_name] = _declare(b_name, bias.data_type, b_dims)
                slices[b_name] = Slice(bias.name, len(bias.dims) - 1, start, stop)
                inputs.append(b_name)
            else:
                inputs.append(bias.name)
        out = f"{node.output[0]}__cols{k}"
        piece = make_node(node.op_type, inputs, [out], name=f"{node.name or node.output[0]}__cols{k}",
                                 domain=node.domain)
        piece.attribute.extend(node.attribute)
        pieces.append(piece)
        outputs.append(out)
    concat = make_node("Concat", outputs, [node.output[0]], name=f"{node.name or node.output[0]}__concat",
                              axis=1)
    return pieces + [concat]


def _declare(name: str, data_type: int, dims: list[int]) -> TensorProto:
    """A placeholder initializer (the store writes its data and points it at the weight file)."""
    tensor = TensorProto()
    tensor.name = name
    tensor.data_type = data_type
    tensor.dims.extend(int(d) for d in dims)
    tensor.data_location = TensorProto.EXTERNAL
    return tensor

