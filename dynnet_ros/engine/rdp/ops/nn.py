"""Neural-network families: conv/pool (window arithmetic), matmul/gemm, normalisation,
recurrent, resize and reductions."""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from dynnet_ros.engine.modelio.onnx_proto import TensorProto

from ..expr import Dim, Expr, add, ceildiv, dmax, dmin, floordiv, is_nonneg, mul, sub
from ..lattice import TensorInfo, nac, shaped
from ..registry import Ctx, ShapeError, register
from ._util import broadcast_dim, broadcast_shapes, norm_axis, same_shape, to_array


# ----------------------------------------------------------------- windows
def window_out(d: Dim, k: int, s: int, dil: int, pb: Dim, pe: Dim, auto_pad: str, ceil_mode: bool,
               pool: bool = False) -> Dim:
    """Output length of a conv/pool window along one axis (onnxruntime's semantics)."""
    dk = (k - 1) * dil + 1
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        if pool and dil != 1:
            return None  # onnxruntime pads for the undilated kernel here, unlike the ONNX spec
        return ceildiv(d, s)
    if auto_pad == "VALID":
        if not pool:
            return ceildiv(sub(d, dk - 1), s)
        pb = pe = 0  # onnxruntime's pools: VALID is NOTSET without padding (ceil_mode included)
    span = add(add(d, pb), pe)
    if not ceil_mode:
        out = add(floordiv(sub(span, dk), s), 1)
        if pool and not is_nonneg(sub(span, dk)):
            # onnxruntime's pools truncate toward zero: a window overhanging the padded input by
            # less than a stride still gives one output (_window requires no more overhang)
            return dmax(out, 1)
        return out
    out = add(ceildiv(sub(span, dk), s), 1)
    # the last window must start inside the (head-padded) input
    if isinstance(out, int) and isinstance(d, int) and isinstance(pb, int):
        return out - 1 if (out - 1) * s >= d + pb else out
    return dmin(out, add(floordiv(sub(add(d, pb), 1), s), 1))


def _window(ctx: Ctx, sp: tuple, kernel: list[int], pool: bool) -> tuple:
    """Output spatial dims of a Conv/pooling window sliding over spatial input dims ``sp``."""
    n_sp = len(kernel)
    strides = ctx.attr("strides") or [1] * n_sp
    dil = ctx.attr("dilations") or [1] * n_sp
    pads = ctx.attr("pads") or [0] * (2 * n_sp)
    auto_pad = ctx.attr("auto_pad", "NOTSET")
    ceil_mode = bool(ctx.attr("ceil_mode", 0)) if pool else False
    if pool and not ceil_mode and auto_pad in ("NOTSET", "VALID"):
        # onnxruntime truncates (not floors) where the window overhangs the padded input: by
        # less than a stride that is one output (window_out); by a stride or more its NCHWc
        # pooling kernels crash the process (SIGFPE), so that shape is refused
        for i in range(n_sp):
            pe = (pads[i] + pads[i + n_sp]) if auto_pad == "NOTSET" else 0
            ctx.require_nonneg(sub(add(sp[i], pe), (kernel[i] - 1) * dil[i] + 1 - (strides[i] - 1)),
                               "pooling window overhangs the padded input by a stride or more")
    return tuple(window_out(sp[i], kernel[i], strides[i], dil[i], pads[i], pads[i + n_sp], auto_pad, ceil_mode, pool)
                 for i in range(n_sp))


@register("Conv ConvInteger QLinearConv DeformConv", "ISDOS", "conv")
def conv(ctx: Ctx) -> list:
    op = ctx.node.op_type
    xi, wi = (0, 3) if op == "QLinearConv" else (0, 1)
    x, w = ctx.inp(xi), ctx.inp(wi)
    dtype = TensorProto.INT32 if op == "ConvInteger" else (x.dtype if x else 0)
    y_zero_point = ctx.inp(7)
    if op == "QLinearConv" and y_zero_point is not None:
        dtype = y_zero_point.dtype
    if x is None or x.dims is None or w is None or w.dims is None:
        return [nac("input or weight rank unknown", dtype)]
    kernel = ctx.attr("kernel_shape") or list(w.dims[2:])
    if not all(isinstance(k, int) for k in kernel):
        return [shaped((x.dims[0], w.dims[0]) + (None,) * (len(x.dims) - 2), dtype, None, "kernel size unknown")]
    group = ctx.attr("group", 1)
    ctx.constrain(x.dims[1], mul(w.dims[1], group), "Conv input channels = weight channels * group")
    sp = _window(ctx, x.dims[2:], kernel, False)
    return [shaped((x.dims[0], w.dims[0]) + sp, dtype)]


