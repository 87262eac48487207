"""Which cut set to run: predicted CPU time and activation memory of each candidate, and the choice.

Why a cost model: every segment boundary lets our arena hold a tensor (less memory) but costs an
onnxruntime ``Run`` (thread-pool hand-off, binding), and a tensor kept *inside* a segment is
allocated by onnxruntime per run (mmap-backed above glibc's pinned threshold: page faults on
every run). Which cut pays for itself depends on the machine, so the costs come from a table
measured on it (``cost_table.py``); this module is the pure arithmetic over that table.

Candidates form a curve: the finest memory-driven partition, then adjacent segments merged one
pair at a time (the merge that adds the least memory per second saved first) while a merge still
saves time, and at the end one plain onnxruntime session over the whole model. With no budget
the planner takes the fastest point whose activation peak stays within ``memory_target`` ×
onnxruntime's; where no point saves at least ``fallback_min_saving`` of onnxruntime's
activations, one plain session is cheaper on both counts and the planner says so.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

#: Ops whose kernel time grows with multiply-accumulates (the rest: with bytes moved).
MAC_OPS = {"Conv", "FusedConv", "ConvTranspose", "Gemm", "FusedGemm", "MatMul", "FusedMatMul", "Attention"}


@dataclass(frozen=True)
class CostTable:
    """CPU seconds the planner compares cut sets with, measured once per machine (cost_table.py)."""

    run_overhead_s: float      # one segment ``Run`` through IOBinding, beyond its kernels
    fault_s_per_mb: float      # first touch of a fresh mmap-backed MiB (page faults + zeroing)
    mac_s: float               # one multiply-accumulate in onnxruntime's convolution/GEMM kernels
    byte_s: float              # one byte read or written by an element-wise kernel
    # what a plain onnxruntime session's arena holds over a sequence of input shapes, per byte of
    # activations live at once at the largest of them (its regions grow by doubling and never shrink)
    ort_arena_factor: float = 1.0
    # the same for the lean single session the planner falls back to (runtime/ort_executor.py, OrtExecutor);
    # None: as ort_arena_factor (a table given without it)
    lean_arena_factor: float | None = None
    threads: int = 1
    source: str = "given"      # "measured" / "cached" (cost_table.py) or "given" (tests, tools)


@dataclass(frozen=True)
class NodeCost:
    """What the cost model needs to know about one node (at the planner's reference shape)."""

    inputs: tuple[str, ...]          # activations it reads (weights excluded)
    outputs: tuple[str, ...]
    macs: int = 0                    # multiply-accumulates (MAC_OPS), else 0
    moved_bytes: int = 0             # bytes read + written (element-wise work)


@dataclass(frozen=True)
class ModelFacts:
    """The graph as the cost model sees it: nodes, tensor sizes, outputs and mergeable segments.

    ``sizes``: bytes per tensor at the reference shape (missing or None: unknown, counted as 0).
    ``fixed``: segment groups (by their first node) that must stay as they are (control flow,
    data-dependent ops, a banded stem); ``weights``: weight bytes per node (a cap on merged
    segments keeps swapping units small).
    """

    nodes: Sequence[NodeCost]
    sizes: Mapping[str, int | None]
    graph_outputs: frozenset[str]
    mmap_threshold: int = 128 * 1024
    session_bytes: int = 256 * 1024
    weights: Mapping[int, int] = field(default_factory=dict)
    max_segment_weight_bytes: int | None = None

    def size(self, name: str) -> int:
        return int(self.sizes.get(name) or 0)

    @property
    def sized(self) -> bool:
        """Whether any tensor a node produces has a known, non-zero size."""
        return any(self.size(t) for node in self.nodes for t in node.outputs)


@dataclass(frozen=True)
class CutPoint:
    """One candidate: its segments (node lists in run order) and what the model predicts for it."""

    groups: tuple[tuple[int, ...], ...]
    latency_s: float
    activation_bytes: int
    single_session: bool = False
    lean: bool = False               # the single session with lean options (``single_session(lean=True)``)

    @property
    def sessions(self) -> int:
        return 1 if self.single_session else len(self.groups)

    def describe(self) -> dict:
        return {"segments": self.sessions, "single_session": self.single_session, "lean": self.lean,
                "latency_ms": round(self.latency_s * 1e3, 3), "activation_bytes": self.activation_bytes}


@dataclass(frozen=True)
class CutChoice:
    """The curve, the point chosen and why (``dynnet plan`` and ``Engine.stats()`` show it)."""

    curve: tuple[CutPoint, ...]
    chosen: CutPoint
    onnxruntime: CutPoint          # one plain session: onnxruntime's predicted activations
    reason: str

    @property
    def fallback(self) -> bool:
        return self.chosen.single_session

    @property
    def session(self) -> CutPoint:
        """The single session a fallback runs: the lean one where the curve has it."""
        return next((p for p in self.curve if p.lean), self.onnxruntime)

    def describe(self) -> dict:
        return {"chosen": self.curve.index(self.chosen), "fallback": self.fallback, "reason": self.reason,
                "onnxruntime_activation_bytes": self.onnxruntime.activation_bytes,
                "curve": [p.describe() for p in self.curve]}


# --------------------------------------------------------------------------- predictions

def kernel_seconds(facts: ModelFacts, table: CostTable) -> float:
    """Predicted kernel time of the whole model: the same in every cut set."""
    return sum(n.macs * table.mac_s + n.moved_bytes * table.byte_s for n in facts.nodes)


def onnxruntime_activation(facts: ModelFacts, order: Sequence[int] | None = None) -> int:
    """Most activation bytes live at once when one session runs the nodes in ``order`` (default:
    as listed): what onnxruntime's arena must hold at least (graph inputs excluded, they are the
    caller's)."""
    order = list(range(len(facts.nodes))) if order is None else list(order)
    return _live_peak(facts, order, internal_only=False)


def _live_peak(facts: ModelFacts, members: Sequence[int], *, internal_only: bool) -> int:
    """Peak bytes live while ``members`` run in order: tensors they produce, each from its producer
    to its last reader among them (to the end if read later or a graph output). ``internal_only``:
    only tensors nothing outside ``members`` reads (the rest are boundary tensors in our arena)."""
    inside = set(members)
    consumers = _consumers(facts)
    last: dict[str, int] = {}
    for k, n in enumerate(members):
        for t in facts.nodes[n].inputs:
            last[t] = k
    live = peak = 0
    frees: dict[int, int] = {}
    for k, n in enumerate(members):
        for t in facts.nodes[n].outputs:
            escapes = t in facts.graph_outputs or any(c not in inside for c in consumers.get(t, ()))
            if escapes and internal_only:
                continue
            size = facts.size(t)
            live += size
            end = len(members) if escapes or t not in last else last[t]
            frees[end] = frees.get(end, 0) + size
        peak = max(peak, live)
        live -= frees.pop(k, 0)
    return peak


def _consumers(facts: ModelFacts) -> dict[str, list[int]]:
    cached = facts.__dict__.get("_consumers_cache")
    if cached is None:
        cached = {}
        for i, node in enumerate(facts.nodes):
            for t in node.inputs:
                cached.setdefault(t, []).append(i)
        object.__setattr__(facts, "_consumers_cache", cached)
    return cached


@dataclass
class _Evaluation:
    """Per-segment parts of a partition's prediction, so one merge is re-evaluated locally."""

    live: list[set[str]]      # boundary tensors live while each segment runs
    boundary: list[int]       # their bytes
    internal: list[int]       # peak bytes of each segment's internal tensors
    faulted: list[int]        # bytes of internal tensors above the mmap threshold (faulted per run)


def _segment_internal(facts: ModelFacts, members: Sequence[int]) -> tuple[int, int]:
    inside = set(members)
    peak = _live_peak(facts, members, internal_only=True)
    consumers = _consumers(facts)
    faulted = 0
    for n in members:
        for t in facts.nodes[n].outputs:
            internal = t not in facts.graph_outputs and all(c in inside for c in consumers.get(t, ()))
            if internal and facts.size(t) >= facts.mmap_threshold:
                faulted += facts.size(t)
    return peak, faulted


def _evaluate(facts: ModelFacts, groups: Sequence[Sequence[int]]) -> _Evaluation:
    segment_of = {n: s for s, g in enumerate(groups) for n in g}
    consumers = _consumers(facts)
    live: list[set[str]] = [set() for _ in groups]
    for s, group in enumerate(groups):
        for n in group:
            for t in facts.nodes[n].outputs:
                readers = [segment_of[c] for c in consumers.get(t, ()) if c in segment_of]
                end = len(groups) - 1 if t in facts.graph_outputs else max(readers, default=s)
                if end > s:
                    for k in range(s, end + 1):
                        live[k].add(t)
                elif t in facts.graph_outputs:
                    live[s].add(t)
    parts = [_segment_internal(facts, g) for g in groups]
    return _Evaluation(live, [sum(facts.size(t) for t in ts) for ts in live],
                       [p for p, _ in parts], [f for _, f in parts])


def _predict(facts: ModelFacts, table: CostTable, kernels_s: float, ev: _Evaluation) -> tuple[float, int]:
    runs = len(ev.live)
    latency = kernels_s + runs * table.run_overhead_s + sum(ev.faulted) / (1 << 20) * table.fault_s_per_mb
    activation = max(ev.boundary, default=0) + max(ev.internal, default=0) + runs * facts.session_bytes
    return latency, activation


def evaluate(facts: ModelFacts, table: CostTable, groups: Sequence[Sequence[int]]) -> CutPoint:
    """The predicted latency and activation peak of running ``groups`` as segments."""
    latency, activation = _predict(facts, table, kernel_seconds(facts, table), _evaluate(facts, groups))
    return CutPoint(tuple(tuple(g) for g in groups), latency, activation)


def single_session(facts: ModelFacts, table: CostTable, order: Sequence[int] | None = None, *,
                   lean: bool = False) -> CutPoint:
    """One plain onnxruntime session over the whole model: its own arena (no faults per run), which
    holds ``ort_arena_factor`` x the activations live at once (``lean``: the lean session's
    ``lean_arena_factor``)."""
    order = tuple(range(len(facts.nodes))) if order is None else tuple(order)
    factor = table.lean_arena_factor if lean and table.lean_arena_factor is not None else table.ort_arena_factor
    held = int(onnxruntime_activation(facts, order) * factor)
    return CutPoint((order,), kernel_seconds(facts, table) + table.run_overhead_s, held + facts.session_bytes,
                    single_session=True, lean=lean)


# --------------------------------------------------------------------------- curve and choice

def merge_curve(facts: ModelFacts, table: CostTable, groups: Sequence[Sequence[int]],
                mergeable: Callable[[int], bool] = lambda s: True) -> list[CutPoint]:
    """Points from ``groups`` merging adjacent pairs while a merge saves predicted time.

    ``mergeable(s)``: whether segment ``s`` of ``groups`` may join a neighbour (control flow,
    data-dependent ops and a banded stem may not). Each step takes, among merges that save time,
    one that adds no memory if any (the most time saved), else the least memory added per
    second saved; the curve stops when no merge saves time.
    """
    kernels_s = kernel_seconds(facts, table)
    current = [list(g) for g in groups]
    movable = [mergeable(s) for s in range(len(current))]
    ev = _evaluate(facts, current)
    latency, activation = _predict(facts, table, kernels_s, ev)
    points = [CutPoint(tuple(tuple(g) for g in current), latency, activation)]
    while True:
        best = None
        for s in range(len(current) - 1):
            if not (movable[s] and movable[s + 1]) or not _weight_fits(facts, current[s] + current[s + 1]):
                continue
            trial = _merged(facts, current, ev, s)
            t_latency, t_activation = _predict(facts, table, kernels_s, trial)
            saved = latency - t_latency
            if saved <= 0:
                continue
            added = t_activation - activation
            key = (0, -saved) if added <= 0 else (1, added / saved)
            if best is None or key < best[0]:
                best = (key, s, trial, t_latency, t_activation)
        if best is None:
            return points
        _, s, ev, latency, activation = best
        current[s:s + 2] = [current[s] + current[s + 1]]
        movable[s:s + 2] = [True]
        points.append(CutPoint(tuple(tuple(g) for g in current), latency, activation))


def _weight_fits(facts: ModelFacts, members: Sequence[int]) -> bool:
    cap = facts.max_segment_weight_bytes
    return cap is None or sum(facts.weights.get(n, 0) for n in members) <= cap


def _merged(facts: ModelFacts, groups: list[list[int]], ev: _Evaluation, s: int) -> _Evaluation:
    """``ev`` with segments ``s`` and ``s + 1`` merged (only what that merge changes is recomputed)."""
    members = groups[s] + groups[s + 1]
    inside = set(members)
    consumers = _consumers(facts)
    hidden = {t for n in groups[s] for t in facts.nodes[n].outputs
              if t not in facts.graph_outputs and consumers.get(t)
              and all(c in inside for c in consumers[t])}
    live = ev.live[:s] + [(ev.live[s] | ev.live[s + 1]) - hidden] + ev.live[s + 2:]
    boundary = ev.boundary[:s] + [sum(facts.size(t) for t in live[s])] + ev.boundary[s + 2:]
    peak, faulted = _segment_internal(facts, members)
    return _Evaluation(live, boundary, ev.internal[:s] + [peak] + ev.internal[s + 2:],
                       ev.faulted[:s] + [faulted] + ev.faulted[s + 2:])


def choose(curve: Sequence[CutPoint], onnxruntime: CutPoint, *, session: CutPoint | None = None,
           memory_target: float = 0.6, fallback_min_saving: float = 0.1, sized: bool = True) -> CutChoice:
    """The fastest point within ``memory_target`` × onnxruntime's activations; else the leanest
    point; one session where no point saves ``fallback_min_saving`` of that session's, or where
    nothing is ``sized`` (no tensor size known: nothing for the arena to hold).

    ``session``: the single session a fallback runs (the lean one): a cut set must save against
    it, while ``onnxruntime`` (default options) stays the reference of the target and the ratios.
    It does not compete within the target: its figure comes from a factor measured on a small
    model (cost_table.py), where a cut set's is planned, and the "auto" profile times the pick
    against onnxruntime anyway (backends/cut_timing.py). Without it, or where it does not save
    ``fallback_min_saving`` of onnxruntime's activations either, the fallback is ``onnxruntime``
    itself: a lean session allocates every tensor on every run, which costs time where tensors
    are many and small (a recurrent model's step) and buys nothing where they hold little."""
    if not curve:
        raise ValueError("the curve has no points")
    if memory_target <= 0 or not 0 <= fallback_min_saving < 1:
        raise ValueError(f"memory_target must be > 0 and fallback_min_saving in [0, 1), got "
                         f"{memory_target}, {fallback_min_saving}")
    if session is not None and session.activation_bytes > (1 - fallback_min_saving) * onnxruntime.activation_bytes:
        session = None
    single = session or onnxruntime
    points = tuple(curve) + (onnxruntime,) + (() if session is None else (session,))
    reference = onnxruntime.activation_bytes
    leanest = min(curve, key=lambda p: (p.activation_bytes, p.latency_s))
    name = "one lean onnxruntime session" if single.lean else "one onnxruntime session"
    if not sized:
        return CutChoice(points, single, onnxruntime,
                         f"{name}: no tensor of the graph has a known size at the reference "
                         "shape, so the planner has nothing to place in its arena")
    if leanest.activation_bytes > (1 - fallback_min_saving) * single.activation_bytes:
        held = ("" if single is onnxruntime else
                f", and {name} {single.activation_bytes / reference:.2f}x")
        return CutChoice(points, single, onnxruntime,
                         f"{name}: the leanest cut set would hold "
                         f"{leanest.activation_bytes / reference:.2f}x onnxruntime's activations{held} (it saves "
                         f"less than {fallback_min_saving:.0%} over {name}), so cutting the graph would cost time "
                         "for no memory")
    target = memory_target * reference
    within = [p for p in curve if p.activation_bytes <= target]
    if within:
        chosen = min(within, key=lambda p: (p.latency_s, p.activation_bytes))
        reason = (f"fastest cut set within {memory_target:.2f}x onnxruntime's activations "
                  f"({chosen.activation_bytes / reference:.2f}x, {chosen.sessions} segments)")
    else:
        chosen = leanest
        reason = (f"no cut set reaches {memory_target:.2f}x onnxruntime's activations; the leanest "
                  f"({chosen.activation_bytes / reference:.2f}x, {chosen.sessions} segments)")
    return CutChoice(points, chosen, onnxruntime, reason)
