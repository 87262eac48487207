"""How much memory the DNNs get, and how it is split across model nodes.

Pure functions over dataclasses (no ROS, no clocks): the manager node feeds in readings and
profiles, and pushes out what these functions return.

Split: each node's latency-vs-budget table is a step function (a partition runs once its peak
fits). Its lower convex hull, scaled by the node's priority weight, gives upgrade *segments* with
non-increasing latency saved per MB. All nodes' segments are merged by that ratio into one
sequence and filled in order, the last one partially. This is the greedy marginal-gain rule
(within one upgrade of the knapsack optimum), and because the sequence does not depend on the
total, every node's budget is a non-decreasing, continuous function of the total: when memory
comes back, nobody's budget drops.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

# A node with no latency table yet is split by weight in chunks of this size (water filling).
UNPROFILED_CHUNK_MB = 8.0


@dataclass(frozen=True)
class NodeSpec:
    """One model node as the policy sees it (config merged with the node's latest profile)."""

    name: str
    weight: float = 1.0            # priority: latency of this node counts `weight` times
    min_mb: float = 0.0            # floor: max(configured min, engine's minimum budget)
    max_mb: float = math.inf       # ceiling: min(configured max, engine's full in-memory need)
    table: tuple[tuple[float, float], ...] = ()  # ((budget_mb, predicted_ms), ...)

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("node name must not be empty")
        if not (math.isfinite(self.weight) and self.weight > 0):
            raise ValueError(f"{self.name}: priority weight must be a positive number, got {self.weight!r}")
        if not (math.isfinite(self.min_mb) and self.min_mb >= 0):
            raise ValueError(f"{self.name}: min_mb must be a finite number >= 0, got {self.min_mb!r}")
        if math.isnan(self.max_mb) or self.max_mb < self.min_mb:
            raise ValueError(f"{self.name}: max_mb ({self.max_mb}) must be >= min_mb ({self.min_mb})")
        for point in self.table:
            if len(point) != 2 or not all(math.isfinite(v) and v >= 0 for v in point):
                raise ValueError(f"{self.name}: latency table entries must be [mb >= 0, ms >= 0], got {point!r}")

    def predicted_ms(self, budget_mb: float) -> float | None:
        """Latency at a budget: the best table entry whose budget fits (None = unknown / none fits)."""
        fits = [ms for mb, ms in self.table if mb <= budget_mb + 1e-9]
        return min(fits) if fits else None


@dataclass(frozen=True)
class Allocation:
    """The split for one total. ``budgets`` sums to at most ``total_mb`` unless infeasible."""

    total_mb: float
    budgets: dict[str, float]
    predicted_ms: dict[str, float | None]
    infeasible: bool               # total < sum of minimums: every node sits at its minimum
    pressure: bool                 # some node gets less than its maximum (it has to swap)
    spare_mb: float                # left over after every node reached its maximum
    weighted_latency: float | None = None
    #: when infeasible: the nodes whose minimums do not fit once higher-priority ones are covered
    #: (``starvation_order``); they still get their minimum, which overcommits the pool by theirs
    starved: tuple[str, ...] = ()


@dataclass(frozen=True)
class Segment:
    node: str
    start_mb: float
    end_mb: float
    ratio: float                   # weighted ms saved per MB over this segment


def _lower_hull(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Lower convex hull of (mb, cost) points sorted by mb, keeping only cost-decreasing steps."""
    hull: list[tuple[float, float]] = []
    for x, y in points:
        if hull and y >= hull[-1][1]:
            continue  # more memory, no faster: never worth buying
        while len(hull) >= 2:
            (x1, y1), (x2, y2) = hull[-2], hull[-1]
            # pop the middle point if it lies on or above the chord from hull[-2] to (x, y)
            if (y2 - y1) * (x - x1) >= (y - y1) * (x2 - x1):
                hull.pop()
            else:
                break
        hull.append((x, y))
    return hull


def segments(node: NodeSpec) -> list[Segment]:
    """A node's upgrade path from its minimum to its maximum, best MB first."""
    lo, hi = node.min_mb, node.max_mb
    out: list[Segment] = []
    if node.table:
        base = node.predicted_ms(lo)
        if base is None:  # the minimum fits no table entry: price it as the slowest entry
            base = max(ms for _, ms in node.table)
        points = [(lo, node.weight * base)]
        for mb, ms in sorted(node.table):
            if lo < mb <= hi:
                points.append((mb, node.weight * ms))
        hull = _lower_hull(points)
        for (x1, y1), (x2, y2) in zip(hull, hull[1:]):
            out.append(Segment(node.name, x1, x2, (y1 - y2) / (x2 - x1)))
        top = hull[-1][0]
    else:
        top = lo
    if hi > top and math.isfinite(hi):
        if node.table:
            # headroom above the fastest partition: no latency gain, filled last
            out.append(Segment(node.name, top, hi, 0.0))
        else:
            # unprofiled: water filling by weight (chunk k costs weight/(k+1)) ≈ split ∝ weight
            k, start = 0, top
            while start < hi - 1e-9:
                end = min(hi, start + UNPROFILED_CHUNK_MB)
                out.append(Segment(node.name, start, end, node.weight / (k + 1) * 1e-6))
                start, k = end, k + 1
    return out


def starvation_order(nodes: list[NodeSpec]) -> list[NodeSpec]:
    """The order in which minimums are covered when the pool cannot cover them all: highest
    priority weight first, then the smaller minimum (more nodes keep running), then by name."""
    return sorted(nodes, key=lambda n: (-n.weight, n.min_mb, n.name))


def starved_nodes(total_mb: float, nodes: list[NodeSpec]) -> tuple[str, ...]:
    """Nodes whose minimum the pool cannot cover: minimums are covered in ``starvation_order``
    and a node whose minimum does not fit in what is left is starved (the next ones may still fit)."""
    left, starved = total_mb, []
    for node in starvation_order(nodes):
        if node.min_mb <= left + 1e-9:
            left -= node.min_mb
        else:
            starved.append(node.name)
    return tuple(starved)


def allocate(total_mb: float, nodes: list[NodeSpec]) -> Allocation:
    """Split ``total_mb`` across ``nodes`` (see the module docstring for the rule).

    No node ever gets less than its ``min_mb``: a budget below it is one the node cannot run
    in. When the pool is below the sum of minimums the allocation is ``infeasible``, every node
    sits at its minimum and ``starved`` names the nodes the pool does not cover."""
    if math.isnan(total_mb):
        raise ValueError("total budget must be a number, got NaN")
    names = [n.name for n in nodes]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate node names in {names}")
    total_mb = max(0.0, float(total_mb))
    budgets = {n.name: n.min_mb for n in nodes}
    need = sum(budgets.values())
    infeasible = total_mb + 1e-9 < need
    spare = 0.0
    if not infeasible:
        left = total_mb - need
        weight = {n.name: n.weight for n in nodes}
        order = sorted((s for n in nodes for s in segments(n)),
                       key=lambda s: (-s.ratio, -weight[s.node], s.node, s.start_mb))
        for seg in order:
            if left <= 1e-9:
                break
            take = min(seg.end_mb - seg.start_mb, left)
            budgets[seg.node] += take
            left -= take
        spare = max(0.0, left)
    predicted = {n.name: n.predicted_ms(budgets[n.name]) for n in nodes}
    known = [(n.weight, ms) for n in nodes if (ms := predicted[n.name]) is not None]
    weighted = sum(w * ms for w, ms in known) if known and len(known) == len(nodes) else None
    pressure = infeasible or any(budgets[n.name] + 1e-6 < n.max_mb for n in nodes)
    starved = starved_nodes(total_mb, nodes) if infeasible else ()
    return Allocation(total_mb, budgets, predicted, infeasible, pressure, spare, weighted, starved)


# --------------------------------------------------------------------------- the DNN pool

@dataclass(frozen=True)
class PoolConfig:
    """How the DNN pool is derived from memory readings."""

    reserve_mb: float = 0.0        # kept free for non-DNN tasks
    total_budget_mb: float = 0.0   # 0 = derive from available memory; >0 = fixed cap
    count_gpu_shared: bool = True  # Jetson: NvMap (GPU) memory counts as held by the DNNs

    def __post_init__(self) -> None:
        for name in ("reserve_mb", "total_budget_mb"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")


def dnn_pool_mb(available_mb: float, held_mb: float, config: PoolConfig, gpu_shared_mb: float = 0.0) -> float:
    """DNN budget = available + what the DNNs already hold − reserve (capped by a fixed total).

    ``held_mb`` is added back because the DNNs' own memory is already missing from
    ``available``; without it, every shrink would free memory that then looks like new room
    and the loop would oscillate.
    """
    held = max(0.0, held_mb) + (max(0.0, gpu_shared_mb) if config.count_gpu_shared else 0.0)
    derived = max(0.0, available_mb + held - config.reserve_mb)
    if config.total_budget_mb > 0:
        return min(config.total_budget_mb, derived)
    return derived


# --------------------------------------------------------------------------- hysteresis

@dataclass(frozen=True)
class Hysteresis:
    """Changes smaller than max(min_change_mb, min_change_frac × current) wait; each node changes
    at most once per ``min_interval_s`` — unless keeping the old value would overcommit."""

    min_change_mb: float = 8.0
    min_change_frac: float = 0.05
    min_interval_s: float = 2.0

    def __post_init__(self) -> None:
        for name in ("min_change_mb", "min_change_frac", "min_interval_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")


def apply_hysteresis(current: dict[str, float], target: dict[str, float], total_mb: float,
                     last_change_s: dict[str, float], now_s: float, hyst: Hysteresis,
                     bounds: dict[str, tuple[float, float]] | None = None) -> dict[str, float]:
    """Budgets to push now, given what is in force (``current``) and the ideal (``target``).

    Guarantees: a node's value is either its current value or its target; min/max bounds always
    hold; if the targets fit in ``total_mb`` the result does too (held-back *decreases* are
    released, largest excess first, until it fits — all of them when even the targets do not);
    small or too-frequent changes are held.
    """
    bounds = bounds or {}
    out: dict[str, float] = {}
    for name, want in target.items():
        have = current.get(name)
        lo, hi = bounds.get(name, (-math.inf, math.inf))
        if have is None or not (lo - 1e-9 <= have <= hi + 1e-9):
            out[name] = want  # first assignment, or the bounds moved under the old value
            continue
        delta = abs(want - have)
        significant = delta >= max(hyst.min_change_mb, hyst.min_change_frac * have) and delta > 1e-9
        rested = now_s - last_change_s.get(name, -math.inf) >= hyst.min_interval_s
        out[name] = want if significant and rested else have
    # Overcommitted (e.g. memory pressure): release held-back decreases, largest first.
    excess = sorted(((out[n] - target[n], n) for n in target if out[n] > target[n]), reverse=True)
    for _, name in excess:
        if sum(out.values()) <= total_mb + 1e-6:
            break
        out[name] = target[name]
    return out

