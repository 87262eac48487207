"""A few non-default-domain operators with simple shape rules (ai.onnx.ml,
ai.onnx.preview.training, ai.onnx.preview).  Any other custom op is nac + warning."""
from __future__ import annotations

from dynnet_ros.engine.modelio.onnx_proto import TensorProto

from ..lattice import nac, shaped
from ..registry import Ctx, register
from ._util import same_shape


@register("LabelEncoder Binarizer Scaler Normalizer Imputer", "ISDOS", "ai.onnx.ml", custom=True)
def ml_same(ctx: Ctx) -> list:
    t = same_shape(ctx)
    if ctx.node.op_type == "LabelEncoder":
        keys = ctx.attrs
        dt = TensorProto.INT64 if ("values_int64s" in keys) else (
            TensorProto.STRING if "values_strings" in keys else TensorProto.FLOAT)
        return [shaped(t.dims, dt, None, t.reason)]
    return [t]


@register("TreeEnsemble TreeEnsembleRegressor", "ISDOS", "ai.onnx.ml", custom=True)
def tree_ensemble(ctx: Ctx) -> list:
    x = ctx.inp(0)
    n = ctx.attr("n_targets", 1)
    if x is None or x.dims is None:
        return [nac("input rank unknown")]
    return [shaped((x.dims[0], n), TensorProto.FLOAT)]


@register("ArrayFeatureExtractor", "ISDOS", "ai.onnx.ml", custom=True)
def array_feature_extractor(ctx: Ctx) -> list:
    x, idx = ctx.inp(0), ctx.inp(1)
    if x is None or x.dims is None or idx is None or idx.dims is None:
        return [nac("input rank unknown")]
    n = idx.numel()
    return [shaped(tuple(x.dims[:-1]) + (n,), x.dtype)]


@register("Adagrad Adam Momentum", "ISDOS", "ai.onnx.preview.training", custom=True)
def optimizer(ctx: Ctx) -> list:
    # inputs: R, T, then groups of per-tensor state; outputs mirror the groups after X
    ins = ctx.inputs[2:]
    n_out = ctx.n_out
    outs = []
    k = {"Adagrad": 3, "Momentum": 3, "Adam": 4}[ctx.node.op_type]
    n_tensors = len(ins) // k
    # output order: X_new..., then the state groups (skipping G)
    groups = [ins[i * n_tensors:(i + 1) * n_tensors] for i in range(k)]
    order = [groups[0]] + groups[2:]
    for g in order:
        for t in g:
            outs.append(shaped(t.dims, t.dtype) if t is not None and t.dims is not None else nac("rank unknown"))
    return outs[:n_out]


@register("FlexAttention", "ISDOS", "ai.onnx.preview", custom=True)
def flex_attention(ctx: Ctx) -> list:
    q, v = ctx.inp(0), ctx.inp(2)
    if q is None or q.dims is None or v is None or v.dims is None or len(q.dims) != 4:
        return [nac("input rank unknown")]
    return [shaped((q.dims[0], q.dims[1], q.dims[2], v.dims[3]), q.dtype)]
