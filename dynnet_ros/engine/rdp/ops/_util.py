"""Shared helpers of the transfer functions: axes, broadcasting, value arithmetic."""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from dynnet_ros.engine.modelio.onnx_proto import TensorProto

from ..expr import Dim, Expr, Ratio, bounds, dmax, dmin, floordiv, mul, provably_ne
from ..lattice import MAX_VALUE_ELEMS, TensorInfo, nac, shaped
from ..registry import Ctx, ShapeError

INT_TYPES = {TensorProto.INT64, TensorProto.INT32, TensorProto.INT16, TensorProto.INT8,
             TensorProto.UINT8, TensorProto.UINT16, TensorProto.UINT32, TensorProto.UINT64}
FLOAT_TYPES = {TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BFLOAT16}


def norm_axis(axis: int, rank: int) -> int:
    a = axis + rank if axis < 0 else axis
    if not 0 <= a < rank:
        raise ShapeError(f"axis {axis} out of range for rank {rank}")
    return a


def channels_first(dims: tuple) -> tuple:
    """``[N, spatial..., C]`` as ``[N, C, spatial...]`` (NHWC read as NCHW)."""
    return (dims[0], dims[-1]) + tuple(dims[1:-1])


def channels_last(dims: tuple) -> tuple:
    """``[N, C, spatial...]`` as ``[N, spatial..., C]``."""
    return (dims[0],) + tuple(dims[2:]) + (dims[1],)


def channels_last_rule(ctx: Ctx, rule: Callable[[Ctx], list], x_index: int = 0) -> list:
    """``rule`` applied to an NCHW view of the NHWC input ``x_index``, its outputs back in NHWC
    (onnxruntime's ``channels_last``/Nhwc ops)."""
    x = ctx.inp(x_index)
    if x is None or x.dims is None or len(x.dims) < 3:
        return [nac("input rank unknown", x.dtype if x else 0) for _ in range(ctx.n_out)]
    ins = list(ctx.inputs)
    ins[x_index] = TensorInfo(channels_first(x.dims), x.dtype, None, x.reason)
    return [t if t.dims is None else TensorInfo(channels_last(t.dims), t.dtype, None, t.reason)
            for t in rule(replace(ctx, inputs=ins))]


def concrete(dims) -> tuple | None:
    if dims is None or not all(isinstance(d, int) for d in dims):
        return None
    return tuple(dims)


def broadcast_dim(a: Dim, b: Dim, ctx: Ctx | None = None) -> Dim:
    """Sound multidirectional broadcast of one axis (None = nac)."""
    if a == b:
        return a
    if a == 1:
        return b
    if b == 1:
        return a
    if isinstance(a, int) and isinstance(b, int):
        raise ShapeError(f"cannot broadcast {a} with {b}")
    # an int c != 1 on one side: the other must be 1 or c -> result c
    if isinstance(b, int):
        return b
    if isinstance(a, int):
        return a
    if a is None:
        return b if provably_ne(b, 1) else None
    if b is None:
        return a if provably_ne(a, 1) else None
    ane, bne = provably_ne(a, 1), provably_ne(b, 1)
    if ane and bne:
        if ctx is not None:
            ctx.constrain(a, b, "broadcast of two dims that are never 1")
        return a
    if ane:
        return a
    if bne:
        return b
    # every pair the runtime accepts is (1, x), (x, 1) or (x, x), so the result is
    # max(a, b) -- except that (0, 1) gives 0: max(a, b) * min(a, b, 1) is exact for all
    return mul(dmax(a, b), dmin(a, b, 1))


def broadcast_shapes(shapes: Sequence[tuple | None], ctx: Ctx | None = None) -> tuple | None:
    ranked = [s for s in shapes if s is not None]
    if len(ranked) != len(shapes):
        return None
    rank = max((len(s) for s in ranked), default=0)
    out = []
    for i in range(rank):
        d: Dim = 1
        for s in ranked:
            j = i - (rank - len(s))
            if j >= 0:
                d = broadcast_dim(d, s[j], ctx)
        out.append(d)
    return tuple(out)


