"""onnxruntime's transformer contrib operators (domain ``com.microsoft``) that its transformer
optimiser (``onnxruntime.transformers.optimizer``), its quantiser and the model builders write:
fused attention, skip/embed layer normalisation, GELU variants and rotary embedding. Shapes
follow onnxruntime's CPU kernels (checked against them in test/test_rdp_contrib.py).

Attention caches are ``[batch, heads, total_sequence, head_size]`` (``present_key``/``_value``)
or both stacked ahead of the batch (``present`` of Attention/QAttention); the total sequence is
the past length plus the new one, except GroupQueryAttention, whose cache length is the value of
its ``total_sequence_length`` input (a shape computation, so RDP usually knows it).
"""
from __future__ import annotations

from dynnet_ros.engine.modelio.onnx_proto import TensorProto

from ..expr import Dim, add, dmax, floordiv, mul
from ..lattice import nac, shaped
from ..registry import Ctx, register
from ._util import same_shape
from .nn import layer_norm

MICROSOFT = "com.microsoft"
GPU_ONLY = "no CPU kernel: checked against onnxruntime's symbolic shape inference"


def _head_size(hidden: Dim, heads: int | None) -> Dim:
    return floordiv(hidden, heads) if heads else None


def _unknown(ctx: Ctx, why: str, dtype: int) -> list:
    return [nac(why, dtype) for _ in range(ctx.n_out)]


def _attention(ctx: Ctx, x_i: int, w_i: int, bias_i: int, past_i: int, dtype: int) -> list:
    """Attention/QAttention: input ``[B, S, H_in]`` times the packed QKV weight ``[H_in, Hq+Hk+Hv]``
    gives ``[B, S, Hv]``; ``present`` is ``[2, B, heads, past + S, Hk/heads]``."""
    x, w, bias = ctx.inp(x_i), ctx.inp(w_i), ctx.inp(bias_i)
    if x is None or x.dims is None or len(x.dims) != 3:
        return _unknown(ctx, "Attention input rank unknown", dtype)
    sizes = ctx.attr("qkv_hidden_sizes")
    if sizes:
        hk, hv = sizes[1], sizes[2]
    else:
        packed = bias.dims[0] if bias is not None and bias.dims is not None else (
            w.dims[1] if w is not None and w.dims is not None else None)
        hk = hv = floordiv(packed, 3)
    batch, seq = x.dims[0], x.dims[1]
    outs = [shaped((batch, seq, hv), dtype)]
    if ctx.n_out > 1:
        heads = ctx.attr("num_heads")
        past = ctx.inp(past_i)
        if past is None:
            total: Dim = seq
        elif past.dims is None or len(past.dims) != 5 or ctx.attr("past_present_share_buffer", 0):
            total = None  # a shared buffer keeps its own length, which onnxruntime's CPU kernel does not run
        else:
            total = add(past.dims[3], seq)
        outs.append(shaped((2, batch, heads, total, _head_size(hk, heads)), dtype))
    return outs


@register("Attention", "ISDOS", "attention", domain=MICROSOFT,
          note="present unknown with past_present_share_buffer")
def attention(ctx: Ctx) -> list:
    x = ctx.inp(0)
    return _attention(ctx, 0, 1, 2, 4, x.dtype if x is not None else 0)


@register("QAttention", "ISDOS", "attention", domain=MICROSOFT,
          note="present unknown with past_present_share_buffer")
def qattention(ctx: Ctx) -> list:
    """Attention over quantised input and weight; the float output has input_scale's type."""
    scale = ctx.inp(3)
    return _attention(ctx, 0, 1, 2, 8, scale.dtype if scale is not None and scale.dtype else TensorProto.FLOAT)


@register("MultiHeadAttention", "ISDOS", "attention", domain=MICROSOFT,
          note="packed KV/QKV layouts have no CPU kernel: checked against onnxruntime's symbolic shape inference")
