"""Static execution order: pick a topological order of a DAG that keeps peak live bytes low.

Model (the same one the arena planner consumes): a tensor produced by a node is live from its
producer's step to its last consumer's step inclusive, i.e. the half-open lifetime
``[producer step, last use + 1)``; graph outputs stay live to the end; tensors no node produces
(graph inputs, weights) are not in the arena and cost nothing. The memory at step ``t`` is the
sum of sizes live at ``t`` — so a node's inputs and outputs count together while it runs — and
the peak is the maximum over steps, which equals ``lower_bound`` of the lifetimes.

Sizes may depend on runtime shapes: pass several ``size_of`` callables (one per representative
shape binding, e.g. evaluated RDP expressions). ``objective="max"`` minimises the largest peak
over the bindings — exact in the DP because ``max_b max_t = max_t max_b``; ``"mean"`` minimises
the peak of the mean live bytes (a proxy for the expected peak).

Search: exact dynamic programming over down-sets (sets of already-executed nodes; the live set
depends only on the down-set) when the number of down-sets stays within ``max_states``;
otherwise greedy list scheduling with several scoring rules plus the series-parallel trick
(among independent branches run first the one whose residual output is smaller), then exact
DP on sliding windows of the best order, which never worsens it (a window's end state is fixed).
The input order is always a candidate, so the result is never worse than it.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "OpNode",
    "OrderResult",
    "best_order",
    "exact_order",
    "heuristic_order",
    "is_topological",
    "lifetimes_to_buffers",
    "order_for_executor",
    "peak_live_bytes",
    "tensor_lifetimes",
]

SizeOf = Callable[[str], int]
Sizes = SizeOf | Sequence[SizeOf] | Mapping[str, int]


@dataclass(frozen=True)
class OpNode:
    """One operator: the tensor names it reads and writes."""

    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


@dataclass
class OrderResult:
    """A chosen order (indices into the node list), its peak, and how it was found."""

    order: list[int]
    peak: int
    exact: bool  # True when the DP covered the whole graph (the order is optimal)
    method: str  # "exact" | "heuristic" | "input"
    input_peak: int


# --------------------------------------------------------------------------- graph indexing
class _Graph:
    """Dense integer view: producers, consumers, per-binding tensor sizes, predecessor masks."""

    def __init__(self, nodes: Sequence, sizes: Sizes, graph_outputs: Iterable[str],
                 objective: str = "max"):
        if objective not in ("max", "mean"):
            raise ValueError(f"objective must be 'max' or 'mean', got {objective!r}")
        self.objective = objective
        self.n = len(nodes)
        if isinstance(sizes, Mapping):
            table = sizes

            def lookup(t: str) -> int:
                try:
                    return table[t]
                except KeyError:
                    raise ValueError(f"no size for tensor {t!r}") from None

            fns: list[SizeOf] = [lookup]
        else:
            fns = [sizes] if callable(sizes) else list(sizes)
        if not fns or not all(callable(f) for f in fns):
            raise ValueError("size_of must be a callable or a non-empty sequence of callables")
        self.ins: list[list[int]] = []
        self.outs: list[list[int]] = []
        tid: dict[str, int] = {}
        self.names: list[str] = []
        producer: list[int] = []
        for v, node in enumerate(nodes):
            try:
                _, node_outputs = node.inputs, node.outputs  # both must exist
            except AttributeError:
                raise ValueError(f"node {v}: needs .inputs and .outputs") from None
            outs = []
            for t in node_outputs:
                if not t:
                    continue  # ONNX optional output left empty
                if t in tid:
                    raise ValueError(f"tensor {t!r} is produced by two nodes")
                tid[t] = len(self.names)
                self.names.append(t)
                producer.append(v)
                outs.append(tid[t])
            self.outs.append(outs)
        for node in nodes:
            self.ins.append(sorted({tid[t] for t in node.inputs if t in tid}))
        self.producer = producer
        T = len(self.names)
        self.consumers: list[list[int]] = [[] for _ in range(T)]
        for v in range(self.n):
            for t in self.ins[v]:
                self.consumers[t].append(v)
        outs_set = set(graph_outputs)
        self.is_output = [name in outs_set for name in self.names]
        # size vectors per binding (ints); validated once
        self.B = len(fns)
        self.size: list[tuple[int, ...]] = []
        for name in self.names:
            vals = []
            for f in fns:
                s = f(name)
                if isinstance(s, bool) or not isinstance(s, int):
                    try:
                        s = int(s)
                    except (TypeError, ValueError):
                        raise ValueError(f"size of {name!r} is not an int: {s!r}") from None
                if s < 0:
                    raise ValueError(f"size of {name!r} is negative: {s}")
                vals.append(s)
            self.size.append(tuple(vals))
        self.cmask = [0] * T
        for t in range(T):
            for c in self.consumers[t]:
                self.cmask[t] |= 1 << c
        self.pred_mask = [0] * self.n
        self.succ: list[list[int]] = [[] for _ in range(self.n)]
        for v in range(self.n):
            m = 0
            for t in self.ins[v]:
                p = producer[t]
                if p == v:
                    raise ValueError(f"node {v} reads its own output {self.names[t]!r}")
                m |= 1 << p
            self.pred_mask[v] = m
        # Sources read nothing from the arena (only graph inputs / weights). Running one right
        # before its first consumer never raises the peak when none of its outputs is dead
        # (all of them are then live at that consumer's step anyway), so the search attaches
        # such sources to that consumer. A source with a dead output stays a normal node.
        self.source_mask = 0
        for v in range(self.n):
            outs = self.outs[v]
            if (self.pred_mask[v] == 0 and any(self.consumers[t] for t in outs)
                    and all(self.consumers[t] or self.is_output[t] for t in outs)):
                self.source_mask |= 1 << v
        for v in range(self.n):
            m = self.pred_mask[v]
            while m:
                low = m & -m
                self.succ[low.bit_length() - 1].append(v)
                m ^= low

    # scalarise a per-binding vector under the objective
    def scalar(self, vec: Sequence[int]) -> int:
        if self.B == 1:
            return vec[0]
        if self.objective == "max":
            return max(vec)
        return sum(vec) // self.B

    def out_bytes(self, v: int) -> list[int]:
        acc = [0] * self.B
        for t in self.outs[v]:
            for b, s in enumerate(self.size[t]):
                acc[b] += s
        return acc


def _check_order(g: _Graph, order: Sequence[int]) -> None:
    if sorted(order) != list(range(g.n)):
        raise ValueError("order must be a permutation of the node indices")
    done = 0
    for v in order:
        if g.pred_mask[v] & ~done:
            raise ValueError(f"order is not topological: node {v} runs before an input producer")
        done |= 1 << v


def _simulate(g: _Graph, order: Sequence[int]) -> tuple[list[int], int]:
    """Per-binding peaks of an order and the scalar objective (max over steps)."""
    pos = [0] * g.n
    for k, v in enumerate(order):
        pos[v] = k
    steps = len(order)
    delta = [[0] * (steps + 1) for _ in range(g.B)]
    for t, (s, e) in enumerate(_lifetimes_idx(g, pos, steps)):
        for b, sz in enumerate(g.size[t]):
            delta[b][s] += sz
            delta[b][e] -= sz
    peaks = [0] * g.B
    scalar_peak = 0
    live = [0] * g.B
    for k in range(steps):
        for b in range(g.B):
            live[b] += delta[b][k]
            if live[b] > peaks[b]:
                peaks[b] = live[b]
        sc = g.scalar(live)
        if sc > scalar_peak:
            scalar_peak = sc
    return peaks, scalar_peak


def _lifetimes_idx(g: _Graph, pos: Sequence[int], steps: int) -> list[tuple[int, int]]:
    out = []
    for t in range(len(g.names)):
        s = pos[g.producer[t]]
        e = steps if g.is_output[t] else max((pos[c] for c in g.consumers[t]), default=s) + 1
        out.append((s, e))
    return out


# --------------------------------------------------------------------------- public helpers
def is_topological(order: Sequence[int], nodes: Sequence) -> bool:
    """True when ``order`` is a permutation that runs every producer before its consumers."""
    g = _Graph(nodes, lambda _t: 0, ())
    try:
        _check_order(g, order)
    except ValueError:
        return False
    return True


def tensor_lifetimes(order: Sequence[int], nodes: Sequence,
                     graph_outputs: Iterable[str] = ()) -> dict[str, tuple[int, int]]:
    """``{tensor: (first def step, last use step + 1)}`` for every tensor a node produces.

    Graph outputs end at ``len(order)``; an output nobody reads lives only during its step.
    """
    g = _Graph(nodes, lambda _t: 0, graph_outputs)
    _check_order(g, order)
    pos = [0] * g.n
    for k, v in enumerate(order):
        pos[v] = k
    return {g.names[t]: se for t, se in enumerate(_lifetimes_idx(g, pos, len(order)))}


def lifetimes_to_buffers(lifetimes: Mapping[str, tuple[int, int]],
                         size_of: SizeOf | Mapping[str, int]) -> tuple[list[str], list[tuple[int, int, int]]]:
    """Names and ``(start, end, nbytes)`` buffers, ready for ``plan_offsets``.

    ``size_of`` takes the forms ``best_order`` takes for one binding: a ``{tensor: bytes}``
    mapping or a callable. A tensor without a size raises ValueError naming it."""
    size = size_of.__getitem__ if isinstance(size_of, Mapping) else size_of
    names = list(lifetimes)
    buffers = []
    for name in names:
        try:
            nbytes = int(size(name))
        except KeyError:
            raise ValueError(f"no size for tensor {name!r}") from None
        buffers.append((lifetimes[name][0], lifetimes[name][1], nbytes))
    return names, buffers


def peak_live_bytes(order: Sequence[int], nodes: Sequence, size_of: Sizes,
                    graph_outputs: Iterable[str] = (), objective: str = "max") -> int:
    """Peak live bytes of running ``nodes`` in ``order`` (scalarised over bindings)."""
    g = _Graph(nodes, size_of, graph_outputs, objective)
    _check_order(g, order)
    return _simulate(g, order)[1]


# --------------------------------------------------------------------------- exact DP
def _dp(g: _Graph, sub: Sequence[int], done0: int, live0: list[int],
        max_states: int) -> tuple[list[int], int] | None:
    """Exact min-peak order of the nodes ``sub`` (a convex set), given that the nodes in
    ``done0`` have run and ``live0`` bytes are live. Returns (order, peak) or None when the
    number of down-sets exceeds ``max_states``.

    Down-sets are explored layer by layer; the live bytes of a state depend only on its set,
    so each state keeps the best peak reaching it and a back-pointer.
    """
    B = g.B
    rng_b = range(B)
    sub_mask = 0
    for v in sub:
        sub_mask |= 1 << v
    # sources attached to their first consumer inside this sub-graph
    auto = 0
    for v in sub:
        if (g.source_mask >> v) & 1 and any(
                (sub_mask >> c) & 1 for t in g.outs[v] for c in g.consumers[t]):
            auto |= 1 << v
    cands = [v for v in sub if not (auto >> v) & 1]
    out_b = {v: g.out_bytes(v) for v in sub}
    # per node: inputs that may be freed by it (consumer mask, size), and dead outputs
    free_in: dict[int, list[tuple[int, tuple[int, ...]]]] = {}
    dead_out: dict[int, list[int]] = {}
    for v in sub:
        free_in[v] = [(g.cmask[t], g.size[t]) for t in g.ins[v] if not g.is_output[t]]
        d = [0] * B
        for t in g.outs[v]:
            if not g.is_output[t] and not g.consumers[t]:
                for b in rng_b:
                    d[b] += g.size[t][b]
        dead_out[v] = d
    pred = g.pred_mask
    scalar = g.scalar
    layer: dict[int, tuple[int, tuple[int, ...]]] = {0: (0, tuple(live0))}
    back: dict[int, tuple[int, int]] = {}
    states = 1
    for _k in range(len(cands)):
        nxt: dict[int, tuple[int, tuple[int, ...]]] = {}
        for mask, (peak, live) in layer.items():
            done = done0 | mask
            for v in cands:
                bit = 1 << v
                if done & bit or pred[v] & ~(done | auto):
                    continue
                pending = pred[v] & auto & ~done
                if pending:
                    ob = list(out_b[v])
                    pm = pending
                    while pm:
                        low = pm & -pm
                        u = low.bit_length() - 1
                        pm ^= low
                        for b in rng_b:
                            ob[b] += out_b[u][b]
                    bit |= pending
                else:
                    ob = out_b[v]
                if B == 1:
                    during0 = live[0] + ob[0]
                    p = peak if peak >= during0 else during0
                    nd = done | bit
                    fr = dead_out[v][0]
                    for cm, sz in free_in[v]:  # (pending sources have no arena inputs)
                        if not cm & ~nd:
                            fr += sz[0]
                    nl: tuple[int, ...] = (during0 - fr,)
                else:
                    during = [live[b] + ob[b] for b in rng_b]
                    p = max(peak, scalar(during))
                    nd = done | bit
                    fr_v = list(dead_out[v])
                    for cm, sz in free_in[v]:
                        if not cm & ~nd:
                            for b in rng_b:
                                fr_v[b] += sz[b]
                    nl = tuple(during[b] - fr_v[b] for b in rng_b)
                nm = mask | bit
                cur = nxt.get(nm)
                if cur is None or p < cur[0]:
                    nxt[nm] = (p, nl)
                    back[nm] = (mask, v)
        states += len(nxt)
        if states > max_states:
            return None
        layer = nxt
    if len(layer) != 1 or next(iter(layer)) != sub_mask:
        raise ValueError("sub-graph has a cycle or depends on nodes outside it")
    (final_mask, (peak, _live)), = layer.items()
    order: list[int] = []
    m = final_mask
    while m:
        pm, v = back[m]
        order.append(v)
        extra = m & ~pm & ~(1 << v)
        while extra:  # attached sources run just before v
            low = extra & -extra
            order.append(low.bit_length() - 1)
            extra ^= low
        m = pm
    order.reverse()
    return order, peak


def exact_order(nodes: Sequence, size_of: Sizes, graph_outputs: Iterable[str] = (),
                objective: str = "max", max_states: int = 200_000) -> OrderResult | None:
    """Optimal order by DP over down-sets, or None if more than ``max_states`` down-sets."""
    g = _Graph(nodes, size_of, graph_outputs, objective)
    if g.n == 0:
        return OrderResult([], 0, True, "exact", 0)
    _check_acyclic(g)
    res = _dp(g, list(range(g.n)), 0, [0] * g.B, max_states)
    if res is None:
        return None
    order, peak = res
    inp = _simulate(g, list(range(g.n)))[1] if _is_topo(g, range(g.n)) else peak
    return OrderResult(order, peak, True, "exact", inp)


def _is_topo(g: _Graph, order: Iterable[int]) -> bool:
    done = 0
    for v in order:
        if g.pred_mask[v] & ~done:
            return False
        done |= 1 << v
    return True


def _check_acyclic(g: _Graph) -> None:
    indeg = [bin(m).count("1") for m in g.pred_mask]
    ready = [v for v in range(g.n) if indeg[v] == 0]
    seen = 0
    while ready:
        v = ready.pop()
        seen += 1
        for w in g.succ[v]:
            indeg[w] -= 1
            if indeg[w] == 0:
                ready.append(w)
    if seen != g.n:
        raise ValueError("graph has a cycle")


# --------------------------------------------------------------------------- heuristics
def _greedy(g: _Graph, rule: str) -> list[int]:
    """List scheduling: among ready nodes pick by ``rule`` (sources ride with their first
    consumer, their outputs counted in its allocation).

    * "net": smallest (bytes allocated - bytes freed), then smallest allocation;
    * "alloc": smallest allocation, then most freed;
    * "free": most freed, then smallest allocation;
    * "branch": finish the branch in progress first (depth-first), choosing among new
      branches the one whose eventual residual (outputs minus freed inputs) is smallest —
      the series-parallel trick.
    """
    src = g.source_mask
    remaining = [len(g.consumers[t]) for t in range(len(g.names))]
    indeg = [bin(m & ~src).count("1") for m in g.pred_mask]
    ready = {v for v in range(g.n) if indeg[v] == 0 and not (src >> v) & 1}
    done = 0
    order: list[int] = []
    last = -1
    out_b = [g.scalar(g.out_bytes(v)) for v in range(g.n)]
    while ready:
        best = None
        best_key: tuple[int, ...] | None = None
        for v in ready:
            freed = 0
            for t in g.ins[v]:
                if not g.is_output[t] and remaining[t] == 1:
                    freed += g.scalar(g.size[t])
            alloc = out_b[v]
            pending = g.pred_mask[v] & src & ~done
            while pending:
                low = pending & -pending
                alloc += out_b[low.bit_length() - 1]
                pending ^= low
            key: tuple[int, ...]
            if rule == "net":
                key = (alloc - freed, alloc, v)
            elif rule == "alloc":
                key = (alloc, -freed, v)
            elif rule == "free":
                key = (-freed, alloc, v)
            else:  # branch: prefer successors of the last node, then smallest residual
                follows = 0 if last >= 0 and v in g.succ[last] else 1
                key = (follows, alloc - freed, alloc, v)
            if best_key is None or key < best_key:
                best, best_key = v, key
        assert best is not None
        v = best
        ready.discard(v)
        pending = g.pred_mask[v] & src & ~done
        while pending:
            low = pending & -pending
            order.append(low.bit_length() - 1)
            done |= low
            pending ^= low
        order.append(v)
        done |= 1 << v
        last = v
        for t in g.ins[v]:
            remaining[t] -= 1
        for w in g.succ[v]:
            if (src >> w) & 1:
                continue
            indeg[w] -= 1
            if indeg[w] == 0:
                ready.add(w)
    # nodes nobody waits for: sources without consumers (e.g. constant graph outputs)
    order.extend(v for v in range(g.n) if not (done >> v) & 1)
    return order


def _sink_sources(g: _Graph, order: Sequence[int]) -> list[int]:
    """Move every source to just before its first consumer (never raises the peak)."""
    src = g.source_mask
    pos = {v: k for k, v in enumerate(order)}
    attach: dict[int, list[int]] = {}
    for v in order:
        if (src >> v) & 1:
            users = [c for t in g.outs[v] for c in g.consumers[t]]
            first = min(users, key=pos.__getitem__)
            attach.setdefault(first, []).append(v)
    out: list[int] = []
    for v in order:
        if (src >> v) & 1:
            continue
        out.extend(attach.get(v, ()))
        out.append(v)
    return out


def _as_late_as_possible(g: _Graph, order: Sequence[int]) -> list[int]:
    """Move every node to just before its first consumer, last nodes first.

    Why: the greedy rules schedule cheap side chains as soon as they are ready — depth's LiDAR
    densification (four full-resolution maps used only by the output head) then ran before the
    encoder and lived through it (+4.7 MB at 640x640). Moving a node later never breaks topology
    (its inputs stay before it); whether it lowers the peak is left to the simulation.
    """
    out = list(order)
    for v in reversed(list(order)):
        users = [c for t in g.outs[v] for c in g.consumers[t]]
        if not users or any(g.is_output[t] for t in g.outs[v]):
            continue
        out.remove(v)
        first = min(out.index(c) for c in users)
        out.insert(first, v)
    return out


def _window_improve(g: _Graph, order: list[int], window: int, max_states: int) -> list[int]:
    """Re-solve consecutive windows of ``order`` exactly; each window's end state is the
    same, so the peak never increases."""
    order = list(order)
    n = g.n
    if n <= 1:
        return order
    stride = max(1, window // 2)
    start = 0
    while start < n:
        end = min(n, start + window)
        done0 = 0
        for v in order[:start]:
            done0 |= 1 << v
        live0 = _live_after(g, done0)
        sub = order[start:end]
        res = _dp(g, sub, done0, live0, max_states)
        if res is not None:
            new_sub, new_peak = res
            old_peak = _window_peak(g, sub, done0, live0)
            if new_peak < old_peak:
                order[start:end] = new_sub
        if end == n:
            break
        start += stride
    return order


def _live_after(g: _Graph, done: int) -> list[int]:
    live = [0] * g.B
    for t in range(len(g.names)):
        if not (done >> g.producer[t]) & 1:
            continue
        if g.is_output[t] or any(not (done >> c) & 1 for c in g.consumers[t]):
            for b, s in enumerate(g.size[t]):
                live[b] += s
    return live


def _window_peak(g: _Graph, sub: Sequence[int], done0: int, live0: list[int]) -> int:
    live = list(live0)
    done = done0
    peak = 0
    for v in sub:
        ob = g.out_bytes(v)
        during = [live[b] + ob[b] for b in range(g.B)]
        peak = max(peak, g.scalar(during))
        done |= 1 << v
        freed = [0] * g.B
        for t in g.ins[v]:
            if not g.is_output[t] and all((done >> c) & 1 for c in g.consumers[t]):
                for b, s in enumerate(g.size[t]):
                    freed[b] += s
        for t in g.outs[v]:
            if not g.is_output[t] and not g.consumers[t]:
                for b, s in enumerate(g.size[t]):
                    freed[b] += s
        live = [during[b] - freed[b] for b in range(g.B)]
    return peak


def heuristic_order(nodes: Sequence, size_of: Sizes, graph_outputs: Iterable[str] = (),
                    objective: str = "max", input_order: Sequence[int] | None = None,
                    window: int = 12, max_states: int = 1_000) -> OrderResult:
    """Best of the greedy rules and the input order, then windowed exact DP."""
    g = _Graph(nodes, size_of, graph_outputs, objective)
    _check_acyclic(g)
    if input_order is None:
        input_order = list(range(g.n)) if _is_topo(g, range(g.n)) else _greedy(g, "net")
    else:
        _check_order(g, input_order)
    return _heuristic(g, list(input_order), window, max_states)


def _heuristic(g: _Graph, input_order: list[int], window: int, max_states: int) -> OrderResult:
    input_peak = _simulate(g, input_order)[1]
    best, best_peak, method = list(input_order), input_peak, "input"
    candidates = [("sink", lambda: _sink_sources(g, input_order))] + [
        (rule, lambda rule=rule: _greedy(g, rule)) for rule in ("net", "branch", "alloc", "free")]
    for _rule, make in candidates:
        cand = make()
        pk = _simulate(g, cand)[1]
        if pk < best_peak:
            best, best_peak, method = cand, pk, "heuristic"
    delayed = _as_late_as_possible(g, best)  # greedy rules pull cheap side chains forward
    pk = _simulate(g, delayed)[1]
    if pk < best_peak:
        best, best_peak, method = delayed, pk, "heuristic"
    if window > 1:
        improved = _window_improve(g, best, window, max_states)
        pk = _simulate(g, improved)[1]
        if pk < best_peak:
            best, best_peak, method = improved, pk, "heuristic"
    return OrderResult(best, best_peak, False, method, input_peak)


def best_order(nodes: Sequence, size_of: Sizes, graph_outputs: Iterable[str] = (),
               objective: str = "max", input_order: Sequence[int] | None = None,
               max_states: int = 20_000, window: int = 12,
               exact_max_nodes: int = 64) -> OrderResult:
    """Exact DP when the graph has at most ``exact_max_nodes`` nodes and its down-set count
    fits ``max_states``, else the heuristic (greedy rules + windowed DP).

    Never worse than ``input_order`` (default: the given node order when it is topological).
    """
    g = _Graph(nodes, size_of, graph_outputs, objective)
    if g.n == 0:
        return OrderResult([], 0, True, "exact", 0)
    _check_acyclic(g)
    if input_order is None:
        input_order = list(range(g.n)) if _is_topo(g, range(g.n)) else _greedy(g, "net")
    else:
        _check_order(g, input_order)
    res = _dp(g, list(range(g.n)), 0, [0] * g.B, max_states) if g.n <= exact_max_nodes else None
    input_peak = _simulate(g, list(input_order))[1]
    if res is not None:
        order, peak = res
        return OrderResult(order, peak, True, "exact", input_peak)
    return _heuristic(g, list(input_order), window, min(max_states, 1_000))


def order_for_executor(graph, sizes: dict[str, int | None]) -> list[int]:
    """Order for the planned engine's ``GraphIndex`` (``.nodes`` ONNX nodes, ``.consumers``
    tensor -> node indices including sub-graph outer-scope reads, ``.outputs``).

    ``sizes`` maps tensor names to bytes at a reference shape; unknown (None) sizes count as
    the median known size so they neither dominate nor vanish.
    """
    onnx_nodes = list(graph.nodes)
    reads: list[list[str]] = [[t for t in node.input if t] for node in onnx_nodes]
    for t, users in getattr(graph, "consumers", {}).items():
        for i in users:
            if t not in reads[i]:
                reads[i].append(t)
    nodes = [OpNode(node.name or f"node{i}", tuple(reads[i]), tuple(o for o in node.output if o))
             for i, node in enumerate(onnx_nodes)]
    known = sorted(int(v) for v in sizes.values() if v is not None)
    default = known[len(known) // 2] if known else 1

    def size_of(t: str) -> int:
        v = sizes.get(t)
        return default if v is None else int(v)

    return best_order(nodes, size_of, getattr(graph, "outputs", ())).order
