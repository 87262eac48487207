"""Sequence and Optional families: a sequence keeps per-item infos while its length
is known, else one merged element info."""
from __future__ import annotations

from collections.abc import Sequence

from dynnet_ros.engine.modelio.onnx_proto import TensorProto

from ..expr import Dim, add
from ..lattice import TensorInfo, meet, nac, seq_info, shaped
from ..registry import Ctx, ShapeError, register
from ._util import norm_axis


def _elem_of(items) -> TensorInfo | None:
    e = None
    for it in items:
        e = meet(e, TensorInfo(it.dims, it.dtype, None, it.reason) if not it.is_seq else it)
    return e


@register("SequenceConstruct", "ISDOS", "sequence")
def seq_construct(ctx: Ctx) -> list:
    items = tuple(t if t is not None else nac("missing") for t in ctx.inputs)
    return [seq_info(_elem_of(items), items)]


@register("SequenceEmpty", "ISDOS", "sequence")
def seq_empty(ctx: Ctx) -> list:
    return [seq_info(None, ())]


def _index(ctx: Ctx, i: int, n: int) -> int | None:
    v = ctx.int_values(i)
    if v is None:
        return None
    k = v[0]
    k = k + n if k < 0 else k
    return k if 0 <= k < n else None


@register("SequenceAt", "ISVDOS", "sequence")
def seq_at(ctx: Ctx) -> list:
    s = ctx.inp(0)
    if s is None or not s.is_seq:
        return [nac("not a sequence")]
    if s.seq_items is not None:
        k = _index(ctx, 1, len(s.seq_items))
        if k is not None:
            return [s.seq_items[k]]
    return [s.elem if s.elem is not None else nac("sequence element unknown")]


@register("SequenceInsert", "ISVDOS", "sequence")
def seq_insert(ctx: Ctx) -> list:
    s, t = ctx.inp(0), ctx.inp(1)
    if s is None or not s.is_seq or t is None:
        return [seq_info(None, None)]
    items = None
    if s.seq_items is not None:
        n = len(s.seq_items)
        if ctx.inp(2) is None:
            items = s.seq_items + (t,)
        else:
            v = ctx.int_values(2)
            if v is not None:
                k = v[0] + n if v[0] < 0 else v[0]
                if 0 <= k <= n:
                    items = s.seq_items[:k] + (t,) + s.seq_items[k:]
    elem = _elem_of([t] + ([s.elem] if s.elem is not None else []))
    return [seq_info(elem, items)]


@register("SequenceErase", "ISVDOS", "sequence")
def seq_erase(ctx: Ctx) -> list:
    s = ctx.inp(0)
    if s is None or not s.is_seq:
        return [seq_info(None, None)]
    items = None
    if s.seq_items is not None and s.seq_items:
        n = len(s.seq_items)
        k = n - 1 if ctx.inp(1) is None else _index(ctx, 1, n)
        if k is not None:
            items = s.seq_items[:k] + s.seq_items[k + 1:]
    return [seq_info(s.elem, items)]


@register("SequenceLength", "ISDO", "sequence")
def seq_length(ctx: Ctx) -> list:
    s = ctx.inp(0)
    n = len(s.seq_items) if s is not None and s.is_seq and s.seq_items is not None else None
    return [shaped((), TensorProto.INT64, (n,))]


@register("SplitToSequence", "ISVDOS", "sequence")
def split_to_sequence(ctx: Ctx) -> list:
    t = ctx.inp(0)
    if t is None or t.dims is None:
        return [seq_info(None, None)]
    r = len(t.dims)
    axis = norm_axis(ctx.attr("axis", 0), r)
    keep = ctx.attr("keepdims", 1)
    d = t.dims[axis]
    sp = ctx.inp(1)
    if sp is None:
        if not isinstance(d, int):
            e_dims = t.dims[:axis] + ((1,) if keep else ()) + t.dims[axis + 1:]
            return [seq_info(shaped(e_dims, t.dtype), None)]
        e = shaped(t.dims[:axis] + ((1,) if keep else ()) + t.dims[axis + 1:], t.dtype)
        return [seq_info(e, (e,) * d)]
    v = ctx.dim_values(1)
    if v is None:
        return [seq_info(shaped(t.dims[:axis] + (None,) + t.dims[axis + 1:], t.dtype), None)]
    sizes: Sequence[Dim]
    if sp.dims == ():
        size = v[0]
        if isinstance(d, int) and isinstance(size, int) and size > 0:
            n = -(-d // size)
            sizes = [size] * (n - 1) + [d - size * (n - 1)]
        else:
            return [seq_info(shaped(t.dims[:axis] + (None,) + t.dims[axis + 1:], t.dtype), None)]
    else:
        sizes = v
    items = tuple(shaped(t.dims[:axis] + (s,) + t.dims[axis + 1:], t.dtype) for s in sizes)
    return [seq_info(_elem_of(items), items)]


@register("ConcatFromSequence", "ISVDOS", "sequence")
def concat_from_sequence(ctx: Ctx) -> list:
    s = ctx.inp(0)
    new_axis = ctx.attr("new_axis", 0)
    if s is None or not s.is_seq:
        return [nac("not a sequence")]
    if s.seq_items is not None and s.seq_items and all(i.dims is not None for i in s.seq_items):
        r = len(s.seq_items[0].dims)
        axis = norm_axis(ctx.attr("axis"), r + 1 if new_axis else r)
        e = _elem_of(s.seq_items)
        if e is None or e.dims is None:  # the items are ranked, so only differing ranks get here
            raise ShapeError("ConcatFromSequence of items with different ranks")
        if new_axis:
            base = list(s.seq_items[0].dims)
            base.insert(axis, len(s.seq_items))
            for i, d in enumerate(e.dims):
                base[i if i < axis else i + 1] = d
            return [shaped(base, e.dtype)]
        dims = list(e.dims)
        tot: Dim = 0
        for it in s.seq_items:
            tot = add(tot, it.dims[axis])
        dims[axis] = tot
        return [shaped(dims, e.dtype)]
    e = s.elem
    if e is None or e.dims is None:
        return [nac("sequence element rank unknown")]
    r = len(e.dims)
    axis = norm_axis(ctx.attr("axis"), r + 1 if new_axis else r)
    dims = list(e.dims)
    if new_axis:
        dims.insert(axis, None)
    else:
        dims[axis] = None
    return [shaped(dims, e.dtype, None, "sequence length unknown")]


@register("Optional", "ISDOS", "optional")
def optional(ctx: Ctx) -> list:
    t = ctx.inp(0)
    if t is None:
        return [seq_info(None, (), "empty optional")]
    return [seq_info(t, (t,), "optional")]


@register("OptionalGetElement", "ISDOS", "optional")
def optional_get(ctx: Ctx) -> list:
    t = ctx.inp(0)
    if t is None:
        return [nac("missing")]
    if t.is_seq and t.reason in ("optional", "empty optional"):
        return [t.seq_items[0] if t.seq_items else nac("empty optional")]
    return [t]


@register("OptionalHasElement", "ISDOS", "optional")
def optional_has(ctx: Ctx) -> list:
    t = ctx.inp(0)
    val = None
    if t is None:
        val = (False,)
    elif t.is_seq and t.seq_items is not None and t.reason in ("empty optional", "optional"):
        val = (len(t.seq_items) == 1,)
    return [shaped((), TensorProto.BOOL, val)]

