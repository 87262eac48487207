"""Generators, signal processing, strings, image ops and attention."""
from __future__ import annotations

from dynnet_ros.engine.modelio.onnx_proto import TensorProto

from ..expr import Dim, add, exact_div, floordiv, mul, sub
from ..lattice import nac, shaped
from ..registry import Ctx, register
from ._util import norm_axis, same_shape


@register("RandomUniform RandomNormal", "ISDOS", "generator", note="shape from the attribute")
def random_gen(ctx: Ctx) -> list:
    return [shaped(tuple(ctx.attr("shape")), ctx.attr("dtype", TensorProto.FLOAT))]


@register("Multinomial", "ISDOS", "generator")
def multinomial(ctx: Ctx) -> list:
    x = ctx.inp(0)
    b = x.dims[0] if x is not None and x.dims is not None else None
    return [shaped((b, ctx.attr("sample_size", 1)), ctx.attr("dtype", TensorProto.INT32))]


@register("HannWindow HammingWindow BlackmanWindow", "ISVDOS", "signal")
def window(ctx: Ctx) -> list:
    v = ctx.dim_values(0)
    n = v[0] if v else None
    return [shaped((n,), ctx.attr("output_datatype", TensorProto.FLOAT), None,
                   None if n is not None else "window size unknown")]


@register("MelWeightMatrix", "ISVDOS", "signal")
def mel(ctx: Ctx) -> list:
    nb, dft = ctx.dim_values(0), ctx.dim_values(1)
    a = nb[0] if nb else None
    d = dft[0] if dft else None
    return [shaped((add(floordiv(d, 2), 1) if d is not None else None, a),
                   ctx.attr("output_datatype", TensorProto.FLOAT))]


@register("DFT", "ISVDOS", "signal")
def dft(ctx: Ctx) -> list:
    x = ctx.inp(0)
    if x is None or x.dims is None:
        return [nac("input rank unknown")]
    r = len(x.dims)
    if ctx.opset >= 20:
        av = ctx.int_values(2) if ctx.inp(2) is not None else [-2]
        if av is None:
            return [shaped((None,) * r, x.dtype, None, "DFT axis unknown")]
        axis = norm_axis(av[0], r)
    else:
        axis = norm_axis(ctx.attr("axis", 1), r)
    dims = list(x.dims)
    n = dims[axis]
    given = ctx.inp(1) is not None
    if given:
        lv = ctx.dim_values(1)
        n = lv[0] if lv else None
    onesided, inverse = ctx.attr("onesided", 0), ctx.attr("inverse", 0)
    if onesided and not inverse:
        n = add(floordiv(n, 2), 1) if n is not None else None
        dims[-1] = 2
    elif onesided and inverse:
        if not given:
            n = mul(sub(n, 1), 2) if n is not None else None
        dims[-1] = 1
    else:
        dims[-1] = 2
    dims[axis] = n
    return [shaped(dims, x.dtype)]


@register("STFT", "ISVDOS", "signal")
def stft(ctx: Ctx) -> list:
    x = ctx.inp(0)
    if x is None or x.dims is None:
        return [nac("input rank unknown")]
    steps = ctx.dim_values(1)
    step = steps[0] if steps else None
    win = ctx.inp(2)
    if ctx.inp(3) is not None:
        fl = ctx.dim_values(3)
        flen = fl[0] if fl else None
    elif win is not None and win.dims is not None:
        flen = win.dims[0]
    else:
        flen = None
    frames = None
    if flen is not None and isinstance(step, int) and step > 0:
        frames = add(floordiv(sub(x.dims[1], flen), step), 1)
    bins = flen
    if ctx.attr("onesided", 1) and flen is not None:
        bins = add(floordiv(flen, 2), 1)
    return [shaped((x.dims[0], frames, bins, 2), x.dtype)]


@register("Col2Im", "ISVDOS", "image")
def col2im(ctx: Ctx) -> list:
    x = ctx.inp(0)
    img = ctx.dim_values(1)
    blk = ctx.dim_values(2)
    if x is None or x.dims is None or img is None or blk is None:
        return [nac("Col2Im shapes unknown")]
    n: Dim = 1
    for b in blk:
        n = mul(n, b)
    return [shaped((x.dims[0], exact_div(x.dims[1], n)) + tuple(img), x.dtype)]


@register("CenterCropPad", "ISVDOS", "image")
def center_crop_pad(ctx: Ctx) -> list:
    x = ctx.inp(0)
    v = ctx.dim_values(1)
    if x is None or x.dims is None:
        return [nac("input rank unknown")]
    r = len(x.dims)
    axes = [norm_axis(a, r) for a in (ctx.attr("axes") or range(r))]
    dims = list(x.dims)
    if v is None:
        for a in axes:
            dims[a] = None
        return [shaped(dims, x.dtype, None, "crop shape unknown")]
    for a, s in zip(axes, v):
        dims[a] = s
    return [shaped(dims, x.dtype)]


