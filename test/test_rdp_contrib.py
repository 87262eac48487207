"""RDP on onnxruntime's com.microsoft contrib operators, against onnxruntime's CPU kernels.

Tiny models built with onnx.helper, one per operator family, with symbolic input dims, run in
onnxruntime at three input sizes with every intermediate exposed (test_rdp_agreement's
protocol): every tensor's RDP expression, evaluated at the inputs, must equal the runtime shape
(0 wrong, 0 nac). The few contrib ops onnxruntime has no CPU kernel for (BiasAdd,
BiasSplitGelu, NhwcConv) are checked against onnxruntime's own symbolic shape inference at
concrete shapes instead. Then real quantised/transformer graphs: onnxruntime's quantize_dynamic
of an LSTM/MatMul/Conv model and its transformer optimiser's fusion of a small BERT encoder.
"""
from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
import sympy
from onnx import TensorProto, helper, numpy_helper
from test_rdp_agreement import Tally, compare

from dynnet_ros.engine.rdp import analyze
from dynnet_ros.engine.rdp.fixpoint import RDPWarning

MS = "com.microsoft"
F, U8, I8, I32, I64 = TensorProto.FLOAT, TensorProto.UINT8, TensorProto.INT8, TensorProto.INT32, TensorProto.INT64


def _init(name: str, arr) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(arr), name)


def _model(nodes, inputs, outputs, inits, opset: int = 17) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "contrib", [helper.make_tensor_value_info(n, t, d) for n, t, d in inputs],
                          [helper.make_tensor_value_info(n, t, None) for n, t in outputs], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)],
                             ir_version=8)


def _n(op, ins, outs, **attrs):
    return helper.make_node(op, ins, outs, domain=MS, **attrs)


def _rng_u8(shape, rng):
    return rng.integers(0, 255, shape)


def dynamic_quant_model() -> onnx.ModelProto:
    """DynamicQuantizeLinear (standard) feeding MatMulInteger, MatMulIntegerToFloat,
    DynamicQuantizeMatMul, MatMulInteger16 and QGemm."""
    r = np.random.default_rng(1)
    inits = [_init("wq", r.integers(0, 255, (16, 8)).astype(np.uint8)), _init("wzp", np.uint8(128)),
             _init("ws", np.float32(0.02)), _init("bias", np.zeros(8, np.float32)),
             _init("w16", r.integers(-9, 9, (16, 8)).astype(np.int16)),
             _init("wqt", r.integers(0, 255, (8, 16)).astype(np.uint8)), _init("ys", np.float32(0.1)),
             _init("yzp", np.uint8(3)), _init("bias32", np.zeros(8, np.int32)),
             _init("flat", np.array([-1, 16], np.int64))]
    nodes = [
        helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xzp"]),
        helper.make_node("MatMulInteger", ["xq", "wq", "xzp", "wzp"], ["mmi"]),
        _n("MatMulIntegerToFloat", ["xq", "wq", "xs", "ws", "xzp", "wzp", "bias"], ["mmitf"]),
        _n("DynamicQuantizeMatMul", ["x", "wq", "ws", "wzp", "bias"], ["dqmm"]),
        helper.make_node("Cast", ["xq"], ["x16"], to=TensorProto.INT16),
        _n("MatMulInteger16", ["x16", "w16"], ["mm16"]),
        helper.make_node("Reshape", ["xq", "flat"], ["x2d"]),
        _n("QGemm", ["x2d", "xs", "xzp", "wqt", "ws", "wzp", "", "ys", "yzp"], ["qgemm_q"], transB=1),
        _n("QGemm", ["x2d", "xs", "xzp", "wq", "ws", "wzp", "bias32"], ["qgemm_f"]),
    ]
    return _model(nodes, [("x", F, ["B", "S", 16])], [("mmitf", F), ("dqmm", F), ("qgemm_q", U8), ("qgemm_f", F),
                                                     ("mmi", I32), ("mm16", I32)], inits)


def qlinear_model(channels_last: bool) -> onnx.ModelProto:
    """The QDQ→QOperator ops of static quantisation on an image: QuantizeLinear, QLinearConv,
    QLinearAdd/Mul (broadcast), QLinearSigmoid, QLinearLeakyRelu, QLinearAveragePool,
    QLinearConcat, QLinearWhere, QLinearGlobalAveragePool, QLinearSoftmax, DequantizeLinear."""
    r = np.random.default_rng(2)
    c_axis = -1 if channels_last else 1
    w = r.integers(0, 255, (8, 3, 3, 3)).astype(np.uint8)
    cvec = (1, 1, 1, 8) if channels_last else (1, 8, 1, 1)
    inits = [_init("s", np.float32(0.05)), _init("zp", np.uint8(128)), _init("w", w), _init("ws", np.float32(0.01)),
             _init("wzp", np.uint8(128)), _init("cb", r.integers(0, 255, cvec).astype(np.uint8)),
             _init("cond", np.array([True, False] * 4).reshape(cvec))]
    cl = {"channels_last": 1} if channels_last else {}
    nodes = [
        _n("QuantizeLinear", ["x", "s", "zp"], ["xq"]),
        _n("QLinearConv", ["xq", "s", "zp", "w", "ws", "wzp", "s", "zp"], ["conv"], kernel_shape=[3, 3],
           strides=[2, 2], pads=[1, 1, 1, 1], **cl),
        _n("QLinearAdd", ["conv", "s", "zp", "cb", "s", "zp", "s", "zp"], ["add"]),
        _n("QLinearMul", ["add", "s", "zp", "cb", "s", "zp", "s", "zp"], ["mul"]),
        _n("QLinearSigmoid", ["mul", "s", "zp", "s", "zp"], ["sig"]),
        _n("QLinearLeakyRelu", ["sig", "s", "zp", "s", "zp"], ["lrelu"], alpha=0.1),
        _n("QLinearAveragePool", ["lrelu", "s", "zp", "s", "zp"], ["apool"], kernel_shape=[2, 2], strides=[2, 2],
           ceil_mode=1, **cl),
        _n("QLinearGlobalAveragePool", ["apool", "s", "zp", "s", "zp"], ["gap"], **cl),
        _n("QLinearConcat", ["s", "zp", "conv", "s", "zp", "lrelu", "s", "zp"], ["cat"], axis=c_axis),
        _n("QLinearWhere", ["cond", "conv", "s", "zp", "cb", "s", "zp", "s", "zp"], ["where"]),
        _n("QLinearSoftmax", ["gap", "s", "zp", "s", "zp"], ["smax"], axis=-1, opset=13),
        _n("DequantizeLinear", ["cat", "s", "zp"], ["out"]),
    ]
    x_dims = ["N", "H", "W", 3] if channels_last else ["N", 3, "H", "W"]
    return _model(nodes, [("x", F, x_dims)], [("out", F), ("smax", U8), ("where", U8)], inits)


