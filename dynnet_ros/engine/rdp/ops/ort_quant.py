"""onnxruntime's quantisation contrib operators (domain ``com.microsoft``), as
``onnxruntime.quantization.quantize_dynamic``/``quantize_static`` and exporters write them.

The QLinear* ops carry their scale and zero-point tensors between the data inputs, so each
rule names the data inputs' positions from the op's schema. The ``channels_last`` variants
(NHWC, what onnxruntime's NHWC transformer writes) are read as NCHW and written back.
"""
from __future__ import annotations

from dataclasses import replace

from dynnet_ros.engine.modelio.onnx_proto import TensorProto

from ..expr import mul
from ..lattice import TensorInfo, nac, shaped
from ..registry import Ctx, register
from ._util import broadcast_shapes, channels_last_rule, norm_axis, same_shape
from .nn import conv, gemm, matmul_dims, pool, rnn, same_as_x
from .shape_ops import concat

MICROSOFT = "com.microsoft"

register("QuantizeLinear DequantizeLinear", "ISDOS", "quantization", domain=MICROSOFT)(same_as_x)


def _dtype(ctx: Ctx, i: int, default: int) -> int:
    t = ctx.inp(i)
    return t.dtype if t is not None and t.dtype else default


@register("DynamicQuantizeMatMul MatMulIntegerToFloat MatMulInteger16", "ISDOS", "quantization",
          domain=MICROSOFT)
def quant_matmul(ctx: Ctx) -> list:
    """MatMul of A (input 0) and B (input 1); the float result has the scale's type."""
    dtype = TensorProto.INT32 if ctx.node.op_type == "MatMulInteger16" else _dtype(ctx, 2, TensorProto.FLOAT)
    a, b = ctx.inp(0), ctx.inp(1)
    if a is None or a.dims is None or b is None or b.dims is None:
        return [nac("input rank unknown", dtype)]
    return [shaped(matmul_dims(ctx, a.dims, b.dims), dtype)]


@register("MatMulNBits MatMulBnb4", "ISDOS", "quantization", domain=MICROSOFT)
def matmul_packed_weight(ctx: Ctx) -> list:
    """A ``[..., K]`` times a block-quantised ``[K, N]`` weight (N-bit integers, or bitsandbytes'
    FP4/NF4) packed into bytes, its logical shape in the K and N attributes: ``[..., N]``."""
    a = ctx.inp(0)
    dtype = a.dtype if a is not None else 0
    if a is None or a.dims is None or not a.dims:
        return [nac("input rank unknown", dtype)]
    ctx.constrain(a.dims[-1], ctx.attr("K"), f"{ctx.node.op_type} A's last dim is K")
    return [shaped(tuple(a.dims[:-1]) + (ctx.attr("N"),), dtype)]