@register("ConvTranspose", "ISDOS", "conv")
def conv_transpose(ctx: Ctx) -> list:
    x, w = ctx.inp(0), ctx.inp(1)
    if x is None or x.dims is None or w is None or w.dims is None:
        return [nac("input or weight rank unknown", x.dtype if x else 0)]
    n_sp = len(x.dims) - 2
    kernel = ctx.attr("kernel_shape") or list(w.dims[2:])
    group = ctx.attr("group", 1)
    strides = ctx.attr("strides") or [1] * n_sp
    dil = ctx.attr("dilations") or [1] * n_sp
    outpad = ctx.attr("output_padding") or [0] * n_sp
    out_shape = ctx.attr("output_shape")
    pads = ctx.attr("pads") or [0] * (2 * n_sp)
    auto_pad = ctx.attr("auto_pad", "NOTSET")
    c_out = mul(w.dims[1], group)
    sp: tuple[Dim, ...]
    if out_shape:
        sp = tuple(out_shape[-n_sp:])
    else:
        sp_list: list[Dim] = []
        for i in range(n_sp):
            k = kernel[i]
            if not isinstance(k, int):
                sp_list.append(None)
                continue
            full = add(mul(strides[i], sub(x.dims[2 + i], 1)), outpad[i] + (k - 1) * dil[i] + 1)
            if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
                sp_list.append(mul(x.dims[2 + i], strides[i]))
            else:
                sp_list.append(sub(full, pads[i] + pads[i + n_sp]))
        sp = tuple(sp_list)
    return [shaped((x.dims[0], c_out) + sp, x.dtype)]


@register("AveragePool MaxPool LpPool", "ISDOS", "pool")
def pool(ctx: Ctx) -> list:
    x = ctx.inp(0)
    if x is None or x.dims is None:
        return [nac("input rank unknown", x.dtype if x else 0)] * ctx.n_out
    kernel = ctx.attr("kernel_shape")
    dims = tuple(x.dims[:2]) + _window(ctx, x.dims[2:], kernel, True)
    outs = [shaped(dims, x.dtype)]
    if ctx.n_out > 1:
        outs.append(shaped(dims, TensorProto.INT64))
    return outs


@register("GlobalAveragePool GlobalMaxPool GlobalLpPool", "ISDOS", "pool")
def global_pool(ctx: Ctx) -> list:
    x = ctx.inp(0)
    if x is None or x.dims is None:
        return [nac("input rank unknown", x.dtype if x else 0)]
    return [shaped(tuple(x.dims[:2]) + (1,) * (len(x.dims) - 2), x.dtype)]


@register("MaxRoiPool", "ISDOS", "pool")
def max_roi_pool(ctx: Ctx) -> list:
    x, rois = ctx.inp(0), ctx.inp(1)
    ps = ctx.attr("pooled_shape")
    if x is None or x.dims is None or rois is None or rois.dims is None:
        return [nac("input rank unknown")]
    return [shaped((rois.dims[0], x.dims[1]) + tuple(ps), x.dtype)]


@register("RoiAlign", "ISDOS", "pool")
def roi_align(ctx: Ctx) -> list:
    x, rois = ctx.inp(0), ctx.inp(1)
    if x is None or x.dims is None or rois is None or rois.dims is None:
        return [nac("input rank unknown")]
    return [shaped((rois.dims[0], x.dims[1], ctx.attr("output_height", 1), ctx.attr("output_width", 1)), x.dtype)]


