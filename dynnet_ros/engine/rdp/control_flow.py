"""Control flow: If (both branches + Merge), Loop and Scan (body to a fixpoint),
SequenceMap, and the paper's custom-domain Switch/Combine pair.

Merge is the lattice meet: per dim equal → keep, different → nac.  A branch whose
condition is a proven constant is taken alone.
"""
from __future__ import annotations

import re

from dynnet_ros.engine.modelio.onnx_proto import TensorProto

from .expr import Dim, Expr, sym, symbol_upper_bound
from .lattice import TensorInfo, meet, nac, seq_info, shaped
from .registry import Ctx, register

MAX_BODY_ROUNDS = 4


def _outputs(res, graph) -> list:
    return [res.state.get(o.name, nac("subgraph output never produced")) for o in graph.output]


@register("If", "ISDOS", "control flow", note="Merge of both branches; a constant condition selects one")
def if_op(ctx: Ctx) -> list:
    cond = ctx.values(0)
    then_g, else_g = ctx.attr("then_branch"), ctx.attr("else_branch")
    an = ctx.analyzer
    then_out: list[TensorInfo] = []
    else_out: list[TensorInfo] = []
    taken = None
    if cond is not None and cond[0] is not None and len(cond) == 1:
        taken = bool(cond[0])
    if taken is not False:
        r = an.run_subgraph(then_g, [], ctx.scope, ctx.name + "/then")
        ctx.constraints.extend(r.constraints if taken else [])
        then_out = _outputs(r, then_g)
    if taken is not True:
        r = an.run_subgraph(else_g, [], ctx.scope, ctx.name + "/else")
        ctx.constraints.extend(r.constraints if taken is False else [])
        else_out = _outputs(r, else_g)
    if taken is True:
        return then_out
    if taken is False:
        return else_out
    outs = []
    for a, b in zip(then_out, else_out):
        m = meet(a, b)
        if m is not None and m.kind == "nac" and (a.kind != "nac" and b.kind != "nac"):
            m = m.with_reason("If branches produce different shapes (Merge)")
        outs.append(m)
    return outs


def _forget(t: TensorInfo, name: str | None) -> TensorInfo:
    """Dims/values that mention the iteration counter vary per iteration: nac."""
    if name is None or t is None or t.is_seq or t.dims is None:
        return t

    def uses(d):
        return isinstance(d, Expr) and name in d.symbols()
    if not any(uses(d) for d in t.dims) and not (t.value and any(uses(v) for v in t.value)):
        return t
    dims = tuple(None if uses(d) else d for d in t.dims)
    value = None if t.value is None else tuple(None if uses(v) else v for v in t.value)
    return TensorInfo(dims, t.dtype, value, "depends on the loop iteration")


def _strip_value(t: TensorInfo) -> TensorInfo:
    if t is None or t.is_seq:
        return t
    return TensorInfo(t.dims, t.dtype, None, t.reason)


@register("Loop", "ISVDOS", "control flow", note="trip-count axes known only for a proven trip count")
def loop_op(ctx: Ctx) -> list:
    body = ctx.attr("body")
    m_v = ctx.dim_values(0) if ctx.inp(0) is not None else None
    cond_in = ctx.inp(1)
    carried = list(ctx.inputs[2:])
    n_carried = len(carried)
    trip: Dim = None
    cond_v = cond_in.value if cond_in is not None else None
    # body: (iter_num, cond, carried...) -> (cond, carried..., scan outputs...)
    state: list[TensorInfo | None] = [_strip_value(c) if c is not None else nac("missing loop input")
                                      for c in carried]
    # with a known trip count M the iteration counter is a body-local symbol in [0, M-1]
    it_name = None
    it_upper = 0
    if m_v is not None and isinstance(m_v[0], int) and m_v[0] >= 1:
        it_name = "__iter_" + re.sub(r"\W", "_", ctx.name)
        it_upper = m_v[0] - 1
    iter_info = shaped((), TensorProto.INT64, (sym(it_name),) if it_name else None)
    cond_info = shaped((), TensorProto.BOOL, cond_v if cond_v is not None else None)
    res = None
    outs: list = []
    with symbol_upper_bound(it_name or "__none__", it_upper):
        for _ in range(MAX_BODY_ROUNDS):
            res = ctx.analyzer.run_subgraph(body, [iter_info, cond_info] + state, ctx.scope, ctx.name + "/body")
            outs = [_forget(o, it_name) for o in _outputs(res, body)]
            new_state = [meet(s, _strip_value(o)) for s, o in zip(state, outs[1:1 + n_carried])]
            if new_state == state:
                break
            state = new_state
        else:
            state = [nac("loop-carried shape does not converge") for _ in state]
    body_cond = outs[0] if outs else None
    cond_always_true = (ctx.inp(1) is None or (cond_v is not None and cond_v[0] is True)) and (
        body_cond is not None and body_cond.value is not None and body_cond.value[0] is True)
    if m_v is not None and m_v[0] is not None and cond_always_true:
        trip = m_v[0]
    elif m_v is not None and isinstance(m_v[0], int) and m_v[0] == 0:
        trip = 0
    results = list(state)
    for o in outs[1 + n_carried:]:
        if o is None or o.dims is None:
            results.append(nac("loop scan output rank unknown"))
        else:
            results.append(shaped((trip,) + tuple(o.dims), o.dtype, None,
                                  None if trip is not None else "loop trip count depends on data"))
    return results[:ctx.n_out]