@register("GatherBlockQuantized", "ISDOS", "quantization", domain=MICROSOFT)
def gather_block_quantized(ctx: Ctx) -> list:
    """Gather from block-quantised data; uint8 data packs ``8/bits`` values per byte along its
    last axis, so the gathered rows are that much wider. The output has the scales' type."""
    data, idx = ctx.inp(0), ctx.inp(1)
    dtype = _dtype(ctx, 2, TensorProto.FLOAT)
    if data is None or data.dims is None or not data.dims or idx is None or idx.dims is None:
        return [nac("input rank unknown", dtype)]
    dims = list(data.dims)
    bits = ctx.attr("bits", 4)
    if data.dtype == TensorProto.UINT8 and bits < 8:
        dims[-1] = mul(dims[-1], 8 // bits)
    axis = norm_axis(ctx.attr("gather_axis", 0), len(dims))
    return [shaped(dims[:axis] + list(idx.dims) + dims[axis + 1:], dtype)]


@register("QGemm", "ISDOS", "quantization", domain=MICROSOFT)
def qgemm(ctx: Ctx) -> list:
    """Gemm of A (input 0) and B (input 3); quantised output when y_scale (input 7) is given."""
    dtype = _dtype(ctx, 8, TensorProto.UINT8) if ctx.inp(7) is not None else TensorProto.FLOAT
    out = gemm(replace(ctx, inputs=[ctx.inp(0), ctx.inp(3)]))[0]
    return [TensorInfo(out.dims, dtype, None, out.reason)]


def _broadcast(ctx: Ctx, positions: tuple[int, ...], dtype: int) -> list:
    shapes = [t.dims if t is not None else None for t in (ctx.inp(i) for i in positions)]
    if any(s is None for s in shapes):
        return [nac("input rank unknown", dtype)]
    return [shaped(broadcast_shapes(shapes, ctx), dtype)]


@register("QLinearAdd QLinearMul", "ISDOS", "quantization", domain=MICROSOFT)
def qlinear_binary(ctx: Ctx) -> list:
    return _broadcast(ctx, (0, 3), _dtype(ctx, 0, 0))


@register("QLinearWhere", "ISDOS", "quantization", domain=MICROSOFT)
def qlinear_where(ctx: Ctx) -> list:
    return _broadcast(ctx, (0, 1, 4), _dtype(ctx, 1, 0))


@register("QLinearSigmoid QLinearLeakyRelu QLinearSoftmax", "ISDOS", "quantization", domain=MICROSOFT)
def qlinear_unary(ctx: Ctx) -> list:
    return [same_shape(ctx)]


@register("QLinearConv", "ISDOS", "quantization", domain=MICROSOFT)
def qlinear_conv(ctx: Ctx) -> list:
    return channels_last_rule(ctx, conv) if ctx.attr("channels_last", 0) else conv(ctx)


@register("QLinearAveragePool", "ISDOS", "quantization", domain=MICROSOFT)
def qlinear_average_pool(ctx: Ctx) -> list:
    return channels_last_rule(ctx, pool) if ctx.attr("channels_last", 0) else pool(ctx)


@register("QLinearGlobalAveragePool", "ISDOS", "quantization", domain=MICROSOFT)
def qlinear_global_average_pool(ctx: Ctx) -> list:
    x = ctx.inp(0)
    if x is None or x.dims is None or len(x.dims) < 3:
        return [nac("input rank unknown", x.dtype if x else 0)]
    ones = (1,) * (len(x.dims) - 2)
    if ctx.attr("channels_last", 0):
        return [shaped((x.dims[0],) + ones + (x.dims[-1],), x.dtype)]
    return [shaped((x.dims[0], x.dims[1]) + ones, x.dtype)]


@register("QLinearConcat", "ISDOS", "quantization", domain=MICROSOFT)
def qlinear_concat(ctx: Ctx) -> list:
    """Inputs: Y_scale, Y_zero_point, then (X, X_scale, X_zero_point) per concatenated tensor."""
    return concat(replace(ctx, inputs=list(ctx.inputs[2::3])))


@register("DynamicQuantizeLSTM", "ISDOS", "quantization", domain=MICROSOFT,
          note="needs hidden_size, as onnxruntime does")
def dynamic_quantize_lstm(ctx: Ctx) -> list:
    """LSTM with int8/uint8 weights (W stored transposed, ``[directions, input_size, 4*hidden]``);
    Y, Y_h and Y_c have the LSTM's shapes (no ``layout`` attribute: sequence first). onnxruntime
    requires the ``hidden_size`` attribute."""
    if not ctx.attr("hidden_size"):
        return [nac("DynamicQuantizeLSTM without hidden_size") for _ in range(ctx.n_out)]
    return rnn(ctx)


@register("QEmbedLayerNormalization", "ISDOS", "quantization", domain=MICROSOFT)
def qembed_layer_norm(ctx: Ctx) -> list:
    """QEmbedLayerNormalization: (batch, sequence, hidden) float output and the int32 mask index."""
    ids, word = ctx.inp(0), ctx.inp(2)
    dtype = _dtype(ctx, 8, TensorProto.FLOAT)
    if ids is None or ids.dims is None or len(ids.dims) != 2 or word is None or word.dims is None:
        return [nac("input rank unknown", dtype), nac("input rank unknown", TensorProto.INT32)][:ctx.n_out]
    out = [shaped(tuple(ids.dims) + (word.dims[-1],), dtype), shaped((ids.dims[0],), TensorProto.INT32)]
    return out[:ctx.n_out]

