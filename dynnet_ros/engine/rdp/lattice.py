"""The RDP lattice for one tensor: rank, dims and (small tensors) values.

Per property the order is ``undef`` (top: not computed yet, represented by the
tensor being absent from the state) → known constant → symbolic constant /
op-inferred expression → ``nac`` (bottom, ``None``).  :func:`meet` is the product
meet: equal elements stay, different ones fall to nac, so repeated evaluation can
only move down and the fixpoint terminates.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .expr import Dim, Expr, mul, to_json_dim

# small tensors whose element values RDP tracks (shape tensors, axes, scales ...)
MAX_VALUE_ELEMS = 4096


@dataclass(frozen=True)
class TensorInfo:
    """Analysis result of one tensor.

    ``dims`` is None when the rank is unknown; each dim is int | Expr | None.
    ``value`` is a flat row-major tuple (ints, floats, Exprs, None for unknown
    elements) present only when the shape is concrete and small.
    ``elem`` is set for sequence-typed values (the common element info).
    """

    dims: tuple | None
    dtype: int = 0
    value: tuple | None = None
    reason: str | None = None
    is_seq: bool = False
    elem: TensorInfo | None = None
    seq_items: tuple | None = None  # per-position infos when the sequence length is known

    @property
    def rank(self) -> int | None:
        return None if self.dims is None else len(self.dims)

    @property
    def kind(self) -> str:
        if self.is_seq or self.dims is None or any(d is None for d in self.dims):
            return "nac"
        if all(isinstance(d, int) for d in self.dims):
            return "known"
        return "symbolic"

    def numel(self) -> Dim:
        if self.dims is None:
            return None
        n: Dim = 1

        for d in self.dims:
            n = mul(n, d)
        return n

    def concrete_shape(self) -> tuple[int, ...] | None:
        if self.dims is None or not all(isinstance(d, int) for d in self.dims):
            return None
        return tuple(self.dims)

    def with_reason(self, reason: str) -> TensorInfo:
        return TensorInfo(self.dims, self.dtype, self.value, reason, self.is_seq, self.elem, self.seq_items)


def nac(reason: str, dtype: int = 0, rank: int | None = None) -> TensorInfo:
    return TensorInfo(None if rank is None else (None,) * rank, dtype, None, reason)


def shaped(dims: Sequence[Dim] | None, dtype: int = 0, value: Sequence | None = None,
           reason: str | None = None) -> TensorInfo:
    dims_t = None if dims is None else tuple(dims)
    val = None
    if value is not None and dims_t is not None:
        val = tuple(value)
        if val and all(v is None for v in val):
            val = None
    if reason is None and (dims_t is None or any(d is None for d in dims_t)):
        reason = "unknown dimension"
    return TensorInfo(dims_t, dtype, val, reason)


def seq_info(elem: TensorInfo | None, items: tuple | None, reason: str | None = None) -> TensorInfo:
    return TensorInfo(None, 0, None, reason or "sequence", True, elem, items)


def meet_dim(a: Dim, b: Dim) -> Dim:
    if a is None or b is None:
        return None
    return a if a == b else None


def meet(a: TensorInfo | None, b: TensorInfo | None) -> TensorInfo | None:
    """Product-lattice meet; None (undef) is the identity."""
    if a is None:
        return b
    if b is None:
        return a
    if a == b:
        return a
    if a.is_seq or b.is_seq:
        if a.is_seq and b.is_seq:
            elem = meet(a.elem, b.elem) if a.elem and b.elem else None
            items = None
            if a.seq_items is not None and b.seq_items is not None and len(a.seq_items) == len(b.seq_items):
                items = tuple(meet(x, y) for x, y in zip(a.seq_items, b.seq_items))
            return seq_info(elem, items, "merged sequences")
        return nac("sequence merged with a tensor")
    dtype = a.dtype if a.dtype == b.dtype else 0
    if a.dims is None or b.dims is None or len(a.dims) != len(b.dims):
        return nac(f"rank differs between paths ({a.rank} vs {b.rank})", dtype)
    dims = tuple(meet_dim(x, y) for x, y in zip(a.dims, b.dims))
    value = None
    if a.value is not None and b.value is not None and len(a.value) == len(b.value):
        value = tuple(x if x == y else None for x, y in zip(a.value, b.value))
    reason = None
    if any(d is None for d in dims):
        reason = a.reason or b.reason or "dimension differs between paths"
    return shaped(dims, dtype, value, reason)


def value_json(v: Any) -> Any:
    if isinstance(v, Expr):
        return str(v)
    if isinstance(v, float):
        if v != v or v in (float("inf"), float("-inf")):
            return None
        return v
    if isinstance(v, bool):
        return int(v)
    return to_json_dim(v) if not isinstance(v, (str, bytes)) else (v if isinstance(v, str) else None)