def broadcast_reason(shapes, out) -> str | None:
    """Why a broadcast result dim is nac although every input dim is known."""
    if out is None or any(s is None for s in shapes):
        return None
    rank = len(out)
    for i, d in enumerate(out):
        if d is not None:
            continue
        ds = [s[i - (rank - len(s))] for s in shapes if i - (rank - len(s)) >= 0]
        if all(x is not None for x in ds):
            return f"broadcast of {' and '.join(str(x) for x in ds)}: either may be 1, so the result is unprovable"
    return None


def same_shape(ctx: Ctx, i: int = 0, dtype: int | None = None) -> TensorInfo:
    t = ctx.inp(i)
    if t is None:
        return nac("missing input")
    return TensorInfo(t.dims, t.dtype if dtype is None else dtype, None,
                      t.reason if t.kind == "nac" else None)


# ----------------------------------------------------------------- values
def to_array(t: TensorInfo) -> np.ndarray | None:
    """Object array of a tensor's values (concrete shape required)."""
    if t is None or t.value is None:
        return None
    shape = concrete(t.dims)
    if shape is None or math.prod(shape) != len(t.value):
        return None
    arr = np.empty(len(t.value), dtype=object)
    arr[:] = list(t.value)
    return arr.reshape(shape)


def from_array(arr: np.ndarray, dtype: int) -> TensorInfo:
    flat = tuple(_py(x) for x in arr.reshape(-1).tolist()) if arr.size <= MAX_VALUE_ELEMS else None
    return shaped(arr.shape, dtype, flat)


def _py(x):
    if isinstance(x, np.generic):
        return x.item()
    return x


def value_elementwise(fn: Callable, infos: Sequence[TensorInfo], dtype: int) -> tuple | None:
    """Apply fn elementwise with broadcasting to known values (None-safe)."""
    arrs = [a for a in (to_array(t) for t in infos) if a is not None]
    if len(arrs) != len(infos):
        return None
    try:
        shape = np.broadcast_shapes(*[a.shape for a in arrs])
    except ValueError:
        return None
    if math.prod(shape) > MAX_VALUE_ELEMS:
        return None

    def safe(*xs):
        if any(x is None for x in xs):
            return None
        try:
            return fn(*xs)
        except (ZeroDivisionError, TypeError, ValueError, OverflowError, ArithmeticError, AttributeError):
            return None

    uf = np.frompyfunc(safe, len(arrs), 1)
    res = uf(*arrs)
    res = np.asarray(res, dtype=object).reshape(shape)
    return tuple(_py(x) for x in res.reshape(-1).tolist())


def cast_value(x, to: int):
    """Cast one tracked value to an ONNX dtype (None when not exactly representable)."""
    if x is None:
        return None
    if isinstance(x, Ratio):
        if to in INT_TYPES:  # truncation == floor for a non-negative numerator
            return floordiv(x.num, x.den) if bounds(x.num)[0] >= 0 else None
        return x if to in FLOAT_TYPES else None
    if to in INT_TYPES:
        if isinstance(x, bool):
            return int(x)
        if isinstance(x, int):
            return x if to == TensorProto.INT64 or -(2 ** 31) <= x < 2 ** 31 or to not in (TensorProto.INT32,) else None
        if isinstance(x, Expr):
            return x
        if isinstance(x, float):
            if math.isfinite(x):
                return int(x)  # C-style truncation
            return None
        return None
    if to == TensorProto.BOOL:
        if isinstance(x, (int, float, bool)):
            return bool(x)
        return None
    if to in FLOAT_TYPES:
        if isinstance(x, bool):
            return float(x)
        if isinstance(x, int):
            if to == TensorProto.DOUBLE or abs(x) < 2 ** 24:
                return float(x)
            return None
        if isinstance(x, Expr):
            return x  # an integral symbolic value carried through float arithmetic
        if isinstance(x, float):
            if to == TensorProto.FLOAT:
                return float(np.float32(x))
            return x
        return None
    return None