@register("MaxUnpool", "ISVDOS", "pool")
def max_unpool(ctx: Ctx) -> list:
    x = ctx.inp(0)
    if x is None or x.dims is None:
        return [nac("input rank unknown")]
    if ctx.inp(2) is not None:
        v = ctx.dim_values(2)
        if v is None:
            return [shaped((None,) * len(x.dims), x.dtype, None, "MaxUnpool output_shape unknown")]
        return [shaped(v, x.dtype)]
    k = ctx.attr("kernel_shape")
    n = len(k)
    st = ctx.attr("strides") or [1] * n
    pads = ctx.attr("pads") or [0] * (2 * n)
    sp = tuple(sub(add(mul(sub(x.dims[2 + i], 1), st[i]), k[i]), pads[i] + pads[i + n]) for i in range(n))
    return [shaped(tuple(x.dims[:2]) + sp, x.dtype)]


# ----------------------------------------------------------------- matmul / gemm
def matmul_dims(ctx: Ctx, a: tuple, b: tuple) -> tuple:
    if len(a) == 0 or len(b) == 0:
        raise ShapeError("MatMul of a scalar")
    a1, b1 = len(a) == 1, len(b) == 1
    A = (1,) + a if a1 else a
    B = b + (1,) if b1 else b
    ctx.constrain(A[-1], B[-2], "MatMul inner dims")
    batch = broadcast_shapes([A[:-2], B[:-2]], ctx)
    if batch is None:  # only an unranked input gives None, and both are ranked here
        raise TypeError("MatMul batch broadcast of ranked inputs returned no shape")
    out = batch + (A[-2], B[-1])
    if a1:
        out = out[:-2] + out[-1:]
    if b1:
        out = out[:-1]
    return out


@register("MatMul MatMulInteger QLinearMatMul", "ISDOS", "matmul")
def matmul(ctx: Ctx) -> list:
    op = ctx.node.op_type
    ai, bi = (0, 3) if op == "QLinearMatMul" else (0, 1)
    a, b = ctx.inp(ai), ctx.inp(bi)
    dtype = TensorProto.INT32 if op == "MatMulInteger" else (a.dtype if a else 0)
    y_zero_point = ctx.inp(7)
    if op == "QLinearMatMul" and y_zero_point is not None:
        dtype = y_zero_point.dtype
    if a is None or a.dims is None or b is None or b.dims is None:
        return [nac("input rank unknown", dtype)]
    return [shaped(matmul_dims(ctx, a.dims, b.dims), dtype)]


@register("Gemm", "ISDOS", "matmul")
def gemm(ctx: Ctx) -> list:
    a, b = ctx.inp(0), ctx.inp(1)
    if a is None or a.dims is None or b is None or b.dims is None:
        return [nac("input rank unknown")]
    if len(a.dims) != 2 or len(b.dims) != 2:
        return [nac("Gemm needs 2-D inputs")]
    am, ak = (a.dims[1], a.dims[0]) if ctx.attr("transA", 0) else (a.dims[0], a.dims[1])
    bk, bn = (b.dims[1], b.dims[0]) if ctx.attr("transB", 0) else (b.dims[0], b.dims[1])
    ctx.constrain(ak, bk, "Gemm inner dims")
    return [shaped((am, bn), a.dtype)]


