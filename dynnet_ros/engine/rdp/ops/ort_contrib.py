"""onnxruntime's contrib operators that its own graph optimiser writes (com.microsoft.nchwc,
com.microsoft), so RDP can analyse a graph onnxruntime has already laid out for its NCHWc
kernels (engine/plan/layout.py) and the planner can place those tensors in its arena.

NCHWc tensors keep a 4-D NCHW *shape* whose channel count is padded to the kernel block size
(8 with AVX2, 16 with AVX-512); only the memory layout inside differs, so sizes are the
shape's element count as usual.
"""
from __future__ import annotations

from dataclasses import replace

from ..expr import Dim, add, floordiv, mul
from ..lattice import TensorInfo, nac, shaped
from ..registry import Ctx, register
from ._util import channels_first, channels_last, channels_last_rule, same_shape
from .nn import conv, gemm, global_pool, matmul_dims, pool

NCHWC = "com.microsoft.nchwc"
MICROSOFT = "com.microsoft"

_block_size: int | None = None


def set_nchwc_block_size(size: int | None) -> None:
    """The NCHWc block size of this machine's kernels (layout.py probes it); None = unknown."""
    global _block_size
    _block_size = size


def nchwc_block_size() -> int | None:
    return _block_size


def padded_channels(c: Dim) -> Dim:
    """Channels rounded up to the block size; unknown (None) if the block size is needed but unknown."""
    if isinstance(c, int) and c % 16 == 0:
        return c  # a multiple of every block size MLAS uses
    if _block_size is None or c is None:
        return None
    return mul(floordiv(add(c, _block_size - 1), _block_size), _block_size)


register("Conv", "ISDOS", "conv", domain=NCHWC)(conv)
register("MaxPool AveragePool", "ISDOS", "pool", domain=NCHWC)(pool)
register("GlobalAveragePool GlobalMaxPool", "ISDOS", "pool", domain=NCHWC)(global_pool)
register("FusedConv", "ISDOS", "conv", domain=MICROSOFT)(conv)
register("FusedGemm", "ISDOS", "matmul", domain=MICROSOFT)(gemm)


@register("NhwcConv", "ISDOS", "conv", domain=MICROSOFT,
          note="no CPU kernel: checked against onnxruntime's symbolic shape inference")
def nhwc_conv(ctx: Ctx) -> list:
    """Conv with input ``[N, H, W, C]`` and weight ``[M, kH, kW, C/group]``: ``[N, H', W', M]``."""
    x, w = ctx.inp(0), ctx.inp(1)
    if x is None or x.dims is None or len(x.dims) < 3 or w is None or w.dims is None or len(w.dims) != len(x.dims):
        return [nac("input or weight rank unknown", x.dtype if x else 0)]
    nchw = [TensorInfo(channels_first(x.dims), x.dtype), TensorInfo(channels_first(w.dims), w.dtype)]
    y = conv(replace(ctx, inputs=nchw + list(ctx.inputs[2:])))[0]
    if y.dims is None:
        return [y]
    return [TensorInfo(channels_last(y.dims), y.dtype, None, y.reason)]


@register("NhwcMaxPool", "ISDOS", "pool", domain=MICROSOFT)
def nhwc_max_pool(ctx: Ctx) -> list:
    """MaxPool over ``[N, H, W, C]`` (onnxruntime's NHWC rewrite of quantised graphs)."""
    return channels_last_rule(ctx, pool)


@register("FusedMatMul TransposeMatMul", "ISDOS", "matmul", domain=MICROSOFT)
def fused_matmul(ctx: Ctx) -> list:
    """MatMul with A and/or B transposed in their last two axes (``transA``/``transB``), scaled by
    ``alpha``; onnxruntime writes it for MatMul after Transpose. ``transBatchA``/``transBatchB``
    first move an operand's leading axis behind its batch axes (``[d0, d1.., dk, n]`` read as
    ``[d1.., dk, d0, n]``), then ``transA``/``transB`` swap the last two."""
    a, b = ctx.inp(0), ctx.inp(1)
    dtype = a.dtype if a is not None else 0
    if a is None or a.dims is None or b is None or b.dims is None:
        return [nac("input rank unknown", dtype)]

    def operand(dims: tuple, batch_flag: str, flag: str) -> tuple:
        if ctx.attr(batch_flag, 0) and len(dims) >= 3:
            dims = tuple(dims[1:-1]) + (dims[0], dims[-1])
        return dims[:-2] + (dims[-1], dims[-2]) if ctx.attr(flag, 0) and len(dims) >= 2 else dims
    return [shaped(matmul_dims(ctx, operand(tuple(a.dims), "transBatchA", "transA"),
                               operand(tuple(b.dims), "transBatchB", "transB")), dtype)]


@register("Gelu FastGelu BiasGelu QuickGelu", "ISDOS", "elementwise", domain=MICROSOFT)
def gelu(ctx: Ctx) -> list:
    return [same_shape(ctx)]


@register("Upsample", "ISDOS", "resize", domain=NCHWC)
def nchwc_upsample(ctx: Ctx) -> list:
    x = ctx.inp(0)
    scales = ctx.attr("scales")
    if x is None or x.dims is None or not scales or len(scales) != len(x.dims):
        return [nac("input rank or scales unknown", x.dtype if x else 0)]
    return [shaped(tuple(mul(d, int(s)) for d, s in zip(x.dims, scales)), x.dtype)]


@register("ReorderInput", "ISDOS", "layout", domain=NCHWC)
def reorder_input(ctx: Ctx) -> list:
    x = ctx.inp(0)
    if x is None or x.dims is None or len(x.dims) != 4:
        return [nac("ReorderInput needs a 4-D input", x.dtype if x else 0)]
    n, c, h, w = (x.dims[0], x.dims[3], x.dims[1], x.dims[2]) if ctx.attr("channels_last", 0) else x.dims
    return [shaped((n, padded_channels(c), h, w), x.dtype)]


@register("ReorderOutput", "ISDOS", "layout", domain=NCHWC)
def reorder_output(ctx: Ctx) -> list:
    x = ctx.inp(0)
    channels = ctx.attr("channels")
    if x is None or x.dims is None or len(x.dims) != 4 or channels is None:
        return [nac("ReorderOutput needs a 4-D input and its channels", x.dtype if x else 0)]
    n, _, h, w = x.dims
    dims = (n, h, w, channels) if ctx.attr("channels_last", 0) else (n, channels, h, w)
    return [shaped(dims, x.dtype)]
