"""onnxruntime's ``com.microsoft`` versions of operators that later joined the ONNX standard
(Range, Pad, Trilu, GatherND, GridSample, Unique, Inverse) or never did (ExpandDims, CDist);
onnxruntime keeps them for models exported before the standard op existed (tf2onnx, early
torch exporters). Each reads its inputs the contrib way and otherwise shares the standard
rule."""
from __future__ import annotations

from dataclasses import replace

from dynnet_ros.engine.modelio.onnx_proto import TensorProto

from ..lattice import nac, shaped
from ..registry import Ctx, register
from ._util import norm_axis, same_shape
from .misc import grid_sample
from .shape_ops import gather_nd, pad, range_op

MICROSOFT = "com.microsoft"

register("GatherND", "ISDOS", "gather", domain=MICROSOFT)(gather_nd)
register("GridSample", "ISDOS", "image", domain=MICROSOFT)(grid_sample)


@register("Trilu Inverse", "ISDOS", "elementwise", domain=MICROSOFT)
def same_as_input(ctx: Ctx) -> list:
    return [same_shape(ctx)]


@register("Range", "ISVDOS", "shape", domain=MICROSOFT)
def contrib_range(ctx: Ctx) -> list:
    """Range whose ``delta`` is optional (1 when absent)."""
    if ctx.inp(2) is not None:
        return range_op(ctx)
    start = ctx.inp(0)
    one = shaped((), start.dtype if start is not None else 0, (1,))
    return range_op(replace(ctx, inputs=[ctx.inp(0), ctx.inp(1), one]))


@register("Pad", "ISVDOS", "pad", domain=MICROSOFT)
def contrib_pad(ctx: Ctx) -> list:
    """Pad with the amounts as an input (``[2*rank]`` or ``[1, 2*rank]``) at any default-domain opset."""
    return pad(replace(ctx, opset=max(ctx.opset, 11)))


@register("ExpandDims", "ISVDOS", "reshape", domain=MICROSOFT)
def expand_dims(ctx: Ctx) -> list:
    """One axis of size 1 inserted at the value of ``axis`` (negative counts from the end)."""
    x, axis = ctx.inp(0), ctx.int_values(1)
    dtype = x.dtype if x is not None else 0
    if x is None or x.dims is None:
        return [nac("input rank unknown", dtype)]
    if axis is None or len(axis) != 1:
        return [nac("ExpandDims axis unknown", dtype, len(x.dims) + 1)]
    dims = list(x.dims)
    dims.insert(norm_axis(axis[0], len(dims) + 1), 1)
    return [shaped(dims, dtype)]


@register("CDist", "ISDOS", "matmul", domain=MICROSOFT)
def cdist(ctx: Ctx) -> list:
    """Pairwise distances of A ``[M, K]`` and B ``[N, K]``: ``[M, N]``."""
    a, b = ctx.inp(0), ctx.inp(1)
    dtype = a.dtype if a is not None else 0
    if a is None or a.dims is None or b is None or b.dims is None or len(a.dims) != 2 or len(b.dims) != 2:
        return [nac("CDist needs 2-D inputs", dtype)]
    ctx.constrain(a.dims[1], b.dims[1], "CDist inputs share their feature dim")
    return [shaped((a.dims[0], b.dims[0]), dtype)]


@register("Unique", "EDO", "data-dependent", domain=MICROSOFT)
def contrib_unique(ctx: Ctx) -> list:
    """Outputs: the unique values and their counts (as many as the data holds), and each input
    element's index into them (the input's shape)."""
    x = ctx.inp(0)
    why = "Unique count depends on data"
    idx = shaped(x.dims, TensorProto.INT64) if x is not None and x.dims is not None else nac(why, TensorProto.INT64)
    return [nac(why, x.dtype if x else 0, 1), idx, nac(why, TensorProto.INT64, 1)][:ctx.n_out]
