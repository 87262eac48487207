"""Elementwise families: unary same-shape, broadcasting binary/variadic, Where, Cast.

Values are propagated through the integer arithmetic that shape sub-graphs use
(Add/Sub/Mul/Div/Mod/Max/Min, comparisons, Not/And/Or, Cast, Floor/Ceil...).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from dynnet_ros.engine.modelio.onnx_proto import TensorProto

from ..expr import Expr, Ratio, add, bounds, dmax, dmin, exact_div, floordiv, mul, ratio_floor, ratio_op, sub
from ..lattice import TensorInfo, nac, shaped
from ..registry import Ctx, register
from ._util import INT_TYPES, broadcast_reason, broadcast_shapes, cast_value, same_shape, value_elementwise

UNARY_ISDOS = """Abs Acos Acosh Asin Asinh Atan Atanh Ceil Cos Cosh Elu Erf Exp Floor HardSigmoid HardSwish
Identity IsInf IsNaN LeakyRelu Log Neg Not Reciprocal Relu Round Selu Shrink Sigmoid Sign Sin Sinh Softplus
Softsign Sqrt Tan Tanh ThresholdedRelu Celu Gelu Mish BitwiseNot Softmax LogSoftmax Hardmax LpNormalization
MeanVarianceNormalization LRN Swish Clip Trilu CumSum CumProd ReverseSequence RegexFullMatch
RandomUniformLike RandomNormalLike Bernoulli InstanceNormalization BitCast""".split()

_BOOL_OUT = {"IsInf", "IsNaN", "Not", "RegexFullMatch"}


def _unary_value(op: str, x, dtype: int):
    if isinstance(x, Ratio):
        if op in ("Floor", "Ceil"):
            return ratio_floor(x, ceil=op == "Ceil")
        if op == "Identity":
            return x
        if op == "Neg":
            return Ratio(mul(x.num, -1), x.den)
        return None
    if isinstance(x, Expr):
        if op == "Identity" or op in ("Floor", "Ceil", "Round") or (op == "Relu" and bounds(x)[0] >= 0):
            return x
        if op == "Abs":
            return dmax(x, mul(x, -1))
        if op == "Relu":
            return dmax(x, 0)
        if op == "Neg":
            return mul(x, -1)
        return None
    if op == "Identity":
        return x
    if op == "Neg":
        return -x
    if op == "Abs":
        return abs(x)
    if op == "Floor":
        return float(math.floor(x)) if isinstance(x, float) else x
    if op == "Ceil":
        return float(math.ceil(x)) if isinstance(x, float) else x
    if op == "Round":
        return float(round(x)) if isinstance(x, float) else x
    if op == "Not":
        return not x
    if op == "Relu":
        return max(x, 0 if isinstance(x, int) else 0.0)
    if op == "Sign":
        return (x > 0) - (x < 0) if isinstance(x, int) else float((x > 0) - (x < 0))
    if op == "Sqrt" and isinstance(x, float) and x >= 0:
        return math.sqrt(x)
    if op == "Reciprocal" and isinstance(x, float) and x != 0:
        return 1.0 / x
    return None


@register(UNARY_ISDOS, "ISDOS", "elementwise unary")
def unary(ctx: Ctx) -> list:
    op = ctx.node.op_type
    t = ctx.inp(0)
    if t is None:
        return [nac("missing input")]
    dtype = TensorProto.BOOL if op in _BOOL_OUT else t.dtype
    if op == "BitCast":
        dtype = ctx.attr("to", 0)
    out = TensorInfo(t.dims, dtype, None, t.reason if t.kind == "nac" else None)
    if t.value is not None and op in ("Identity", "Neg", "Abs", "Floor", "Ceil", "Round", "Not", "Relu", "Sign",
                                      "Sqrt", "Reciprocal"):
        val = tuple(None if x is None else _unary_value(op, x, t.dtype) for x in t.value)
        out = TensorInfo(t.dims, dtype, val if any(v is not None for v in val) else None, out.reason)
    return [out]


@register("Dropout", "ISDOS", "elementwise unary")
def dropout(ctx: Ctx) -> list:
    t = same_shape(ctx)
    x = ctx.inp(0)
    outs = [TensorInfo(t.dims, t.dtype, x.value if x is not None else None, t.reason)]
    if ctx.n_out > 1:
        outs.append(TensorInfo(t.dims, TensorProto.BOOL if ctx.opset >= 10 else t.dtype, None, t.reason))
    return outs


@register("Cast CastLike", "ISDOS", "elementwise unary")
def cast(ctx: Ctx) -> list:
    t = ctx.inp(0)
    if t is None:
        return [nac("missing input")]
    if ctx.node.op_type == "Cast":
        to = ctx.attr("to", 0)
    else:
        other = ctx.inp(1)
        to = other.dtype if other is not None else 0
    val = None
    if t.value is not None:
        val = tuple(cast_value(x, to) for x in t.value)
    return [shaped(t.dims, to, val, t.reason if t.kind == "nac" else None)]


# ----------------------------------------------------------------- broadcasting binary / variadic
_CMP = {"Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"}
_LOGIC = {"And", "Or", "Xor"}


def _trunc_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _binary_fn(op: str, dtype: int):
    is_int = dtype in INT_TYPES

    def f(a, b):
        sym = isinstance(a, (Expr, Ratio)) or isinstance(b, (Expr, Ratio))
        if sym and not is_int and op in ("Add", "Sub", "Mul", "Div"):
            return ratio_op(op, a, b)
        if isinstance(a, Ratio) or isinstance(b, Ratio):
            return None
        if op == "Add":
            return add(a, b) if sym else a + b
        if op == "Sub":
            return sub(a, b) if sym else a - b
        if op == "Mul":
            if sym:
                if isinstance(a, float) or isinstance(b, float):
                    c = b if isinstance(b, float) else a
                    e = a if isinstance(b, float) else b
                    return mul(e, int(c)) if c.is_integer() else None
                return mul(a, b)
            return a * b
        if op == "Div":
            if sym:
                if isinstance(b, float):
                    b = int(b) if b.is_integer() else None
                    if b is None:
                        return None
                if is_int and isinstance(b, int) and b > 0 and bounds(a)[0] >= 0:
                    return floordiv(a, b)
                return exact_div(a, b)
            if is_int or (isinstance(a, int) and isinstance(b, int)):
                return _trunc_div(int(a), int(b))
            return a / b
        if op == "Mod":
            if sym:
                if isinstance(b, int) and b > 0 and bounds(a)[0] >= 0:
                    return sub(a, mul(b, floordiv(a, b)))
                return None
            return a % b if is_int else math.fmod(a, b)
        if op == "Max":
            return dmax(a, b) if sym else max(a, b)
        if op == "Min":
            return dmin(a, b) if sym else min(a, b)
        if op in _CMP:
            if sym:
                lo, hi = bounds(sub(a, b))
                if op == "Equal":
                    return True if lo == hi == 0 else (False if lo > 0 or hi < 0 else None)
                if op == "Less":
                    return True if hi < 0 else (False if lo >= 0 else None)
                if op == "Greater":
                    return True if lo > 0 else (False if hi <= 0 else None)
                if op == "LessOrEqual":
                    return True if hi <= 0 else (False if lo > 0 else None)
                return True if lo >= 0 else (False if hi < 0 else None)
            return {"Equal": a == b, "Less": a < b, "Greater": a > b, "LessOrEqual": a <= b,
                    "GreaterOrEqual": a >= b}[op]
        if op in _LOGIC:
            if sym:
                return None
            return {"And": bool(a) and bool(b), "Or": bool(a) or bool(b), "Xor": bool(a) != bool(b)}[op]
        if op == "Pow" and not sym:
            r = a ** b
            return r if not isinstance(r, complex) else None
        return None

    return f


BINARY = """Add Sub Mul Div Mod Pow And Or Xor Equal Less Greater LessOrEqual GreaterOrEqual BitShift BitwiseAnd
BitwiseOr BitwiseXor PRelu StringConcat""".split()
VARIADIC = "Max Min Mean Sum".split()


@register(BINARY + VARIADIC, "ISDOS", "broadcasting elementwise")
def binary(ctx: Ctx) -> list:
    op = ctx.node.op_type
    ins = [t for t in ctx.inputs if t is not None]
    if not ins:
        return [nac("no inputs")]
    dims = broadcast_shapes([t.dims for t in ins], ctx)
    dtype = TensorProto.BOOL if op in _CMP or op in _LOGIC else ins[0].dtype
    val = None
    if all(t.value is not None for t in ins):
        if len(ins) == 1:
            val = ins[0].value if op in ("Max", "Min", "Sum", "Mean") else None
        elif op in ("Add", "Sub", "Mul", "Div", "Mod", "Max", "Min", "Pow") or op in _CMP or op in _LOGIC \
                or op == "Sum":
            fn = _binary_fn("Add" if op == "Sum" else op, ins[0].dtype)
            cur = ins[0]
            val = cur.value
            for t in ins[1:]:
                val = value_elementwise(fn, [cur, t], dtype)
                if val is None:
                    break
                cur = shaped(broadcast_shapes([cur.dims, t.dims]), dtype, val)
    if dims is None:
        return [nac("input rank unknown", dtype)]
    if val is not None and dtype in _NP_FLOAT:
        val = tuple(_round_float(v, dtype) for v in val)
    if op in ("Pow",) and val is not None and ins[0].dtype in INT_TYPES:
        val = tuple(int(v) if isinstance(v, float) and v.is_integer() else v for v in val)
    return [shaped(dims, dtype, val, broadcast_reason([t.dims for t in ins], dims))]


@register("Where", "ISDOS", "broadcasting elementwise")
def where(ctx: Ctx) -> list:
    c, x, y = ctx.inp(0), ctx.inp(1), ctx.inp(2)
    if c is None or x is None or y is None:
        return [nac("missing input")]
    dims = broadcast_shapes([c.dims, x.dims, y.dims], ctx)
    val = None
    if c.value is not None and x.value is not None and y.value is not None:
        val = value_elementwise(lambda cc, a, b: None if cc is None else (a if cc else b), [c, x, y], x.dtype)
    if dims is None:
        return [nac("input rank unknown", x.dtype)]
    return [shaped(dims, x.dtype, val, broadcast_reason([c.dims, x.dims, y.dims], dims))]


_NP_FLOAT: dict[int, type[np.floating[Any]]] = {TensorProto.FLOAT: np.float32, TensorProto.FLOAT16: np.float16}


def _round_float(v, dtype: int):
    """Values of float32/float16 tensors are rounded like the runtime computes them."""
    if isinstance(v, float):
        r = float(_NP_FLOAT[dtype](v))
        return r
    return v

