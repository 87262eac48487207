"""Shape computation and data-movement families (value propagation included).

Shape/Size (ISDO); Reshape, Expand, Tile, Range, ConstantOfShape, Slice, Pad,
Split ... (ISVDOS: the output shape comes from input *values*, which RDP tracks
for small integer tensors); Transpose, Concat, Gather ... (ISDOS).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from dynnet_ros.engine.modelio.onnx_proto import TensorProto

from ..expr import (
    Dim,
    Expr,
    Ratio,
    add,
    bounds,
    ceildiv,
    dmax,
    dmin,
    exact_div,
    floordiv,
    mul,
    ratio_floor,
    ratio_op,
    sub,
)
from ..lattice import MAX_VALUE_ELEMS, TensorInfo, nac, shaped
from ..registry import Ctx, ShapeError, register
from ._util import broadcast_shapes, concrete, from_array, norm_axis, to_array

BIG = 2 ** 31 - 1  # a start/end at least this large means "to the end" (dims are < 2**31)


def _prod(dims) -> Dim:
    n: Dim = 1
    for d in dims:
        n = mul(n, d)
    return n


def array_info(arr: np.ndarray, dtype: int) -> TensorInfo:
    if arr.dtype.kind in "OUS":
        return shaped(arr.shape, dtype, None)
    if arr.size <= (64 if arr.dtype.kind in "fc" else MAX_VALUE_ELEMS):
        return from_array(arr, dtype)
    return shaped(arr.shape, dtype, None)


# ----------------------------------------------------------------- Shape / Size / Constant
@register("Shape", "ISDO", "shape")
def shape_op(ctx: Ctx) -> list:
    t = ctx.inp(0)
    if t is None or t.dims is None:
        return [shaped((None,), TensorProto.INT64, None, "rank of the input unknown")]
    r = len(t.dims)
    start = ctx.attr("start", 0)
    end = ctx.attr("end", r)
    start = min(max(start + r if start < 0 else start, 0), r)
    end = min(max(end + r if end < 0 else end, 0), r)
    dims = t.dims[start:end] if end > start else ()
    return [shaped((len(dims),), TensorProto.INT64, dims)]


@register("Size", "ISDO", "shape")
def size_op(ctx: Ctx) -> list:
    t = ctx.inp(0)
    n = t.numel() if t is not None else None
    return [shaped((), TensorProto.INT64, (n,))]


@register("Constant", "ISDOS", "constant")
def constant(ctx: Ctx) -> list:
    a = ctx.attrs
    if "value" in a:
        arr = a["value"]
        dtype = ctx.node.attribute[[x.name for x in ctx.node.attribute].index("value")].t.data_type
        return [array_info(np.asarray(arr), dtype)]
    if "value_float" in a:
        return [shaped((), TensorProto.FLOAT, (float(np.float32(a["value_float"])),))]
    if "value_floats" in a:
        v = [float(np.float32(x)) for x in a["value_floats"]]
        return [shaped((len(v),), TensorProto.FLOAT, v)]
    if "value_int" in a:
        return [shaped((), TensorProto.INT64, (int(a["value_int"]),))]
    if "value_ints" in a:
        v = [int(x) for x in a["value_ints"]]
        return [shaped((len(v),), TensorProto.INT64, v)]
    if "value_string" in a:
        return [shaped((), TensorProto.STRING)]
    if "value_strings" in a:
        return [shaped((len(a["value_strings"]),), TensorProto.STRING)]
    if "sparse_value" in a:
        sp = a["sparse_value"]
        return [shaped(tuple(sp.dims), sp.values.data_type)]
    return [nac("Constant without a value")]


@register("ConstantOfShape", "ISVDOS", "shape")
def constant_of_shape(ctx: Ctx) -> list:
    dims = ctx.dim_values(0)
    v = ctx.attr("value")
    dtype = TensorProto.FLOAT
    fill = 0.0
    if v is not None:
        for a in ctx.node.attribute:
            if a.name == "value":
                dtype = a.t.data_type
        arr = np.asarray(v).reshape(-1)
        fill = arr[0].item() if arr.size else 0
    if dims is None:
        t = ctx.inp(0)
        n = t.dims[0] if t is not None and t.dims is not None and len(t.dims) == 1 else None
        if isinstance(n, int):
            return [shaped((None,) * n, dtype, None, "shape values unknown")]
        return [nac("shape values unknown", dtype)]
    val = None
    c = concrete(dims)
    if c is not None and math.prod(c) <= MAX_VALUE_ELEMS:
        val = (fill,) * math.prod(c)
    return [shaped(dims, dtype, val, None if all(d is not None for d in dims) else "shape value unknown")]


@register("Range", "ISVDOS", "shape")
def range_op(ctx: Ctx) -> list:
    start = ctx.inp(0)
    dtype = start.dtype if start is not None else 0
    sv, lv, dv = (ctx.values(i) for i in range(3))
    if sv is None or lv is None or dv is None:
        return [shaped((None,), dtype, None, "Range start/limit/delta unknown")]
    s, lim, d = sv[0], lv[0], dv[0]
    if any(x is None for x in (s, lim, d)):
        return [shaped((None,), dtype, None, "Range start/limit/delta unknown")]
    if all(isinstance(x, (int, float)) for x in (s, lim, d)):
        if d == 0:
            raise ShapeError("Range delta is 0")
        float_types: dict[int, type[np.floating[Any]]] = {TensorProto.FLOAT: np.float32,
                                                          TensorProto.FLOAT16: np.float16}
        np_t = float_types.get(dtype)
        if np_t is not None:  # onnxruntime: ceil(double(limit - start in T) / delta)
            diff = float(np_t(lim) - np_t(s))
            n = max(int(math.ceil(diff / float(np_t(d)))), 0)
        else:
            n = max(int(math.ceil((lim - s) / d)), 0)
        val = None
        if n <= MAX_VALUE_ELEMS:
            val = tuple(s + i * d for i in range(n))
        return [shaped((n,), dtype, val)]
    # integral floats next to an integral symbolic value behave like ints
    s, lim, d = (int(x) if isinstance(x, float) and x.is_integer() else x for x in (s, lim, d))
    if isinstance(d, int) and d != 0 and not isinstance(s, (float, Ratio)) and not isinstance(lim, (float, Ratio)):
        count = ceildiv(sub(lim, s), d) if d > 0 else ceildiv(sub(s, lim), -d)
        return [shaped((dmax(count, 0),), dtype)]
    # exact dyadic float arithmetic: n = ceil((limit - start) / delta)
    if isinstance(d, (int, float)) and d != 0:
        q = ratio_op("Div", ratio_op("Sub", lim, s), d)
        count = q if isinstance(q, (int, Expr)) else (ratio_floor(q, ceil=True) if isinstance(q, Ratio) else None)
        if isinstance(q, float):
            count = math.ceil(q)
        if count is not None:
            return [shaped((dmax(count, 0),), dtype)]
    return [shaped((None,), dtype, None, "Range over symbolic floats that are not exact")]


# ----------------------------------------------------------------- Reshape family
@register("Reshape", "ISVDOS", "reshape", values_since=5)
def reshape(ctx: Ctx) -> list:
    t = ctx.inp(0)
    target: list[Dim] | None
    target = [int(x) for x in ctx.attr("shape", [])] if ctx.opset < 5 else ctx.dim_values(1)
    dtype = t.dtype if t else 0
    if target is None:
        s = ctx.inp(1)
        n = s.dims[0] if s is not None and s.dims is not None and len(s.dims) == 1 else None
        if isinstance(n, int):
            return [shaped((None,) * n, dtype, None, "Reshape target shape unknown")]
        return [nac("Reshape target shape unknown", dtype)]
    allowzero = ctx.attr("allowzero", 0)
    out: list[Dim] = []
    neg = -1
    for i, d in enumerate(target):
        if isinstance(d, int) and d == 0 and not allowzero:
            if t is None or t.dims is None or i >= len(t.dims):
                out.append(None)
            else:
                out.append(t.dims[i])
        elif isinstance(d, int) and d == -1:
            neg = i
            out.append(None)
        else:
            out.append(d)
    if neg >= 0:
        total = t.numel() if t is not None else None
        known = _prod([d for i, d in enumerate(out) if i != neg])
        if total is not None and known is not None:
            q = exact_div(total, known)
            if q is None and isinstance(known, int) and known > 0:
                q = floordiv(total, known) if isinstance(total, Expr) else None
            out[neg] = q
    elif t is not None and t.dims is not None and all(d is not None for d in out):
        ctx.constrain(t.numel(), _prod(out), "Reshape keeps the element count")
    val = None
    if t is not None and t.value is not None:
        c = concrete(out)
        if c is not None and math.prod(c) == len(t.value):
            val = t.value
    return [shaped(out, dtype, val, None if all(d is not None for d in out) else "Reshape -1 not provable")]


@register("Flatten", "ISDOS", "reshape")
def flatten(ctx: Ctx) -> list:
    t = ctx.inp(0)
    if t is None or t.dims is None:
        return [shaped((None, None), t.dtype if t else 0, None, "input rank unknown")]
    r = len(t.dims)
    axis = ctx.attr("axis", 1)
    axis = axis + r if axis < 0 else axis
    if not 0 <= axis <= r:
        raise ShapeError("Flatten axis out of range")
    return [shaped((_prod(t.dims[:axis]), _prod(t.dims[axis:])), t.dtype, t.value)]


def _axes_input(ctx: Ctx, attr_until: int, idx: int = 1) -> list[int] | None | str:
    """Axes from the attribute (old opsets) or the input; 'absent' when not given."""
    if ctx.opset < attr_until:
        a = ctx.attr("axes")
        return "absent" if a is None else [int(x) for x in a]
    if ctx.inp(idx) is None:
        return "absent"
    return ctx.int_values(idx)


@register("Squeeze", "ISVDOS", "reshape", values_since=13)
def squeeze(ctx: Ctx) -> list:
    t = ctx.inp(0)
    axes = _axes_input(ctx, 13)
    if t is None or t.dims is None or axes is None:
        return [nac("Squeeze axes or input rank unknown", t.dtype if t else 0)]
    r = len(t.dims)
    if isinstance(axes, str):  # "absent"
        keep = []
        for d in t.dims:
            if d == 1:
                continue
            if d is None or (isinstance(d, Expr) and not _ne1(d)):
                return [nac("Squeeze without axes on a dim that may be 1", t.dtype)]
            keep.append(d)
        return [shaped(keep, t.dtype, t.value)]
    ax = {norm_axis(a, r) for a in axes}
    for a in ax:
        ctx.constrain(t.dims[a], 1, "Squeeze axis must be 1")
    return [shaped([d for i, d in enumerate(t.dims) if i not in ax], t.dtype, t.value)]


def _ne1(d) -> bool:
    lo, hi = bounds(d)
    return lo > 1 or hi < 1


@register("Unsqueeze", "ISVDOS", "reshape", values_since=13)
def unsqueeze(ctx: Ctx) -> list:
    t = ctx.inp(0)
    axes = _axes_input(ctx, 13)
    if t is None or t.dims is None or axes is None or isinstance(axes, str):  # str: "absent"
        return [nac("Unsqueeze axes or input rank unknown", t.dtype if t else 0)]
    r = len(t.dims) + len(axes)
    ax = sorted(norm_axis(a, r) for a in axes)
    dims = list(t.dims)
    for a in ax:
        dims.insert(a, 1)
    return [shaped(dims, t.dtype, t.value)]


@register("Transpose", "ISDOS", "layout")
def transpose(ctx: Ctx) -> list:
    t = ctx.inp(0)
    if t is None or t.dims is None:
        return [nac("input rank unknown", t.dtype if t else 0)]
    r = len(t.dims)
    perm = ctx.attr("perm") or list(range(r - 1, -1, -1))
    dims = [t.dims[p] for p in perm]
    val = None
    a = to_array(t)
    if a is not None:
        val = tuple(a.transpose(perm).reshape(-1).tolist())
    return [shaped(dims, t.dtype, val)]


@register("Expand", "ISVDOS", "broadcast")
def expand(ctx: Ctx) -> list:
    t = ctx.inp(0)
    shp = ctx.dim_values(1)
    dtype = t.dtype if t else 0
    if t is None or t.dims is None or shp is None:
        s = ctx.inp(1)
        n = s.dims[0] if s is not None and s.dims is not None and len(s.dims) == 1 else None
        if isinstance(n, int) and t is not None and t.dims is not None:
            return [shaped((None,) * max(n, len(t.dims)), dtype, None, "Expand shape unknown")]
        return [nac("Expand shape unknown", dtype)]
    dims = broadcast_shapes([t.dims, tuple(shp)], ctx)
    val = None
    a = to_array(t)
    c = concrete(dims)
    if a is not None and c is not None and math.prod(c) <= MAX_VALUE_ELEMS:
        val = tuple(np.broadcast_to(a, c).reshape(-1).tolist())
    return [shaped(dims, dtype, val)]


@register("Tile", "ISVDOS", "broadcast")
def tile(ctx: Ctx) -> list:
    t = ctx.inp(0)
    reps = ctx.dim_values(1)
    if t is None or t.dims is None:
        return [nac("input rank unknown", t.dtype if t else 0)]
    if reps is None or len(reps) != len(t.dims):
        return [shaped((None,) * len(t.dims), t.dtype, None, "Tile repeats unknown")]
    dims = [mul(d, r) for d, r in zip(t.dims, reps)]
    val = None
    a = to_array(t)
    int_reps = [r for r in reps if isinstance(r, int)]
    if a is not None and len(int_reps) == len(reps):
        res = np.tile(a, int_reps)
        if res.size <= MAX_VALUE_ELEMS:
            val = tuple(res.reshape(-1).tolist())
    return [shaped(dims, t.dtype, val)]


# ----------------------------------------------------------------- Concat / Split
def _merge_equal(ctx: Ctx, ds: list, why: str) -> Dim:
    """Dims that must be equal at run time: keep the most informative one."""
    best = None
    for d in ds:
        if d is None:
            continue
        if best is None:
            best = d
        elif best != d:
            if isinstance(best, int) and isinstance(d, int):
                raise ShapeError(f"{why}: {best} != {d}")
            ctx.constrain(best, d, why)
            if isinstance(d, int):
                best = d
    return best


@register("Concat", "ISDOS", "concat")
def concat(ctx: Ctx) -> list:
    ins = [t for t in ctx.inputs if t is not None]
    dtype = ins[0].dtype if ins else 0
    ranked = [t for t in ins if t.dims is not None]
    if not ranked:
        return [nac("input ranks unknown", dtype)]
    r = len(ranked[0].dims)
    axis = norm_axis(ctx.attr("axis", 0), r)
    dims: list[Dim]
    if any(t.dims is None for t in ins):
        dims = [None] * r
        for i in range(r):
            if i != axis:
                dims[i] = _merge_equal(ctx, [t.dims[i] for t in ranked], "Concat non-axis dims")
        return [shaped(dims, dtype, None, "an input rank is unknown")]
    dims = []
    for i in range(r):
        if i == axis:
            dims.append(_prod_sum([t.dims[i] for t in ins]))
        else:
            dims.append(_merge_equal(ctx, [t.dims[i] for t in ins], "Concat non-axis dims"))
    val = None
    arrs = [a for a in (to_array(t) for t in ins) if a is not None]
    if len(arrs) == len(ins):
        res = np.concatenate(arrs, axis=axis)
        if res.size <= MAX_VALUE_ELEMS:
            val = tuple(res.reshape(-1).tolist())
    return [shaped(dims, dtype, val)]


def _prod_sum(ds) -> Dim:
    s: Dim = 0
    for d in ds:
        s = add(s, d)
    return s


@register("Split", "ISVDOS", "split", values_since=13)
def split(ctx: Ctx) -> list:
    t = ctx.inp(0)
    n = ctx.n_out
    dtype = t.dtype if t else 0
    if t is None or t.dims is None:
        return [nac("input rank unknown", dtype) for _ in range(n)]
    r = len(t.dims)
    axis = norm_axis(ctx.attr("axis", 0), r)
    d = t.dims[axis]
    if ctx.opset < 13:
        sizes = ctx.attr("split")
        if sizes is None and ctx.opset >= 2 and len(ctx.inputs) > 1 and ctx.inp(1) is not None:
            sizes = ctx.dim_values(1)
    else:
        sizes = ctx.dim_values(1) if ctx.inp(1) is not None else None
        if ctx.inp(1) is not None and sizes is None:
            return [shaped(t.dims[:axis] + (None,) + t.dims[axis + 1:], dtype, None, "Split sizes unknown")
                    for _ in range(n)]
    if sizes is None:
        num = ctx.attr("num_outputs", n) if ctx.opset >= 18 else n
        if ctx.opset >= 18 and "num_outputs" in ctx.attrs:
            c = ceildiv(d, num)
            sizes = [c] * (num - 1) + [sub(d, mul(c, num - 1))]
        else:
            sizes = [floordiv(d, num) if d is not None else None] * num
    else:
        ctx.constrain(_prod_sum(sizes), d, "Split sizes add up to the axis")
    outs = []
    offs: Dim = 0
    a = to_array(t)
    for s in sizes[:n]:
        dims = t.dims[:axis] + (s,) + t.dims[axis + 1:]
        val = None
        if a is not None and isinstance(offs, int) and isinstance(s, int):
            sl = [slice(None)] * r
            sl[axis] = slice(offs, offs + s)
            val = tuple(a[tuple(sl)].reshape(-1).tolist())
        outs.append(shaped(dims, dtype, val))
        offs = add(offs, s)
    return outs


# ----------------------------------------------------------------- Slice
def _clamp_int(x: int, d: int, step: int, is_end: bool) -> int:
    """:func:`_clamp` of a concrete value on a concrete axis."""
    lo_neg = -1 if (is_end and step < 0) else 0
    hi_off = 0 if step > 0 else 1
    if x < 0:
        x += d
    return min(max(x, lo_neg), d - hi_off)


def _clamp(x: Dim, d: Dim, step: int, is_end: bool) -> Dim:
    """ONNX Slice clamping (negative values count from the end): starts to [0, d] (step > 0) or
    [0, d-1] (step < 0); ends to [0, d] or [-1, d-1].  Note: not Python's rule for starts."""
    if isinstance(x, int) and isinstance(d, int):
        return _clamp_int(x, d, step, is_end)
    lo_neg = -1 if (is_end and step < 0) else 0
    hi_off = 0 if step > 0 else 1
    top = sub(d, hi_off)
    if isinstance(x, int):
        if x >= BIG:
            return top
        if x <= -BIG:
            return dmin(lo_neg, top)  # an empty axis leaves nothing to clamp to
        return dmin(x, top) if x >= 0 else dmin(dmax(add(x, d), lo_neg), top)
    # symbolic bound: only when provably non-negative
    if x is None or d is None or bounds(x)[0] < 0:
        return None
    return dmin(x, sub(d, hi_off))