@register("Einsum", "ISDOS", "matmul")
def einsum(ctx: Ctx) -> list:
    eq = ctx.attr("equation", "").replace(" ", "")
    ins = ctx.inputs
    if any(t is None or t.dims is None for t in ins):
        return [nac("input rank unknown")]
    lhs, _, rhs = eq.partition("->")
    terms = lhs.split(",")
    letters: dict[str, Dim] = {}
    ell: tuple | None = None
    for term, t in zip(terms, ins):
        n_ell = len(t.dims) - (len(term) - 3 if "..." in term else len(term))
        pos = 0
        i = 0
        while i < len(term):
            if term.startswith("...", i):
                e = t.dims[pos:pos + n_ell]
                ell = e if ell is None else broadcast_shapes([ell, e], ctx)
                pos += n_ell
                i += 3
                continue
            c = term[i]
            d = t.dims[pos]
            if c in letters and letters[c] != d:
                letters[c] = broadcast_dim(letters[c], d, ctx)
            else:
                letters[c] = d
            pos += 1
            i += 1
    if not _:
        # implicit output: ellipsis then letters appearing once, sorted
        counts: dict[str, int] = {}
        for term in terms:
            for c in term.replace("...", ""):
                counts[c] = counts.get(c, 0) + 1
        rhs = ("..." if ell is not None else "") + "".join(sorted(c for c, n in counts.items() if n == 1))
    out: list = []
    i = 0
    while i < len(rhs):
        if rhs.startswith("...", i):
            out.extend(ell or ())
            i += 3
            continue
        out.append(letters.get(rhs[i]))
        i += 1
    return [shaped(out, ins[0].dtype)]


# ----------------------------------------------------------------- normalisation / quantisation
@register("BatchNormalization", "ISDOS", "normalization")
def batch_norm(ctx: Ctx) -> list:
    x = same_shape(ctx)
    outs = [x]
    scale = ctx.inp(1)
    c = scale.dims if scale is not None else None
    if c is not None and len(c) == 1 and x.dims is not None and len(x.dims) >= 2:
        ctx.constrain(x.dims[1], c[0], "BatchNormalization scale has C elements")
    for _ in range(ctx.n_out - 1):
        outs.append(shaped(c, x.dtype) if c is not None else nac("scale rank unknown"))
    return outs


@register("LayerNormalization", "ISDOS", "normalization")
def layer_norm(ctx: Ctx) -> list:
    x = ctx.inp(0)
    out = same_shape(ctx)
    if ctx.n_out == 1:
        return [out]
    if x is None or x.dims is None:
        return [out] + [nac("input rank unknown")] * (ctx.n_out - 1)
    r = len(x.dims)
    axis = norm_axis(ctx.attr("axis", -1), r)
    st = shaped(tuple(x.dims[:axis]) + (1,) * (r - axis), ctx.attr("stash_type", TensorProto.FLOAT))
    return [out] + [st] * (ctx.n_out - 1)


@register("GroupNormalization RMSNormalization QuantizeLinear DequantizeLinear RotaryEmbedding",
          "ISDOS", "normalization")
def same_as_x(ctx: Ctx) -> list:
    x = same_shape(ctx)
    op = ctx.node.op_type
    if op == "QuantizeLinear":
        zp = ctx.inp(2)
        dt = zp.dtype if zp is not None else ctx.attr("output_dtype", TensorProto.UINT8) or TensorProto.UINT8
        return [TensorInfo(x.dims, dt, None, x.reason)]
    if op == "DequantizeLinear":
        sc = ctx.inp(1)
        return [TensorInfo(x.dims, sc.dtype if sc else 0, None, x.reason)]
    return [x]


@register("DynamicQuantizeLinear", "ISDOS", "normalization")
def dyn_quant(ctx: Ctx) -> list:
    x = same_shape(ctx, dtype=TensorProto.UINT8)
    return [x, shaped((), TensorProto.FLOAT), shaped((), TensorProto.UINT8)]


@register("NegativeLogLikelihoodLoss SoftmaxCrossEntropyLoss", "ISDOS", "loss")
def loss(ctx: Ctx) -> list:
    x, tgt = ctx.inp(0), ctx.inp(1)
    red = ctx.attr("reduction", "mean")
    dims = () if red != "none" else (tgt.dims if tgt is not None else None)
    outs = [shaped(dims, x.dtype if x else 0) if dims is not None else nac("target rank unknown")]
    if ctx.n_out > 1:
        outs.append(same_shape(ctx))
    return outs