@register("AffineGrid", "ISVDOS", "image")
def affine_grid(ctx: Ctx) -> list:
    th = ctx.inp(0)
    size = ctx.dim_values(1)
    if size is None:
        return [nac("AffineGrid size unknown")]
    if len(size) == 4:
        n, _, h, w = size
        return [shaped((n, h, w, 2), th.dtype if th else 0)]
    n, _, d, h, w = size
    return [shaped((n, d, h, w, 3), th.dtype if th else 0)]


@register("GridSample", "ISDOS", "image")
def grid_sample(ctx: Ctx) -> list:
    x, g = ctx.inp(0), ctx.inp(1)
    if x is None or x.dims is None or g is None or g.dims is None:
        return [nac("input rank unknown")]
    return [shaped((x.dims[0], x.dims[1]) + tuple(g.dims[1:-1]), x.dtype)]


@register("ImageDecoder", "EDO", "image")
def image_decoder(ctx: Ctx) -> list:
    c = 1 if ctx.attr("pixel_format", "RGB") == "Grayscale" else 3
    return [shaped((None, None, c), TensorProto.UINT8, None, "image size is in the encoded bytes")]


@register("TfIdfVectorizer", "ISDOS", "string")
def tfidf(ctx: Ctx) -> list:
    x = ctx.inp(0)
    n = max(ctx.attr("ngram_indexes", [-1])) + 1
    if x is None or x.dims is None:
        return [nac("input rank unknown")]
    return [shaped((n,) if len(x.dims) == 1 else (x.dims[0], n), TensorProto.FLOAT)]


@register("StringNormalizer", "EDO", "string", note="stop-word removal changes the length")
def string_normalizer(ctx: Ctx) -> list:
    x = ctx.inp(0)
    if x is None or x.dims is None:
        return [nac("input rank unknown")]
    dims = list(x.dims)
    if ctx.attr("stopwords"):
        dims[-1] = None
        if not dims:
            dims = [None]
    return [shaped(dims, TensorProto.STRING, None, "stop words removed depend on data")]


@register("StringSplit", "EDO", "string")
def string_split(ctx: Ctx) -> list:
    x = ctx.inp(0)
    if x is None or x.dims is None:
        return [nac("input rank unknown"), nac("input rank unknown")]
    return [shaped(tuple(x.dims) + (None,), TensorProto.STRING, None, "number of substrings depends on data"),
            shaped(x.dims, TensorProto.INT64)]


@register("SwiGLU", "ISDOS", "elementwise unary")
def swiglu(ctx: Ctx) -> list:
    a, b = ctx.inp(0), ctx.inp(1)
    if a is not None and b is not None and a.dims is not None and b.dims is not None and len(a.dims) == len(b.dims):
        for x, y in zip(a.dims, b.dims):
            ctx.constrain(x, y, "SwiGLU inputs have identical shapes")
    return [same_shape(ctx)]


@register("CausalConvWithState", "ISDOS", "conv")
def causal_conv(ctx: Ctx) -> list:
    x, w = ctx.inp(0), ctx.inp(1)
    out = same_shape(ctx)
    if x is None or x.dims is None or w is None or w.dims is None:
        return [out, nac("input rank unknown")]
    return [out, shaped((x.dims[0], x.dims[1], sub(w.dims[2], 1)), x.dtype)]


@register("LinearAttention", "ISDOS", "attention")
def linear_attention(ctx: Ctx) -> list:
    q, k, v = ctx.inp(0), ctx.inp(1), ctx.inp(2)
    hq, hkv = ctx.attr("q_num_heads"), ctx.attr("kv_num_heads")
    if q is None or q.dims is None or k is None or k.dims is None or v is None or v.dims is None \
            or not hq or not hkv:
        return [nac("input rank unknown"), nac("input rank unknown")]
    dv = exact_div(v.dims[2], hkv)
    dk = exact_div(k.dims[2], hkv)
    return [shaped((q.dims[0], q.dims[1], mul(dv, hq)), q.dtype), shaped((q.dims[0], hkv, dk, dv), q.dtype)]


@register("Attention", "ISDOS", "attention")
def attention(ctx: Ctx) -> list:
    q, k, v = ctx.inp(0), ctx.inp(1), ctx.inp(2)
    if q is None or q.dims is None or k is None or k.dims is None or v is None or v.dims is None:
        return [nac("input rank unknown") for _ in range(ctx.n_out)]
    hq, hkv = ctx.attr("q_num_heads"), ctx.attr("kv_num_heads")
    if len(q.dims) == 4:
        b, hq, sq, _ = q.dims
        _, hkv, skv, dk = k.dims
        dv = v.dims[3]
        y: tuple[Dim, ...] = (b, hq, sq, dv)
    else:
        b, sq = q.dims[0], q.dims[1]
        skv = k.dims[1]
        dk = exact_div(k.dims[2], hkv) if hkv else None
        dv = exact_div(v.dims[2], hkv) if hkv else None
        y = (b, sq, mul(hq, dv) if hq and dv is not None else None)
    past = ctx.inp(4)
    total = skv
    if past is not None:
        total = add(past.dims[2], skv) if past.dims is not None else None
    outs = [shaped(y, q.dtype), shaped((b, hkv, total, dk), q.dtype), shaped((b, hkv, total, dv), q.dtype),
            shaped((b, hq, sq, total), q.dtype)]
    return outs[:ctx.n_out]
