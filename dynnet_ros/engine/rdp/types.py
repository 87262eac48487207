"""Element types of an op's outputs where its shape rule cannot say (unknown rank, unknown op).

Why: an element type rarely depends on shapes, yet a transfer function that gives up on the
shape returns a bare nac, and the planner needs every tensor's type to cut the graph there.
So after each rule, an output left untyped takes its type from, in order: the node's own
type-deciding attribute, the control-flow body's declared outputs, the op's schema (an output
whose type variable it shares with an input takes that input's type; a variable that allows a
single type is that type), and for onnxruntime's contrib ops (com.microsoft, NCHWc) the table
below of ops whose outputs are the first input's type.
"""
from __future__ import annotations

from functools import cache

from dynnet_ros.engine.modelio import onnx_proto
from dynnet_ros.engine.modelio.onnx_proto import GraphProto, NodeProto, TensorProto

from .lattice import TensorInfo

#: onnxruntime contrib ops (com.microsoft, com.microsoft.nchwc) whose outputs have the type of
#: input 0: fused and layout ops its optimiser writes, and the float-in float-out kernels.
SAME_AS_INPUT_CONTRIB = frozenset(
    "FusedConv FusedGemm FusedMatMul TransposeMatMul Gelu FastGelu BiasGelu QuickGelu GemmFastGelu "
    "BiasSoftmax BiasAdd BiasSplitGelu BiasDropout SkipLayerNormalization LayerNormalization "
    "SimplifiedLayerNormalization SkipSimplifiedLayerNormalization GroupNorm SkipGroupNorm NhwcConv "
    "NhwcMaxPool Attention MultiHeadAttention GroupQueryAttention RotaryEmbedding Inverse Trilu "
    "ConvTransposeWithDynamicPads Conv MaxPool AveragePool GlobalAveragePool GlobalMaxPool Upsample "
    "ReorderInput ReorderOutput".split())
CONTRIB_DOMAINS = ("com.microsoft", "com.microsoft.nchwc")
_ELEM_BY_NAME = {f"tensor({name.lower()})": value for name, value in TensorProto.DataType.items() if value}
_FLOAT = TensorProto.FLOAT


def _attribute_type(node: NodeProto, input_types: list[int]) -> int | None:
    """Types set by an attribute (Cast's ``to``, the random ops' ``dtype``, Constant's value)."""
    attrs = {a.name: a for a in node.attribute}
    op = node.op_type
    if op == "Cast" and "to" in attrs:
        return attrs["to"].i
    if op in ("RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "EyeLike",
              "Bernoulli", "Multinomial"):
        if "dtype" in attrs:
            return attrs["dtype"].i
        if op.endswith("Like") or op == "Bernoulli":
            return input_types[0] if input_types else None
        return TensorProto.INT32 if op == "Multinomial" else _FLOAT
    if op in ("ConstantOfShape", "Constant"):
        value = attrs.get("value")
        if value is not None:
            return value.t.data_type
        if op == "ConstantOfShape":
            return _FLOAT
        for name, elem in (("value_float", _FLOAT), ("value_floats", _FLOAT), ("value_int", TensorProto.INT64),
                           ("value_ints", TensorProto.INT64), ("value_string", TensorProto.STRING),
                           ("value_strings", TensorProto.STRING)):
            if name in attrs:
                return elem
    return None


def _declared(graph: GraphProto) -> list[int]:
    return [v.type.tensor_type.elem_type if v.type.HasField("tensor_type") else 0 for v in graph.output]


def _body_types(node: NodeProto) -> list[int] | None:
    """If / Loop / Scan outputs: the types the body graph declares for them."""
    attrs = {a.name: a for a in node.attribute}
    if node.op_type == "If" and "then_branch" in attrs:
        then, other = _declared(attrs["then_branch"].g), _declared(attrs["else_branch"].g)
        return [a or b for a, b in zip(then, other)]
    if node.op_type == "Loop" and "body" in attrs:
        return _declared(attrs["body"].g)[1:]  # the body's first output is the condition
    if node.op_type == "Scan" and "body" in attrs:
        return _declared(attrs["body"].g)
    return None


@cache
def _schema_rules(domain: str, op_type: str, opset: int) -> tuple[tuple[str, int | None, int | None], ...] | None:
    """Per formal output: (type variable, first input index bound to it or None, the single type
    it allows or None); None when onnx has no schema for the op."""
    try:
        schema = onnx_proto.onnx_library().defs.get_schema(op_type, opset, domain)
    except onnx_proto.onnx_library().defs.SchemaError:  # no schema in onnx's library (contrib ops, custom domains)
        return None
    first_input: dict[str, int] = {}
    for index, formal in enumerate(schema.inputs):
        first_input.setdefault(formal.type_str, index)
    allowed = {c.type_param_str: c.allowed_type_strs for c in schema.type_constraints}
    rules = []
    for formal in schema.outputs:
        types = allowed.get(formal.type_str, [formal.type_str])
        single = _ELEM_BY_NAME.get(types[0]) if len(types) == 1 else None
        rules.append((formal.type_str, first_input.get(formal.type_str), single))
    return tuple(rules)


def output_types(node: NodeProto, input_types: list[int], opset: int) -> list[int]:
    """The element type of each output of ``node`` (0 where not decided) from ``input_types``
    (0 for unknown or absent inputs)."""
    n_out = len(node.output)
    fixed = _attribute_type(node, input_types)
    if fixed is not None:
        return [fixed] * n_out
    body = _body_types(node)
    if body is not None:
        return (body + [0] * n_out)[:n_out]
    domain = node.domain or ""
    if domain in CONTRIB_DOMAINS:
        if node.op_type in SAME_AS_INPUT_CONTRIB and input_types and input_types[0]:
            return [input_types[0]] * n_out
        return [0] * n_out
    rules = _schema_rules(domain, node.op_type, opset)
    if rules is None:
        return [0] * n_out
    out = []
    for k in range(n_out):
        _, source, single = rules[min(k, len(rules) - 1)]  # a variadic output repeats the last formal
        if single is not None:
            out.append(single)
        elif source is not None and source < len(input_types):
            out.append(input_types[source])
        else:
            out.append(0)
    return out


def with_types(node: NodeProto, outputs: list[TensorInfo], inputs: list[TensorInfo | None],
               opset: int) -> list[TensorInfo]:
    """``outputs`` with every untyped tensor output typed where ``output_types`` decides it."""
    if all(o.dtype or o.is_seq for o in outputs):
        return outputs
    types = output_types(node, [t.dtype if t is not None and not t.is_seq else 0 for t in inputs], opset)
    return [TensorInfo(o.dims, t, o.value, o.reason, o.is_seq, o.elem, o.seq_items) if not o.dtype and not o.is_seq
            and t else o for o, t in zip(outputs, types)]