def slice_len(d: Dim, start: Dim, end: Dim, step: int) -> Dim:
    if step == 0:
        raise ShapeError("Slice step 0")
    if step < 0 and isinstance(end, int) and end >= BIG:
        return None  # onnxruntime reads INT_MAX ends as "to the front" here, the ONNX spec as d-1
    s = _clamp(start, d, step, False)
    e = _clamp(end, d, step, True)
    if s is None or e is None:
        return None
    if isinstance(s, int) and isinstance(e, int):
        n = -(-(e - s) // step) if step > 0 else -(-(s - e) // -step)
        return max(n, 0)
    if step > 0:
        return dmax(ceildiv(sub(e, s), step), 0)
    return dmax(ceildiv(sub(s, e), -step), 0)


def _concrete_slice(d: int, start: int, end: int, step: int) -> slice:
    s = _clamp_int(start, d, step, False)
    e = _clamp_int(end, d, step, True)
    return slice(s, None if e < 0 else e, step)


@register("Slice", "ISVDOS", "slice", values_since=10)
def slice_op(ctx: Ctx) -> list:
    t = ctx.inp(0)
    dtype = t.dtype if t else 0
    if t is None or t.dims is None:
        return [nac("input rank unknown", dtype)]
    r = len(t.dims)
    if ctx.opset < 10:
        starts = ctx.attr("starts")
        ends = ctx.attr("ends")
        axes = ctx.attr("axes")
        steps = None
    else:
        starts, ends = ctx.dim_values(1), ctx.dim_values(2)
        axes = ctx.int_values(3) if ctx.inp(3) is not None else None
        if ctx.inp(3) is not None and axes is None:
            return [shaped((None,) * r, dtype, None, "Slice axes unknown")]
        steps = ctx.int_values(4) if ctx.inp(4) is not None else None
        if ctx.inp(4) is not None and steps is None:
            return [shaped((None,) * r, dtype, None, "Slice steps unknown")]
    if starts is None or ends is None:
        dims = list(t.dims)
        if axes is not None:
            for a in axes:
                dims[norm_axis(a, r)] = None
        else:
            st_t = ctx.inp(1) if ctx.opset >= 10 else None
            n = st_t.dims[0] if st_t is not None and st_t.dims is not None and len(st_t.dims) == 1 else None
            if isinstance(n, int):  # the first n axes are sliced by unknown amounts
                for a in range(min(n, r)):
                    dims[a] = None
            else:
                dims = [None] * r
        return [shaped(dims, dtype, None, "Slice starts/ends unknown")]
    axes = list(range(len(starts))) if axes is None else [norm_axis(a, r) for a in axes]
    steps = [1] * len(starts) if steps is None else steps
    dims = list(t.dims)
    for a, s, e, st in zip(axes, starts, ends, steps):
        dims[a] = slice_len(t.dims[a], s, e, st) if s is not None and e is not None else None
    val = None
    arr = to_array(t)
    if arr is not None and all(isinstance(x, int) for x in list(starts) + list(ends)):
        sl = [slice(None)] * r
        for a, s, e, st in zip(axes, starts, ends, steps):
            sl[a] = _concrete_slice(t.dims[a], s, e, st)
        val = tuple(arr[tuple(sl)].reshape(-1).tolist())
        if len(val) != (math.prod(d for d in dims) if all(isinstance(d, int) for d in dims) else -1):
            val = None
    return [shaped(dims, dtype, val, None if all(d is not None for d in dims) else "Slice bound not provable")]


# ----------------------------------------------------------------- Gather family
@register("Gather", "ISDOS", "gather")
def gather(ctx: Ctx) -> list:
    t, idx = ctx.inp(0), ctx.inp(1)
    dtype = t.dtype if t else 0
    if t is None or t.dims is None or idx is None or idx.dims is None:
        return [nac("input rank unknown", dtype)]
    axis = norm_axis(ctx.attr("axis", 0), len(t.dims))
    dims = t.dims[:axis] + idx.dims + t.dims[axis + 1:]
    val = None
    arr = to_array(t)
    iv = ctx.int_values(1)
    if arr is not None and iv is not None:
        n = arr.shape[axis]
        ia = np.array([i + n if i < 0 else i for i in iv], dtype=np.int64).reshape(concrete(idx.dims))
        if ia.size == 0 or (ia.min() >= 0 and ia.max() < n):
            res = np.take(arr, ia, axis=axis)
            val = tuple(res.reshape(-1).tolist()) if isinstance(res, np.ndarray) else (res,)
    return [shaped(dims, dtype, val)]


@register("GatherElements", "ISDOS", "gather")
def gather_elements(ctx: Ctx) -> list:
    t, idx = ctx.inp(0), ctx.inp(1)
    if idx is None or idx.dims is None:
        return [nac("indices rank unknown", t.dtype if t else 0)]
    return [shaped(idx.dims, t.dtype if t else 0)]


@register("GatherND", "ISDOS", "gather")
def gather_nd(ctx: Ctx) -> list:
    t, idx = ctx.inp(0), ctx.inp(1)
    dtype = t.dtype if t else 0
    if t is None or t.dims is None or idx is None or idx.dims is None:
        return [nac("input rank unknown", dtype)]
    b = ctx.attr("batch_dims", 0)
    last = idx.dims[-1]
    if not isinstance(last, int):
        return [nac("GatherND index depth unknown", dtype)]
    return [shaped(idx.dims[:-1] + t.dims[b + last:], dtype)]


@register("ScatterElements ScatterND Scatter TensorScatter", "ISDOS", "scatter")
def scatter(ctx: Ctx) -> list:
    t = ctx.inp(0)
    if t is None:
        return [nac("missing input")]
    return [TensorInfo(t.dims, t.dtype, None, t.reason)]


# ----------------------------------------------------------------- Pad / DepthToSpace / OneHot ...
@register("Pad", "ISVDOS", "pad", values_since=11)
def pad(ctx: Ctx) -> list:
    t = ctx.inp(0)
    dtype = t.dtype if t else 0
    if t is None or t.dims is None:
        return [nac("input rank unknown", dtype)]
    r = len(t.dims)
    pads = ctx.attr("pads", ctx.attr("paddings")) if ctx.opset < 11 else ctx.dim_values(1)
    if pads is None:
        return [shaped((None,) * r, dtype, None, "Pad amounts unknown")]
    axes = list(range(r))
    if ctx.opset >= 18 and ctx.inp(3) is not None:
        ax = ctx.int_values(3)
        if ax is None:
            return [shaped((None,) * r, dtype, None, "Pad axes unknown")]
        axes = [norm_axis(a, r) for a in ax]
    k = len(axes)
    dims = list(t.dims)
    for i, a in enumerate(axes):
        dims[a] = add(add(dims[a], pads[i]), pads[i + k])
    return [shaped(dims, dtype)]


@register("DepthToSpace", "ISDOS", "layout")
def depth_to_space(ctx: Ctx) -> list:
    t = ctx.inp(0)
    b = ctx.attr("blocksize")
    if t is None or t.dims is None or len(t.dims) != 4:
        return [nac("input rank unknown", t.dtype if t else 0)]
    n, c, h, w = t.dims
    return [shaped((n, floordiv(c, b * b), mul(h, b), mul(w, b)), t.dtype)]


@register("SpaceToDepth", "ISDOS", "layout")
def space_to_depth(ctx: Ctx) -> list:
    t = ctx.inp(0)
    b = ctx.attr("blocksize")
    if t is None or t.dims is None or len(t.dims) != 4:
        return [nac("input rank unknown", t.dtype if t else 0)]
    n, c, h, w = t.dims
    return [shaped((n, mul(c, b * b), floordiv(h, b), floordiv(w, b)), t.dtype)]


@register("OneHot", "ISVDOS", "onehot")
def one_hot(ctx: Ctx) -> list:
    idx, depth, values = ctx.inp(0), ctx.values(1), ctx.inp(2)
    dtype = values.dtype if values else 0
    if idx is None or idx.dims is None:
        return [nac("indices rank unknown", dtype)]
    dep = None
    if depth is not None and depth[0] is not None:
        dv = depth[0]
        dep = int(dv) if isinstance(dv, (int, float)) else dv
    r = len(idx.dims) + 1
    axis = norm_axis(ctx.attr("axis", -1), r)
    dims = list(idx.dims)
    dims.insert(axis, dep)
    return [shaped(dims, dtype, None, None if dep is not None else "OneHot depth unknown")]


@register("EyeLike", "ISDO", "generator")
def eye_like(ctx: Ctx) -> list:
    t = ctx.inp(0)
    dt = ctx.attr("dtype", t.dtype if t else 0)
    return [shaped(t.dims if t else None, dt)]


@register("Compress", "EDO", "data-dependent")
def compress(ctx: Ctx) -> list:
    t, c = ctx.inp(0), ctx.inp(1)
    dtype = t.dtype if t else 0
    cv = c.value if c is not None else None
    axis = ctx.attr("axis")
    if t is None or t.dims is None:
        return [nac("input rank unknown", dtype)]
    n = None
    if cv is not None and all(isinstance(x, (bool, int)) for x in cv):
        limit = t.dims[norm_axis(axis, len(t.dims))] if axis is not None else t.numel()
        if isinstance(limit, int):
            n = sum(1 for x in cv[:limit] if x)
    if axis is None:
        return [shaped((n,), dtype, None, None if n is not None else "Compress count depends on data")]
    a = norm_axis(axis, len(t.dims))
    dims = list(t.dims)
    dims[a] = n
    return [shaped(dims, dtype, None, None if n is not None else "Compress count depends on data")]


@register("NonZero", "EDO", "data-dependent")
def nonzero(ctx: Ctx) -> list:
    t = ctx.inp(0)
    if t is None or t.dims is None:
        return [shaped((None, None), TensorProto.INT64, None, "NonZero count depends on data")]
    arr = to_array(t)
    if arr is not None and t.value is not None and all(x is not None and not isinstance(x, Expr) for x in t.value):
        nz = np.nonzero(np.array(arr.tolist(), dtype=float).reshape(arr.shape) if arr.size else np.zeros(arr.shape))
        res = np.array(nz, dtype=np.int64).reshape(len(t.dims), -1)
        return [from_array(res, TensorProto.INT64)]
    return [shaped((len(t.dims), None), TensorProto.INT64, None, "NonZero count depends on data")]


@register("Unique", "EDO", "data-dependent")
def unique(ctx: Ctx) -> list:
    t = ctx.inp(0)
    axis = ctx.attr("axis")
    why = "Unique count depends on data"
    if t is None or t.dims is None:
        return [nac(why) for _ in range(ctx.n_out)]
    arr = to_array(t)
    if arr is not None and t.value is not None and all(isinstance(v, (int, float, bool)) for v in t.value):
        a = np.array(arr.tolist(), dtype=float).reshape(arr.shape)
        ax = None if axis is None else norm_axis(axis, len(t.dims))
        u = np.unique(a, axis=ax) if ax is not None else np.unique(a)
        k = u.shape[ax] if ax is not None else u.size
        ydims = (k,) if ax is None else t.dims[:ax] + (k,) + t.dims[ax + 1:]
        inv_dims = (a.size,) if ax is None else (t.dims[ax],)
        outs = [shaped(ydims, t.dtype), shaped((k,), TensorProto.INT64), shaped(inv_dims, TensorProto.INT64),
                shaped((k,), TensorProto.INT64)]
        return outs[:ctx.n_out]
    if axis is None:
        y = shaped((None,), t.dtype, None, why)
        inv = shaped((t.numel(),), TensorProto.INT64)
    else:
        a_n = norm_axis(axis, len(t.dims))
        y = shaped(t.dims[:a_n] + (None,) + t.dims[a_n + 1:], t.dtype, None, why)
        inv = shaped((t.dims[a_n],), TensorProto.INT64)
    idx = shaped((None,), TensorProto.INT64, None, why)
    return [y, idx, inv, shaped((None,), TensorProto.INT64, None, why)][:ctx.n_out]


@register("NonMaxSuppression", "EDO", "data-dependent")
def nms(ctx: Ctx) -> list:
    return [shaped((None, 3), TensorProto.INT64, None, "number of kept boxes depends on scores")]


@register("TopK", "ISVDOS", "topk", values_since=10)
def topk(ctx: Ctx) -> list:
    t = ctx.inp(0)
    if t is None or t.dims is None:
        return [nac("input rank unknown"), nac("input rank unknown")]
    axis = norm_axis(ctx.attr("axis", -1), len(t.dims))
    if ctx.opset < 10:
        k = ctx.attr("k")
    else:
        kv = ctx.dim_values(1)
        k = kv[0] if kv else None
    dims = list(t.dims)
    dims[axis] = k
    why = None if k is not None else "TopK k unknown"
    return [shaped(dims, t.dtype, None, why), shaped(dims, TensorProto.INT64, None, why)]