# ----------------------------------------------------------------- recurrent
@register("RNN GRU LSTM", "ISDOS", "recurrent")
def rnn(ctx: Ctx) -> list:
    x, w = ctx.inp(0), ctx.inp(1)
    if x is None or x.dims is None or len(x.dims) != 3:
        return [nac("input rank unknown") for _ in range(ctx.n_out)]
    layout = ctx.attr("layout", 0)
    seq, batch = (x.dims[1], x.dims[0]) if layout else (x.dims[0], x.dims[1])
    nd = 2 if ctx.attr("direction", "forward") == "bidirectional" else 1
    hidden = ctx.attr("hidden_size")
    if hidden is None and w is not None and w.dims is not None:
        gates = {"RNN": 1, "GRU": 3, "LSTM": 4}[ctx.node.op_type]
        hidden = floordiv(w.dims[1], gates)
    if layout:
        y = (batch, seq, nd, hidden)
        h = (batch, nd, hidden)
    else:
        y = (seq, nd, batch, hidden)
        h = (nd, batch, hidden)
    outs = [shaped(y, x.dtype), shaped(h, x.dtype), shaped(h, x.dtype)]
    return outs[:ctx.n_out]


# ----------------------------------------------------------------- resize
def scale_dim(d: Dim, s: float) -> Dim:
    """floor(d * s) exactly, for the float32 scale s (None when not provable)."""
    if d is None:
        return None
    if isinstance(d, int):
        return int(math.floor(np.float32(d) * np.float32(s))) if not float(s).is_integer() else d * int(s)
    f = Fraction(float(s))
    if f.denominator == 1:
        return mul(d, f.numerator)
    if f.denominator <= 256 and f.numerator <= 1 << 16:
        return floordiv(mul(d, f.numerator), f.denominator)
    return None


@register("Resize Upsample", "ISVDOS", "resize", values_since={"Upsample": 9})
def resize(ctx: Ctx) -> list:
    x = ctx.inp(0)
    if x is None or x.dims is None:
        return [nac("input rank unknown", x.dtype if x else 0)]
    r = len(x.dims)
    op = ctx.node.op_type
    axes = list(range(r))
    if op == "Upsample":
        scales = ctx.attr("scales") if ctx.opset < 9 else ctx.float_values(1)
        sizes = None
    else:
        if ctx.opset >= 18 and ctx.attr("axes") is not None:
            axes = [norm_axis(a, r) for a in ctx.attr("axes")]
        if ctx.opset < 11:
            scales, sizes = ctx.float_values(1), None
        else:
            scales = ctx.float_values(2) if ctx.inp(2) is not None else None
            sizes = ctx.dim_values(3) if ctx.inp(3) is not None else None
            if ctx.inp(2) is not None and scales is None and ctx.inp(3) is None:
                return [shaped((None,) * r, x.dtype, None, "Resize scales unknown")]
            if ctx.inp(3) is not None and sizes is None:
                return [shaped((None,) * r, x.dtype, None, "Resize sizes unknown")]
            if scales is not None and len(scales) == 0:
                scales = None
    dims = list(x.dims)
    if sizes is not None and len(sizes) > 0:
        policy = ctx.attr("keep_aspect_ratio_policy", "stretch")
        if policy != "stretch":
            ins = [x.dims[a] for a in axes]
            if not all(isinstance(v, int) for v in list(ins) + list(sizes)):
                for a in axes:
                    dims[a] = None
                return [shaped(dims, x.dtype, None, "Resize keep_aspect_ratio with symbolic sizes")]
            ratios = [s / d for s, d in zip(sizes, ins)]
            sc = min(ratios) if policy == "not_larger" else max(ratios)
            for a, d in zip(axes, ins):
                dims[a] = int(math.floor(d * sc + 0.5))
            return [shaped(dims, x.dtype)]
        for a, s in zip(axes, sizes):
            dims[a] = s
        return [shaped(dims, x.dtype)]
    if scales is None:
        return [shaped((None,) * r, x.dtype, None, "Resize scales unknown")]
    if len(scales) != len(axes):
        raise ShapeError("Resize scales length mismatch")
    for a, s in zip(axes, scales):
        dims[a] = scale_dim(x.dims[a], s)
    return [shaped(dims, x.dtype, None, None if all(d is not None for d in dims) else "non-dyadic scale")]