def multi_head_attention(ctx: Ctx) -> list:
    """Query ``[B, S, Hq]`` with key/value ``[B, L, H]`` (or already split into heads,
    ``[B, heads, L, head]``), packed key/value ``[B, L, heads, 2, head]``, or packed QKV query
    ``[B, S, heads, 3, head]``. Outputs: ``[B, S, Hv]``, present key/value
    ``[B, heads, past + L, head]`` and the optional QK scores ``[B, heads, S, past + L]``."""
    query, past = ctx.inp(0), ctx.inp(6)
    dtype = query.dtype if query is not None else 0
    heads = ctx.attr("num_heads")
    q = query.dims if query is not None else None
    k, v = (t.dims if t is not None else () for t in (ctx.inp(1), ctx.inp(2)))  # () = input absent
    if q is None or k is None or v is None:
        return _unknown(ctx, "MultiHeadAttention input rank unknown", dtype)
    batch, seq = q[0], q[1]
    present_length: Dim
    new_length: Dim
    if len(q) == 5:  # packed QKV
        head_k = head_v = q[4]
        out_hidden = mul(q[2], q[4])
        new_length = seq
    elif len(k) == 5:  # packed KV
        head_k = head_v = k[4]
        out_hidden = q[2]
        new_length = k[1]
    elif len(k) == 4 and len(v) == 4:  # key/value already split into heads
        head_k, head_v = k[3], v[3]
        out_hidden = mul(heads, v[3]) if heads else None
        new_length = k[2]
    elif len(k) == 3 and len(v) == 3:
        head_k, head_v = _head_size(k[2], heads), _head_size(v[2], heads)
        out_hidden = v[2]
        new_length = k[1]
    else:
        return _unknown(ctx, "MultiHeadAttention input layout not recognised", dtype)
    if past is None:
        present_length = new_length
    elif past.dims is None or len(past.dims) != 4:
        present_length = None
    else:
        present_length = add(past.dims[2], new_length)
    outs = [shaped((batch, seq, out_hidden), dtype),
            shaped((batch, heads, present_length, head_k), dtype),
            shaped((batch, heads, present_length, head_v), dtype),
            shaped((batch, heads, seq, present_length), dtype)]
    return outs[:ctx.n_out]


@register("DecoderMaskedMultiHeadAttention", "ISDOS", "attention", domain=MICROSOFT,
          note="self-attention QK scores: length = the value of past_sequence_length + 1")
def decoder_masked_multi_head_attention(ctx: Ctx) -> list:
    """One decoding step. Self-attention (key/value ``[B, 1, H]``) writes into the preallocated
    cache ``past_key``/``past_value`` ``[B, heads, max_length, head]``, which present_key/value
    keep; its QK scores cover the past plus this token. Cross-attention reads key/value already
    split into heads, ``[B, heads, L, head]``, and scores ``L`` positions."""
    query, key, value, past = ctx.inp(0), ctx.inp(1), ctx.inp(2), ctx.inp(5)
    dtype = query.dtype if query is not None else 0
    heads = ctx.attr("num_heads")
    if query is None or query.dims is None or len(query.dims) != 3 or not heads:
        return _unknown(ctx, "DecoderMaskedMultiHeadAttention query rank or heads unknown", dtype)
    batch, seq, hidden = query.dims
    k = key.dims if key is not None else None
    v = value.dims if value is not None else None
    scored: Dim
    if k is not None and len(k) == 4:  # cross-attention
        out_hidden = mul(heads, v[3]) if v is not None and len(v) == 4 else None
        scored = k[2]
    else:
        out_hidden = v[2] if v is not None and len(v) == 3 else hidden
        past_length = ctx.dim_values(7)
        scored = add(past_length[0], 1) if past_length is not None and len(past_length) == 1 else None
    cache = shaped(past.dims, dtype) if past is not None and past.dims is not None else nac("no past cache", dtype)
    outs = [shaped((batch, seq, out_hidden), dtype), cache, cache,
            shaped((batch, heads, seq, scored), dtype, None,
                   None if scored is not None else "past_sequence_length value unknown")]
    return outs[:ctx.n_out]


@register("GroupQueryAttention", "ISDOS", "attention", domain=MICROSOFT,
          note="cache length = the value of total_sequence_length (nac where RDP does not know it)")