def dynamic_quantize_lstm_model(direction: str) -> onnx.ModelProto:
    nd, inp, hid = (2 if direction == "bidirectional" else 1), 6, 5
    r = np.random.default_rng(3)
    inits = [_init("w", r.integers(-50, 50, (nd, inp, 4 * hid)).astype(np.int8)),
             _init("r", r.integers(-50, 50, (nd, hid, 4 * hid)).astype(np.int8)),
             _init("b", np.zeros((nd, 8 * hid), np.float32)), _init("ws", np.full(nd, 0.01, np.float32)),
             _init("wzp", np.zeros(nd, np.int8)), _init("rs", np.full(nd, 0.01, np.float32)),
             _init("rzp", np.zeros(nd, np.int8))]
    nodes = [_n("DynamicQuantizeLSTM", ["x", "w", "r", "b", "", "", "", "", "ws", "wzp", "rs", "rzp"],
                ["y", "y_h", "y_c"], direction=direction, hidden_size=hid)]
    return _model(nodes, [("x", F, ["S", "B", inp])], [("y", F), ("y_h", F), ("y_c", F)], inits)


def attention_model() -> onnx.ModelProto:
    """Attention (with and without a past cache, and with qkv_hidden_sizes), QAttention,
    MultiHeadAttention (separate, head-split and packed key/value, with a past), Skip(Simplified)
    LayerNormalization, SimplifiedLayerNormalization, FastGelu/BiasGelu/Gelu/QuickGelu, MatMulNBits,
    RotaryEmbedding, FusedMatMul and FusedConv."""
    r = np.random.default_rng(4)
    d, heads = 16, 2
    f32 = np.float32
    inits = [_init("w", r.standard_normal((d, 3 * d)).astype(f32)), _init("b", np.zeros(3 * d, f32)),
             _init("w_uneven", r.standard_normal((d, 40)).astype(f32)), _init("b_uneven", np.zeros(40, f32)),
             _init("wq8", r.integers(0, 255, (d, 3 * d)).astype(np.uint8)), _init("one", f32(0.02)),
             _init("zp", np.uint8(128)), _init("gamma", np.ones(d, f32)), _init("beta", np.zeros(d, f32)),
             _init("bias", np.zeros(d, f32)),
             _init("nbits_b", r.integers(0, 255, (8, 1, 8)).astype(np.uint8)), _init("nbits_s", np.ones(8, f32)),
             _init("cos", np.ones((64, 4), f32)), _init("sin", np.zeros((64, 4), f32)),
             _init("convw", r.standard_normal((4, 3, 3, 3)).astype(f32)),
             _init("ax2", np.array([2], np.int64)), _init("two", np.array([2], np.int64))]
    nodes = [
        _n("Attention", ["x", "w", "b"], ["att", "present"], num_heads=heads),
        _n("Attention", ["x", "w", "b", "", "past"], ["att_past", "present_past"], num_heads=heads),
        _n("Attention", ["x", "w_uneven", "b_uneven"], ["att_uneven"], num_heads=heads, qkv_hidden_sizes=[16, 16, 8]),
        helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xzp"]),
        _n("QAttention", ["xq", "wq8", "b", "xs", "one", "", "xzp", "zp"], ["qatt"], num_heads=heads),
        _n("MultiHeadAttention", ["x", "kv", "kv", "", "", "", "past_k", "past_k"], ["mha", "mha_k", "mha_v", "mha_qk"],
           num_heads=heads),
        _n("MultiHeadAttention", ["x", "kv", "v8"], ["mha_v8"], num_heads=heads),
        _n("MultiHeadAttention", ["x", "past_k", "past_k"], ["mha_split", "mha_split_k", "mha_split_v"],
           num_heads=heads),
        _n("SkipLayerNormalization", ["att", "x", "gamma", "beta", "bias"], ["sln", "sln_mean", "sln_inv", "sln_sum"]),
        _n("SkipSimplifiedLayerNormalization", ["att", "x", "gamma", "bias"], ["ssln", "ssln_mean", "ssln_inv",
                                                                               "ssln_sum"]),
        helper.make_node("SimplifiedLayerNormalization", ["sln", "gamma"], ["rms", "rms_inv"], axis=-1),
        _n("FastGelu", ["rms", "bias"], ["fgelu"]),
        _n("BiasGelu", ["fgelu", "bias"], ["bgelu"]),
        _n("Gelu", ["bgelu"], ["gelu"]),
        _n("QuickGelu", ["gelu"], ["qgelu"], alpha=1.702),
        _n("MatMulNBits", ["qgelu", "nbits_b", "nbits_s"], ["nbits"], K=d, N=8, bits=4, block_size=16),
        _n("RotaryEmbedding", ["qgelu", "pos", "cos", "sin"], ["rot"], num_heads=heads),
        _n("FusedMatMul", ["rot", "x"], ["fmm"], transB=1, alpha=0.5),
        _n("FusedConv", ["img", "convw"], ["fconv"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
           activation="Relu"),
    ]
    inputs = [("x", F, ["B", "S", d]), ("past", F, [2, "B", heads, "P", d // heads]), ("kv", F, ["B", "L", d]),
              ("v8", F, ["B", "L", 8]), ("past_k", F, ["B", heads, "P", d // heads]), ("pos", I64, ["B", "S"]),
              ("img", F, ["B", 3, "H", "W"])]
    outs = [(name, F) for name in ("present", "present_past", "att_uneven", "qatt", "mha", "mha_k", "mha_v", "mha_qk",
                                   "mha_v8", "mha_split", "mha_split_k", "sln_mean", "sln_inv", "sln_sum", "ssln",
                                   "ssln_mean", "ssln_inv", "ssln_sum", "rms_inv", "nbits", "fmm", "fconv")]
    return _model(nodes, inputs, outs, inits)


def gqa_model() -> onnx.ModelProto:
    """GroupQueryAttention with a past cache and with packed QKV; its total_sequence_length and
    seqlens_k are computed in the graph from shapes, as exporters do."""
    d, heads, kv_heads, head = 32, 4, 2, 8
    inits = [_init("i1", np.array([1], np.int64)), _init("i2", np.array([2], np.int64)),
             _init("i0", np.array([0], np.int64))]
    n = helper.make_node
    nodes = [
        n("Shape", ["q"], ["qs"]), n("Shape", ["past_k"], ["ps"]),
        n("Gather", ["qs", "i1"], ["s1"]), n("Gather", ["ps", "i2"], ["p1"]), n("Gather", ["qs", "i0"], ["b1"]),
        n("Add", ["s1", "p1"], ["t1"]), n("Squeeze", ["t1"], ["t64"]),
        n("Cast", ["t64"], ["total"], to=I32),
        n("Sub", ["t1", "i1"], ["t_minus_1"]), n("Expand", ["t_minus_1", "b1"], ["sk64"]),
        n("Cast", ["sk64"], ["seqlens"], to=I32),
        n("Squeeze", ["s1"], ["s64"]), n("Cast", ["s64"], ["total_new"], to=I32),
        n("Sub", ["s1", "i1"], ["s_minus_1"]), n("Expand", ["s_minus_1", "b1"], ["skn64"]),
        n("Cast", ["skn64"], ["seqlens_new"], to=I32),
        _n("GroupQueryAttention", ["q", "k", "v", "past_k", "past_k", "seqlens", "total"],
           ["gqa", "present_k", "present_v", "gqa_qk"], num_heads=heads, kv_num_heads=kv_heads, qk_output=1),
        _n("GroupQueryAttention", ["qkv", "", "", "", "", "seqlens_new", "total_new"],
           ["gqa_packed", "present_k2", "present_v2"], num_heads=heads, kv_num_heads=kv_heads),
    ]
    inputs = [("q", F, ["B", "S", d]), ("k", F, ["B", "S", kv_heads * head]), ("v", F, ["B", "S", kv_heads * head]),
              ("past_k", F, ["B", kv_heads, "P", head]), ("qkv", F, ["B", "S", (heads + 2 * kv_heads) * head])]
    outs = [("gqa", F), ("present_k", F), ("present_v", F), ("gqa_qk", F), ("gqa_packed", F), ("present_k2", F),
            ("present_v2", F)]
    return _model(nodes, inputs, outs, inits)


def gqa_static_cache_model() -> onnx.ModelProto:
    """GroupQueryAttention writing into a preallocated cache of ``M`` positions, with
    ``total_sequence_length = S + 3`` (the tokens so far): the cache keeps its length."""
    inits = [_init("i1", np.array([1], np.int64)), _init("i0", np.array([0], np.int64)),
             _init("three", np.array([3], np.int64))]
    n = helper.make_node
    nodes = [n("Shape", ["q"], ["qs"]), n("Gather", ["qs", "i1"], ["s1"]), n("Gather", ["qs", "i0"], ["b1"]),
             n("Add", ["s1", "three"], ["t1"]), n("Squeeze", ["t1"], ["t64"]), n("Cast", ["t64"], ["total"], to=I32),
             n("Sub", ["t1", "i1"], ["tm1"]), n("Expand", ["tm1", "b1"], ["sk"]),
             n("Cast", ["sk"], ["seqlens"], to=I32),
             _n("GroupQueryAttention", ["q", "k", "v", "cache", "cache", "seqlens", "total"], ["o", "pk", "pv"],
                num_heads=2, kv_num_heads=1)]
    return _model(nodes, [("q", F, ["B", "S", 16]), ("k", F, ["B", "S", 8]), ("v", F, ["B", "S", 8]),
                          ("cache", F, ["B", 1, "M", 8])], [("o", F), ("pk", F), ("pv", F)], inits)


def decoder_step_model() -> onnx.ModelProto:
    """DecoderMaskedMultiHeadAttention as whisper/T5 decoders use it: self-attention into a
    preallocated cache of ``M`` positions (3 of them filled) and cross-attention over ``L``
    encoder positions, both with their QK scores."""
    inits = [_init("filled", np.array([3], np.int32))]
    nodes = [_n("DecoderMaskedMultiHeadAttention", ["q", "k", "v", "", "", "cache_k", "cache_v", "filled"],
                ["self_out", "present_k", "present_v", "self_qk"], num_heads=2, past_present_share_buffer=1,
                output_qk=1),
             _n("DecoderMaskedMultiHeadAttention", ["q", "enc_k", "enc_v"], ["cross_out", "", "", "cross_qk"],
                num_heads=2, output_qk=1)]
    inputs = [("q", F, ["B", 1, 16]), ("k", F, ["B", 1, 16]), ("v", F, ["B", 1, 16]),
              ("cache_k", F, ["B", 2, "M", 8]), ("cache_v", F, ["B", 2, "M", 8]),
              ("enc_k", F, ["B", 2, "L", 8]), ("enc_v", F, ["B", 2, "L", 8])]
    return _model(nodes, inputs, [("self_out", F), ("self_qk", F), ("cross_out", F), ("cross_qk", F)], inits)


def embed_model() -> onnx.ModelProto:
    """EmbedLayerNormalization (BERT's fused embeddings) and its quantised form."""
    r = np.random.default_rng(5)
    f32 = np.float32
    inits = [_init("word", r.standard_normal((30, 16)).astype(f32)),
             _init("posemb", r.standard_normal((64, 16)).astype(f32)),
             _init("seg", r.standard_normal((2, 16)).astype(f32)), _init("gamma", np.ones(16, f32)),
             _init("beta", np.zeros(16, f32)),
             _init("word_q", r.integers(0, 255, (30, 16)).astype(np.uint8)),
             _init("pos_q", r.integers(0, 255, (64, 16)).astype(np.uint8)),
             _init("seg_q", r.integers(0, 255, (2, 16)).astype(np.uint8)),
             _init("g_q", np.full(16, 200, np.uint8)), _init("b_q", np.full(16, 128, np.uint8)),
             _init("sc", f32(0.01)), _init("zp", np.uint8(128))]
    nodes = [_n("EmbedLayerNormalization", ["ids", "segs", "word", "posemb", "seg", "gamma", "beta", "mask"],
                ["emb", "mask_index", "emb_sum"]),
             _n("QEmbedLayerNormalization", ["ids", "segs", "word_q", "pos_q", "seg_q", "g_q", "b_q", "mask",
                                             "sc", "sc", "sc", "sc", "sc", "zp", "zp", "zp", "zp", "zp"],
                ["qemb", "qmask_index"])]
    return _model(nodes, [("ids", I32, ["B", "S"]), ("segs", I32, ["B", "S"]), ("mask", I32, ["B", "S"])],
                  [("emb", F), ("mask_index", I32), ("emb_sum", F), ("qemb", F), ("qmask_index", I32)], inits)


def legacy_model() -> onnx.ModelProto:
    """com.microsoft versions of standard ops (Range without delta, Pad, Trilu, Inverse,
    GatherND, GridSample, Unique) and ExpandDims, CDist; the Range/Pad amounts come from shapes."""
    r = np.random.default_rng(9)
    n = helper.make_node
    inits = [_init("i0", np.array([0], np.int64)), _init("i1", np.array([1], np.int64)),
             _init("zero", np.int64(0)), _init("ax", np.int32(-1)), _init("two2", np.array([2, 2], np.int64)),
             _init("pts", r.standard_normal((5, 4)).astype(np.float32)),
             _init("gidx", np.array([[0, 1], [1, 0]], np.int64)), _init("flat", np.array([-1], np.int64))]
    nodes = [n("Shape", ["x"], ["xs"]), n("Gather", ["xs", "i1"], ["h1"]), n("Squeeze", ["h1"], ["h"]),
             _n("Range", ["zero", "h"], ["rng"]),
             n("Concat", ["i0", "i1", "i0", "h1"], ["pads"], axis=0),  # [0, 1, 0, H]: grows H by 1, W by H
             _n("Pad", ["x", "pads"], ["padded"]),
             _n("Trilu", ["x"], ["tri"], upper=1), _n("Inverse", ["sq"], ["inv"]),
             _n("ExpandDims", ["x", "ax"], ["expanded"]),
             _n("GatherND", ["x", "gidx"], ["gnd"]),
             _n("GridSample", ["img", "grid"], ["sampled"]),
             _n("CDist", ["x", "pts"], ["dist"]),
             n("Reshape", ["x", "flat"], ["x_flat"]), _n("Unique", ["x_flat"], ["uniq", "uniq_idx", "uniq_counts"])]
    inputs = [("x", F, ["H", 4]), ("sq", F, ["B", 3, 3]), ("img", F, ["B", 2, "IH", "IW"]),
              ("grid", F, ["B", "GH", "GW", 2])]
    outs = [(name, F) for name in ("padded", "tri", "inv", "expanded", "gnd", "sampled", "dist", "uniq")]
    return _model(nodes, inputs, outs + [(name, I64) for name in ("rng", "uniq_idx", "uniq_counts")], inits)


def packed_weight_model() -> onnx.ModelProto:
    """Ops of 4-bit weight quantisation and onnxruntime's NHWC rewrite: GatherBlockQuantized
    (packed uint8 embedding table), MatMulBnb4 (NF4 weight), NhwcMaxPool."""
    r = np.random.default_rng(10)
    inits = [_init("table", r.integers(0, 255, (10, 8)).astype(np.uint8)),
             _init("table_s", np.ones((10, 1), np.float32)),
             _init("bnb", r.integers(0, 255, (64,)).astype(np.uint8)), _init("absmax", np.ones(8, np.float32))]
    nodes = [_n("GatherBlockQuantized", ["table", "ids", "table_s"], ["emb"],
                bits=4, block_size=16, gather_axis=0, quantize_axis=1),
             _n("MatMulBnb4", ["emb", "bnb", "absmax"], ["bnb_out"], K=16, N=8, block_size=16, quant_type=1),
             _n("NhwcMaxPool", ["img8"], ["pooled"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])]
    return _model(nodes, [("ids", I64, ["B", "S"]), ("img8", U8, ["B", "H", "W", 3])],
                  [("bnb_out", F), ("pooled", U8)], inits)


def fused_matmul_batch_model() -> onnx.ModelProto:
    """FusedMatMul with its batch-axis transposes, as onnxruntime folds Transpose into MatMul."""
    nodes = [_n("FusedMatMul", ["a", "b"], ["ab"], transBatchA=1),
             _n("FusedMatMul", ["a", "bt"], ["abt"], transBatchA=1, transBatchB=1, transB=1),
             _n("FusedMatMul", ["at", "b"], ["atb"], transBatchA=1, transA=1)]
    inputs = [("a", F, ["M", "B", "H", 8]), ("b", F, ["B", "H", 8, "N"]), ("bt", F, ["N", "B", "H", 8]),
              ("at", F, [8, "B", "H", "M"])]
    return _model(nodes, inputs, [("ab", F), ("abt", F), ("atb", F)], [])


def _ints(high: int):
    return lambda shape, rng: rng.integers(0, high, shape)


CASES = {
    "dynamic-quant": (dynamic_quant_model, [{"x": (1, 3, 16)}, {"x": (2, 7, 16)}, {"x": (4, 1, 16)}], {}),
    "qlinear-nchw": (lambda: qlinear_model(False), [{"x": (1, 3, 16, 16)}, {"x": (2, 3, 13, 9)},
                                                   {"x": (1, 3, 5, 22)}], {}),
    "qlinear-nhwc": (lambda: qlinear_model(True), [{"x": (1, 16, 16, 3)}, {"x": (2, 13, 9, 3)},
                                                  {"x": (1, 5, 22, 3)}], {}),
    "dq-lstm-forward": (lambda: dynamic_quantize_lstm_model("forward"),
                        [{"x": (4, 1, 6)}, {"x": (9, 3, 6)}, {"x": (1, 2, 6)}], {}),
    "dq-lstm-reverse": (lambda: dynamic_quantize_lstm_model("reverse"),
                        [{"x": (4, 1, 6)}, {"x": (9, 3, 6)}], {}),
    "dq-lstm-bidirectional": (lambda: dynamic_quantize_lstm_model("bidirectional"),
                              [{"x": (4, 1, 6)}, {"x": (9, 3, 6)}], {}),
    "attention": (attention_model, [
        {"x": (1, 5, 16), "past": (2, 1, 2, 3, 8), "kv": (1, 7, 16), "v8": (1, 7, 8), "past_k": (1, 2, 3, 8),
         "pos": (1, 5), "img": (1, 3, 16, 20)},
        {"x": (2, 9, 16), "past": (2, 2, 2, 1, 8), "kv": (2, 2, 16), "v8": (2, 2, 8), "past_k": (2, 2, 1, 8),
         "pos": (2, 9), "img": (2, 3, 9, 7)},
        {"x": (3, 1, 16), "past": (2, 3, 2, 6, 8), "kv": (3, 4, 16), "v8": (3, 4, 8), "past_k": (3, 2, 6, 8),
         "pos": (3, 1), "img": (3, 3, 5, 5)}], {"pos": _ints(32)}),
    "group-query-attention": (gqa_model, [
        {"q": (1, 5, 32), "k": (1, 5, 16), "v": (1, 5, 16), "past_k": (1, 2, 3, 8), "qkv": (1, 5, 64)},
        {"q": (2, 1, 32), "k": (2, 1, 16), "v": (2, 1, 16), "past_k": (2, 2, 8, 8), "qkv": (2, 1, 64)},
        {"q": (1, 6, 32), "k": (1, 6, 16), "v": (1, 6, 16), "past_k": (1, 2, 0, 8), "qkv": (1, 6, 64)}], {}),
    # onnxruntime runs a multi-token step with a past only at batch 1
    "group-query-attention-static-cache": (gqa_static_cache_model, [
        {"q": (1, 1, 16), "k": (1, 1, 8), "v": (1, 1, 8), "cache": (1, 1, 16, 8)},
        {"q": (1, 2, 16), "k": (1, 2, 8), "v": (1, 2, 8), "cache": (1, 1, 8, 8)},
        {"q": (3, 1, 16), "k": (3, 1, 8), "v": (3, 1, 8), "cache": (3, 1, 5, 8)}], {}),
    "fused-matmul-batch": (fused_matmul_batch_model, [
        {"a": (3, 2, 4, 8), "b": (2, 4, 8, 5), "bt": (5, 2, 4, 8), "at": (8, 2, 4, 3)},
        {"a": (1, 1, 2, 8), "b": (1, 2, 8, 7), "bt": (7, 1, 2, 8), "at": (8, 1, 2, 1)}], {}),
    "packed-weights": (packed_weight_model, [{"ids": (1, 5), "img8": (1, 9, 12, 3)},
                                             {"ids": (3, 2), "img8": (3, 4, 7, 3)}], {"ids": _ints(10)}),
    "decoder-masked-mha": (decoder_step_model, [
        {"q": (1, 1, 16), "k": (1, 1, 16), "v": (1, 1, 16), "cache_k": (1, 2, 10, 8), "cache_v": (1, 2, 10, 8),
         "enc_k": (1, 2, 7, 8), "enc_v": (1, 2, 7, 8)},
        {"q": (3, 1, 16), "k": (3, 1, 16), "v": (3, 1, 16), "cache_k": (3, 2, 4, 8), "cache_v": (3, 2, 4, 8),
         "enc_k": (3, 2, 1, 8), "enc_v": (3, 2, 1, 8)}], {}),
    "embed-layer-norm": (embed_model, [{"ids": (1, 5), "segs": (1, 5), "mask": (1, 5)},
                                       {"ids": (3, 12), "segs": (3, 12), "mask": (3, 12)}],
                         {"ids": _ints(30), "segs": _ints(2), "mask": lambda shape, rng: np.ones(shape)}),
}


def test_legacy_contrib_ops_agree_with_onnxruntime():
    """Only Unique's values and counts are unknown: their length is the number of distinct values."""
    tally = Tally()
    sizes = [{"x": (3, 4), "sq": (1, 3, 3), "img": (1, 2, 6, 7), "grid": (1, 4, 5, 2)},
             {"x": (7, 4), "sq": (2, 3, 3), "img": (2, 2, 3, 9), "grid": (2, 1, 2, 2)}]
    with warnings.catch_warnings():
        warnings.simplefilter("error", RDPWarning)
        compare(legacy_model(), sizes, tally, "legacy")
    assert tally.wrong == 0, tally.wrong_list
    assert {name for _, name, _ in tally.nac_list} == {"uniq", "uniq_counts"}, tally.nac_list
    assert tally.nac == tally.data_dependent == 4 and tally.right == 2 * 14


@pytest.mark.parametrize("case", sorted(CASES))
def test_contrib_ops_agree_with_onnxruntime(case):
    build, sizes, values = CASES[case]
    model = build()
    tally = Tally()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RDPWarning)  # every op of the model has a rule
        compare(model, sizes, tally, case, values=values)
    assert tally.wrong == 0, tally.wrong_list
    assert tally.nac == 0, tally.nac_list
    assert tally.right >= len(model.graph.node) * len(sizes)


def no_cpu_kernel_model() -> onnx.ModelProto:
    """Ops onnxruntime runs only on GPU: BiasAdd, BiasSplitGelu, NhwcConv, and
    MultiHeadAttention's packed key/value and packed QKV layouts."""
    r = np.random.default_rng(6)
    inits = [_init("bias", np.zeros(8, np.float32)), _init("bias2", np.zeros(16, np.float32)),
             _init("w", r.standard_normal((4, 3, 3, 2)).astype(np.float32))]
    nodes = [_n("BiasAdd", ["x", "bias", "x"], ["badd"]),
             _n("BiasSplitGelu", ["x2", "bias2"], ["bsg"]),
             _n("NhwcConv", ["img", "w"], ["nconv"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 0, 1, 0]),
             _n("MultiHeadAttention", ["q", "kv5"], ["mha_kv"], num_heads=2),
             _n("MultiHeadAttention", ["qkv5"], ["mha_qkv"], num_heads=2)]
    inputs = [("x", F, ["N", "S", 8]), ("x2", F, ["N", "S", 16]), ("img", F, ["N", "H", "W", 2]),
              ("q", F, ["B", "S", 16]), ("kv5", F, ["B", "L", 2, 2, 8]), ("qkv5", F, ["B", "S", 2, 3, 8])]
    return _model(nodes, inputs, [("badd", F), ("bsg", F), ("nconv", F), ("mha_kv", F), ("mha_qkv", F)], inits)


def test_gpu_only_contrib_ops_agree_with_onnxruntime_symbolic_inference():
    """onnxruntime's symbolic shape inference (onnxruntime/tools/symbolic_shape_infer.py) gives
    each output as a sympy expression of the input dims; both are evaluated at several sizes."""
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    model = no_cpu_kernel_model()
    res = analyze(model)
    reference = {o.name: [d.dim_param or d.dim_value for d in o.type.tensor_type.shape.dim]
                 for o in SymbolicShapeInference.infer_shapes(model).graph.output}
    sizes = [{"x": (1, 5, 8), "x2": (1, 5, 16), "img": (1, 9, 12, 2), "q": (1, 5, 16), "kv5": (1, 7, 2, 2, 8),
              "qkv5": (1, 5, 2, 3, 8)},
             {"x": (3, 2, 8), "x2": (3, 2, 16), "img": (3, 4, 7, 2), "q": (2, 2, 16), "kv5": (2, 3, 2, 2, 8),
              "qkv5": (2, 2, 2, 3, 8)}]
    for shapes in sizes:
        env = res.bind(shapes)
        symbols = {name: sympy.Symbol(name) for name in env}  # a local "S" is a symbol, not sympy.S
        values = {symbols[name]: value for name, value in env.items()}
        for name, dims in reference.items():
            expected = tuple(int(sympy.sympify(d, locals=symbols).subs(values)) if isinstance(d, str) else d
                             for d in dims)
            assert res.tensor_shape(name, env) == expected, (name, shapes)
    assert len(reference) == 5


# ----------------------------------------------------------------- exporter-produced graphs
def tiny_bert(hidden: int = 16, heads: int = 2, ffn: int = 32) -> onnx.ModelProto:
    """One BERT encoder layer with embeddings over dynamic ``[batch, sequence]`` token ids, in
    the unfused form torch exports (Gather embeddings, LayerNormalization, Q/K/V MatMul·Add·
    Reshape·Transpose attention with an additive mask, Erf GELU) — what onnxruntime's transformer
    optimiser fuses."""
    r = np.random.default_rng(7)
    f32 = np.float32

    def w(name, *shape):
        return _init(name, (r.standard_normal(shape) * 0.1).astype(f32))
    head = hidden // heads
    inits = [w("word", 100, hidden), w("posemb", 64, hidden), w("segemb", 2, hidden),
             _init("ln_g", np.ones(hidden, f32)), _init("ln_b", np.zeros(hidden, f32)),
             w("wq", hidden, hidden), w("wk", hidden, hidden), w("wv", hidden, hidden), w("bq", hidden),
             w("bk", hidden), w("bv", hidden), w("wo", hidden, hidden), w("bo", hidden),
             w("w1", hidden, ffn), w("b1", ffn), w("w2", ffn, hidden), w("b2", hidden),
             _init("heads_shape", np.array([0, 0, heads, head], np.int64)),
             _init("merge_shape", np.array([0, 0, hidden], np.int64)),
             _init("ax0", np.array([0], np.int64)), _init("ax1", np.array([1], np.int64)),
             _init("ax2", np.array([2], np.int64)), _init("one_f", f32(1.0)), _init("neg", f32(-10000.0)),
             _init("scale", f32(np.sqrt(head))), _init("i0", np.int64(0)), _init("i1", np.int64(1)),
             _init("sqrt2", f32(np.sqrt(2.0))), _init("half", f32(0.5))]
    n = helper.make_node

    def projection(x: str, wname: str, bname: str, out: str, perm: list[int]) -> list:
        return [n("MatMul", [x, wname], [out + "0"]), n("Add", [out + "0", bname], [out + "1"]),
                n("Reshape", [out + "1", "heads_shape"], [out + "2"]), n("Transpose", [out + "2"], [out], perm=perm)]
    nodes = [
        n("Shape", ["input_ids"], ["ids_shape"]), n("Gather", ["ids_shape", "i1"], ["seq_len"]),
        n("Range", ["i0", "seq_len", "i1"], ["pos_range"]), n("Unsqueeze", ["pos_range", "ax0"], ["pos_ids"]),
        n("Gather", ["word", "input_ids"], ["word_e"]), n("Gather", ["posemb", "pos_ids"], ["pos_e"]),
        n("Gather", ["segemb", "segment_ids"], ["seg_e"]),
        n("Add", ["word_e", "pos_e"], ["e1"]), n("Add", ["e1", "seg_e"], ["e2"]),
        n("LayerNormalization", ["e2", "ln_g", "ln_b"], ["emb"], axis=-1, epsilon=1e-12),
        *projection("emb", "wq", "bq", "q", [0, 2, 1, 3]), *projection("emb", "wk", "bk", "k", [0, 2, 3, 1]),
        *projection("emb", "wv", "bv", "v", [0, 2, 1, 3]),
        n("Unsqueeze", ["attention_mask", "ax1"], ["m1"]), n("Unsqueeze", ["m1", "ax2"], ["m2"]),
        n("Cast", ["m2"], ["m3"], to=F), n("Sub", ["one_f", "m3"], ["m4"]), n("Mul", ["m4", "neg"], ["m5"]),
        n("MatMul", ["q", "k"], ["qk"]), n("Div", ["qk", "scale"], ["qk_s"]), n("Add", ["qk_s", "m5"], ["qk_m"]),
        n("Softmax", ["qk_m"], ["probs"], axis=3),
        n("MatMul", ["probs", "v"], ["ctx0"]), n("Transpose", ["ctx0"], ["ctx1"], perm=[0, 2, 1, 3]),
        n("Reshape", ["ctx1", "merge_shape"], ["ctx2"]),
        n("MatMul", ["ctx2", "wo"], ["o0"]), n("Add", ["o0", "bo"], ["o1"]), n("Add", ["o1", "emb"], ["o2"]),
        n("LayerNormalization", ["o2", "ln_g", "ln_b"], ["attn_out"], axis=-1, epsilon=1e-12),
        n("MatMul", ["attn_out", "w1"], ["f0"]), n("Add", ["f0", "b1"], ["f1"]),
        n("Div", ["f1", "sqrt2"], ["g0"]), n("Erf", ["g0"], ["g1"]), n("Add", ["g1", "one_f"], ["g2"]),
        n("Mul", ["f1", "g2"], ["g3"]), n("Mul", ["g3", "half"], ["g4"]),
        n("MatMul", ["g4", "w2"], ["f2"]), n("Add", ["f2", "b2"], ["f3"]), n("Add", ["f3", "attn_out"], ["f4"]),
        n("LayerNormalization", ["f4", "ln_g", "ln_b"], ["last_hidden"], axis=-1, epsilon=1e-12),
    ]
    g = helper.make_graph(nodes, "tiny_bert",
                          [helper.make_tensor_value_info(x, I64, ["batch", "sequence"])
                           for x in ("input_ids", "segment_ids", "attention_mask")],
                          [helper.make_tensor_value_info("last_hidden", F, ["batch", "sequence", hidden])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def tiny_crnn() -> onnx.ModelProto:
    """A text-line recogniser's shape: Conv features over a dynamic-width line, columns as a
    sequence into a bidirectional LSTM, a per-column MatMul classifier and Softmax."""
    r = np.random.default_rng(8)
    f32 = np.float32
    hid, feat, classes = 8, 4 * 4, 12
    inits = [_init("cw", (r.standard_normal((4, 1, 3, 3)) * 0.3).astype(f32)), _init("cb", np.zeros(4, f32)),
             _init("to_seq", np.array([0, 16, -1], np.int64)),
             _init("lw", (r.standard_normal((2, 4 * hid, feat)) * 0.3).astype(f32)),
             _init("lr", (r.standard_normal((2, 4 * hid, hid)) * 0.3).astype(f32)),
             _init("lb", np.zeros((2, 8 * hid), f32)),
             _init("ow", (r.standard_normal((2 * hid, classes)) * 0.3).astype(f32)),
             _init("y_shape", np.array([0, 0, 2 * hid], np.int64))]
    n = helper.make_node
    nodes = [n("Conv", ["x", "cw", "cb"], ["c"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
             n("Relu", ["c"], ["cr"]), n("Reshape", ["cr", "to_seq"], ["seq"]),  # [N, C*H, W]
             n("Transpose", ["seq"], ["seq_t"], perm=[2, 0, 1]),  # [W, N, C*H]
             n("LSTM", ["seq_t", "lw", "lr", "lb"], ["y", "y_h", "y_c"], hidden_size=hid, direction="bidirectional"),
             n("Transpose", ["y"], ["y_t"], perm=[0, 2, 1, 3]), n("Reshape", ["y_t", "y_shape"], ["y_flat"]),
             n("MatMul", ["y_flat", "ow"], ["logits"]), n("Softmax", ["logits"], ["probs"], axis=-1)]
    g = helper.make_graph(nodes, "tiny_crnn", [helper.make_tensor_value_info("x", F, ["N", 1, 8, "W"])],
                          [helper.make_tensor_value_info("probs", F, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _fused_bert(gelu_approximation: bool) -> onnx.ModelProto:
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    options = FusionOptions("bert")
    options.enable_gelu_approximation = gelu_approximation
    model = optimize_model(tiny_bert(), model_type="bert", num_heads=2, hidden_size=16, opt_level=0,
                           optimization_options=options).model
    if all(o.domain != MS for o in model.opset_import):  # the optimiser writes the ops, not the import
        model.opset_import.append(helper.make_opsetid(MS, 1))
    return model


def _quantized(model: onnx.ModelProto, tmp_path, name: str) -> onnx.ModelProto:
    from onnxruntime.quantization import quantize_dynamic

    out = tmp_path / f"{name}.onnx"
    # the quantiser cannot type contrib ops' outputs by itself: they are float tensors here
    quantize_dynamic(model, out, extra_options={"DefaultTensorType": F})
    return onnx.load(str(out))


def _ort_optimized(model: onnx.ModelProto, tmp_path, name: str) -> onnx.ModelProto:
    """The graph onnxruntime's own extended optimisations write (its quantised-MatMul fusions)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    so.optimized_model_filepath = str(tmp_path / f"{name}.onnx")
    ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return onnx.load(so.optimized_model_filepath)


BERT_SIZES = [{n: s for n in ("input_ids", "segment_ids", "attention_mask")} for s in ((1, 7), (3, 12), (2, 1))]
BERT_VALUES = {"input_ids": _ints(100), "segment_ids": _ints(2), "attention_mask": lambda shape, rng: np.ones(shape)}
CRNN_SIZES = [{"x": (1, 1, 8, 40)}, {"x": (2, 1, 8, 17)}, {"x": (3, 1, 8, 64)}]

CORPUS = {
    # name: (build(tmp_path), sizes, values, contrib ops the graph must contain)
    "bert-fused": (lambda tmp: _fused_bert(False), BERT_SIZES, BERT_VALUES,
                   {"Attention", "EmbedLayerNormalization", "SkipLayerNormalization", "BiasGelu"}),
    "bert-fused-fastgelu": (lambda tmp: _fused_bert(True), BERT_SIZES, BERT_VALUES, {"FastGelu", "Attention"}),
    "bert-fused-quantized": (lambda tmp: _quantized(_fused_bert(False), tmp, "bq"), BERT_SIZES, BERT_VALUES,
                             {"QAttention", "QEmbedLayerNormalization", "SkipLayerNormalization"}),
    "crnn-quantized": (lambda tmp: _quantized(tiny_crnn(), tmp, "cq"), CRNN_SIZES, {}, {"DynamicQuantizeLSTM"}),
    "crnn-quantized-ort-optimized": (lambda tmp: _ort_optimized(_quantized(tiny_crnn(), tmp, "cq"), tmp, "cqo"),
                                     CRNN_SIZES, {}, {"DynamicQuantizeLSTM", "DynamicQuantizeMatMul"}),
}


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_quantised_and_fused_models_fully_known(name, tmp_path):
    """Graphs onnxruntime's quantiser and optimisers write: every tensor right, none unknown
    (none of them holds a data-dependent shape)."""
    build, sizes, values, expected_ops = CORPUS[name]
    model = build(tmp_path)
    contrib = {n.op_type for n in model.graph.node if n.domain == MS}
    assert expected_ops <= contrib, contrib
    tally = Tally()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RDPWarning)
        compare(model, sizes, tally, name, values=values)
    print(f"{name}: {tally.right}/{tally.total} right; contrib ops {sorted(contrib)}")
    assert tally.wrong == 0, tally.wrong_list
    assert tally.nac == 0, tally.nac_list