# ----------------------------------------------------------------- reductions
REDUCE = ("ReduceL1 ReduceL2 ReduceLogSum ReduceLogSumExp ReduceMax ReduceMean ReduceMin ReduceProd ReduceSum "
          "ReduceSumSquare").split()


@register(REDUCE, "ISVDOS", "reduce", values_since={n: (13 if n == "ReduceSum" else 18) for n in REDUCE})
def reduce(ctx: Ctx) -> list:
    x = ctx.inp(0)
    op = ctx.node.op_type
    if x is None or x.dims is None:
        return [nac("input rank unknown", x.dtype if x else 0)]
    r = len(x.dims)
    keep = ctx.attr("keepdims", 1)
    from_input = ctx.opset >= 18 or (op == "ReduceSum" and ctx.opset >= 13)
    if from_input:
        if ctx.inp(1) is None:
            axes = None
        else:
            axes = ctx.int_values(1)
            if axes is None:
                if keep:
                    return [shaped((None,) * r, x.dtype, None, "Reduce axes unknown")]
                return [nac("Reduce axes unknown", x.dtype)]
    else:
        axes = ctx.attr("axes")
    if not axes:  # absent or empty: all axes, unless noop_with_empty_axes
        if ctx.attr("noop_with_empty_axes", 0) and from_input:
            return [TensorInfo(x.dims, x.dtype, x.value, x.reason)]
        axes = list(range(r))
    ax = {norm_axis(a, r) for a in axes}
    dims = [1 if i in ax else d for i, d in enumerate(x.dims)] if keep else \
        [d for i, d in enumerate(x.dims) if i not in ax]
    val = None
    if x.value is not None and op in ("ReduceProd", "ReduceSum", "ReduceMax", "ReduceMin"):
        arr = to_array(x)
        if arr is not None and all(v is not None for v in x.value) \
                and (arr.size > 0 or op in ("ReduceProd", "ReduceSum")):
            def _num(f, g):
                return lambda a, b: f(a, b) if isinstance(a, Expr) or isinstance(b, Expr) else g(a, b)

            fn = {"ReduceProd": _num(mul, lambda a, b: a * b), "ReduceSum": _num(add, lambda a, b: a + b),
                  "ReduceMax": _num(dmax, max), "ReduceMin": _num(dmin, min)}[op]
            init = {"ReduceProd": 1, "ReduceSum": 0}.get(op)
            res = _reduce_obj(arr, sorted(ax), fn, init, keep)
            if res is not None:
                val = tuple(res.reshape(-1).tolist())
    return [shaped(dims, x.dtype, val)]


def _reduce_obj(arr, axes, fn, init, keep):
    try:
        res = arr
        for a in reversed(axes):
            res = np.apply_along_axis(lambda v: _fold(v, fn, init), a, res) if res.shape[a] else \
                np.full(res.shape[:a] + res.shape[a + 1:], init, dtype=object)
            if keep:
                res = np.expand_dims(res, a)
        return np.asarray(res, dtype=object)
    except (TypeError, ValueError, LookupError, ArithmeticError):  # a value that cannot fold stays unknown
        return None


def _fold(v, fn, init):
    acc = init
    for x in v:
        acc = x if acc is None else fn(acc, x)
    return acc


@register("ArgMax ArgMin", "ISDOS", "reduce")
def argmax(ctx: Ctx) -> list:
    x = ctx.inp(0)
    if x is None or x.dims is None:
        return [nac("input rank unknown", TensorProto.INT64)]
    a = norm_axis(ctx.attr("axis", 0), len(x.dims))
    keep = ctx.attr("keepdims", 1)
    dims = [1 if i == a else d for i, d in enumerate(x.dims)] if keep else \
        [d for i, d in enumerate(x.dims) if i != a]
    return [shaped(dims, TensorProto.INT64)]


@register("Det", "ISDOS", "linalg")
def det(ctx: Ctx) -> list:
    x = ctx.inp(0)
    if x is None or x.dims is None:
        return [nac("input rank unknown")]
    return [shaped(x.dims[:-2], x.dtype)]