def group_query_attention(ctx: Ctx) -> list:
    """Query ``[B, S, heads*head]`` (or packed QKV ``[B, S, (heads + 2*kv_heads)*head]``);
    present key/value ``[B, kv_heads, max(past, total), head]`` where ``total`` is the value of
    input 6; the optional QK scores are ``[B, heads, S, total]``."""
    q, k, past = ctx.inp(0), ctx.inp(1), ctx.inp(3)
    dtype = q.dtype if q is not None else 0
    heads, kv_heads = ctx.attr("num_heads"), ctx.attr("kv_num_heads")
    if q is None or q.dims is None or len(q.dims) != 3 or not heads or not kv_heads:
        return _unknown(ctx, "GroupQueryAttention input rank or heads unknown", dtype)
    batch, seq = q.dims[0], q.dims[1]
    head = floordiv(q.dims[2], heads if k is not None else heads + 2 * kv_heads)
    total_values = ctx.dim_values(6)
    total = total_values[0] if total_values is not None and len(total_values) == 1 else None
    if past is None:
        cache: Dim = total
    elif past.dims is None or len(past.dims) != 4:
        cache = None
    else:
        cache = dmax(past.dims[2], total) if total is not None else None
    reason = None if total is not None else "GroupQueryAttention total_sequence_length value unknown"
    outs = [shaped((batch, seq, mul(heads, head)), dtype),
            shaped((batch, kv_heads, cache, head), dtype, None, reason if cache is None else None),
            shaped((batch, kv_heads, cache, head), dtype, None, reason if cache is None else None),
            shaped((batch, heads, seq, total), dtype, None, reason)]
    return outs[:ctx.n_out]


@register("SkipLayerNormalization SkipSimplifiedLayerNormalization", "ISDOS", "normalization",
          domain=MICROSOFT)
def skip_layer_norm(ctx: Ctx) -> list:
    """Outputs: the normalised sum, its mean and inverse std dev over the last axis
    (``[..., 1]``, float) and the sum itself (input + skip + bias)."""
    out = same_shape(ctx)
    x = ctx.inp(0)
    if x is None or x.dims is None:
        stats = nac("input rank unknown", TensorProto.FLOAT)
    else:
        stats = shaped(tuple(x.dims[:-1]) + (1,), TensorProto.FLOAT)
    return [out, stats, stats, out][:ctx.n_out]


# onnxruntime registers SimplifiedLayerNormalization (RMS norm) in the default domain
register("SimplifiedLayerNormalization", "ISDOS", "normalization")(layer_norm)


@register("EmbedLayerNormalization", "ISDOS", "normalization", domain=MICROSOFT)
def embed_layer_norm(ctx: Ctx) -> list:
    """input_ids ``[B, S]`` and word embedding ``[vocab, H]`` give ``[B, S, H]``; the mask index
    is ``[B]`` int32; the optional embedding sum has the output's shape."""
    ids, word = ctx.inp(0), ctx.inp(2)
    dtype = word.dtype if word is not None else 0
    if ids is None or ids.dims is None or len(ids.dims) != 2 or word is None or word.dims is None:
        return [nac("input rank unknown", dtype), nac("input rank unknown", TensorProto.INT32),
                nac("input rank unknown", dtype)][:ctx.n_out]
    out = shaped(tuple(ids.dims) + (word.dims[-1],), dtype)
    return [out, shaped((ids.dims[0],), TensorProto.INT32), out][:ctx.n_out]


@register("BiasAdd", "ISDOS", "elementwise", domain=MICROSOFT, note=GPU_ONLY)
def bias_add(ctx: Ctx) -> list:
    return [same_shape(ctx)]


@register("BiasSplitGelu", "ISDOS", "elementwise", domain=MICROSOFT, note=GPU_ONLY)
def bias_split_gelu(ctx: Ctx) -> list:
    """``[N, HW, D]`` plus bias ``[D]``, split in halves along D and gated: ``[N, HW, D/2]``."""
    x = ctx.inp(0)
    if x is None or x.dims is None or len(x.dims) != 3:
        return [nac("input rank unknown", x.dtype if x else 0)]
    return [shaped((x.dims[0], x.dims[1], floordiv(x.dims[2], 2)), x.dtype)]


@register("RotaryEmbedding", "ISDOS", "normalization", domain=MICROSOFT)
def rotary_embedding(ctx: Ctx) -> list:
    return [same_shape(ctx)]