@register("Scan", "ISDOS", "control flow")
def scan_op(ctx: Ctx) -> list:
    body = ctx.attr("body")
    n_scan = ctx.attr("num_scan_inputs")
    v8 = ctx.opset < 9  # opset 8: leading batch axis everywhere, sequence axis 1
    ins = list(ctx.inputs[1:] if v8 else ctx.inputs)
    n_state = len(ins) - n_scan
    states, scans = ins[:n_state], ins[n_state:]
    in_axes = ctx.attr("scan_input_axes") or [0] * n_scan
    seq: Dim = None
    batch: Dim = None
    slices = []
    for t, ax in zip(scans, in_axes):
        if t is None or t.dims is None:
            slices.append(nac("scan input rank unknown"))
            continue
        if v8:
            batch = t.dims[0]
            seq = t.dims[1] if seq is None else seq
            slices.append(shaped(t.dims[2:], t.dtype))
            continue
        a = (ax + len(t.dims)) % len(t.dims)
        seq = t.dims[a] if seq is None else seq
        slices.append(shaped(tuple(d for i, d in enumerate(t.dims) if i != a), t.dtype))
    st: list[TensorInfo | None] = [_strip_value(s) for s in states]
    if v8:
        st = [shaped(s.dims[1:], s.dtype) if s is not None and s.dims else nac("state rank unknown") for s in st]
    outs: list = []
    for _ in range(MAX_BODY_ROUNDS):
        res = ctx.analyzer.run_subgraph(body, st + slices, ctx.scope, ctx.name + "/body")
        outs = _outputs(res, body)
        new = [meet(s, _strip_value(o)) for s, o in zip(st, outs[:n_state])]
        if new == st:
            break
        st = new
    results = [shaped((batch,) + tuple(s.dims), s.dtype) if v8 and s is not None and s.dims is not None else s
               for s in st]
    out_axes = ctx.attr("scan_output_axes") or [0] * (len(outs) - n_state)
    for o, ax in zip(outs[n_state:], out_axes):
        if o is None or o.dims is None:
            results.append(nac("scan output rank unknown"))
            continue
        if v8:
            results.append(shaped((batch, seq) + tuple(o.dims), o.dtype))
            continue
        r = len(o.dims) + 1
        dims = list(o.dims)
        dims.insert((ax + r) % r, seq)
        results.append(shaped(dims, o.dtype))
    return results[:ctx.n_out]


@register("SequenceMap", "ISDOS", "control flow")
def sequence_map(ctx: Ctx) -> list:
    body = ctx.attr("body")
    seq = ctx.inp(0)
    items = seq.seq_items if seq is not None and seq.is_seq else None
    extra = list(ctx.inputs[1:])
    if items is None:
        elem = seq.elem if seq is not None and seq.is_seq else None
        args = [elem] + [e.elem if e is not None and e.is_seq else e for e in extra]
        res = ctx.analyzer.run_subgraph(body, args, ctx.scope, ctx.name + "/body")
        return [seq_info(o, None) for o in _outputs(res, body)]
    per_out: list[list] = [[] for _ in body.output]
    for k, it in enumerate(items):
        args = [it] + [(e.seq_items[k] if e is not None and e.is_seq and e.seq_items else
                        (e.elem if e is not None and e.is_seq else e)) for e in extra]
        res = ctx.analyzer.run_subgraph(body, args, ctx.scope, ctx.name + f"/body{k}")
        for j, o in enumerate(_outputs(res, body)):
            per_out[j].append(o)
    outs = []
    for lst in per_out:
        elem = None
        for o in lst:
            elem = meet(elem, o)
        outs.append(seq_info(elem, tuple(lst)))
    return outs


# --- the paper's extended-graph control flow (custom domain): Switch routes its data input
# to one of its outputs by a predicate; Combine forwards whichever input was produced.
@register("Switch", "EDO", "control flow", custom=True)
def switch(ctx: Ctx) -> list:
    data = ctx.inp(0)
    return [data if data is not None else nac("Switch data missing") for _ in range(ctx.n_out)]


@register("Combine", "ISDOS", "control flow", custom=True)
def combine(ctx: Ctx) -> list:
    out = None
    for t in ctx.inputs:
        if t is not None:
            out = meet(out, TensorInfo(t.dims, t.dtype, None, t.reason) if not t.is_seq else t)
    return [out if out is not None else nac("Combine without inputs")]


