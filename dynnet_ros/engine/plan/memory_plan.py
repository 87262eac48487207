"""Arena planner: give every buffer an offset so that buffers live together never overlap.

A buffer is ``(start, end, nbytes)`` with a half-open lifetime ``[start, end)``. Two buffers
conflict when their lifetimes intersect; conflicting buffers must get disjoint byte ranges
``[offset, offset + nbytes)``. The goal is the smallest arena height ``max(offset + nbytes)``.
The problem is NP-hard (2-D strip packing with fixed x), so ``plan_offsets`` works in stages,
cheapest first, and stops as soon as it is within ``tolerance`` of the lower bound (the most
bytes live at one instant, which no plan can beat):

1. constructive heuristics, one pass each: best-fit in several orders (TFLite's size order
   first, so the result is never worse than greedy-by-size; "peak first" as in the SoD² paper;
   MiniMalloc's T/W/A preorders; area, lifetime, start) and the skyline greedy (always place
   the buffer that can sit lowest — MiniMalloc's canonical construction without backtracking);
2. squeaky-wheel restarts of the skyline greedy: buffers that end up above the lower-bound
   band gain priority in proportion to how far they stick out (seeded noise breaks ties);
3. search below the best height: MiniMalloc's canonical branch and bound (every buffer rests
   on the floor or on a conflicting buffer; placements in non-decreasing (offset, preorder)
   order) with its inference rules — per-section capacity bound with monotonic and
   "unallocated" floors, and the gap dominance rule — used as a decision procedure ("is there
   a plan of height <= target?"): complete solves at the lower bound (and a proving binary
   search for inputs of at most ``_EXACT_N`` buffers), then squeaky-wheel *dives* (greedy
   descents with one-step lookahead whose failures raise the priority of the buffers of the
   section they could not satisfy) at targets spread between the bound and the best.

Everything is pure Python + numpy so the package stays pip-install-free; the hot loops keep to
integers, lists and vectorised numpy. Runtime callers (the planned engine) use the defaults
(``time_limit_s=0.05``, ``tolerance=0.01``): real DNN lifetimes reach the bound in stage 1.
With ``time_limit_s=None`` the work is bounded by pass/node counts instead of the clock, and
the result depends only on the input and the seed.
"""
from __future__ import annotations

import heapq
import random
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

Buffer = tuple[int, int, int]
_SW_SHARE = 0.25
_GAP_FRACTIONS = (0.5, 0.25, 0.7, 0.1, 0.4, 0.6)
_RUN_FAILS = 15
_MIN_ORDERS = 3  # stage-1 orders run even past the deadline
_SEARCH_MAX_N = 4000  # the search's section x buffer tables grow as n^2
_EXACT_N = 24  # up to this many buffers, stage 3 first tries to prove optimality

__all__ = [
    "Buffer",
    "PlanStats",
    "check_plan",
    "greedy_by_size",
    "lower_bound",
    "plan_height",
    "plan_offsets",
    "plan_offsets_stats",
]


@dataclass
class PlanStats:
    """What ``plan_offsets_stats`` did, for benchmarks and the ``dynnet plan`` tool."""

    lower_bound: int
    height: int
    stage: str  # "empty" | "heuristic" | "restarts" | "search"
    heuristic_height: int
    search_nodes: int = 0
    seconds: float = 0.0
    proven_optimal: bool = False
    targets_tried: list[int] = field(default_factory=list)


# --------------------------------------------------------------------------- input handling
def _normalise(buffers: Sequence[Sequence[int]]) -> tuple[list[int], list[int], list[int]]:
    """Validate and split the buffer list; a bad entry is a ValueError naming its index."""
    starts: list[int] = []
    ends: list[int] = []
    sizes: list[int] = []
    for i, buf in enumerate(buffers):
        try:
            s, e, n = buf
        except (TypeError, ValueError):
            raise ValueError(f"buffer {i}: expected (start, end, nbytes), got {buf!r}") from None
        if not (type(s) is int and type(e) is int and type(n) is int):
            for name, v in (("start", s), ("end", e), ("nbytes", n)):
                if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                    raise ValueError(f"buffer {i}: {name} must be an int, got {v!r}")
            s, e, n = int(s), int(e), int(n)
        if e <= s:
            raise ValueError(f"buffer {i}: empty or negative lifetime [{s}, {e})")
        if n < 0:
            raise ValueError(f"buffer {i}: negative size {n}")
        starts.append(s)
        ends.append(e)
        sizes.append(n)
    return starts, ends, sizes


def lower_bound(buffers: Sequence[Buffer]) -> int:
    """Most bytes live at any one instant — no valid plan has a smaller height."""
    starts, ends, sizes = _normalise(buffers)
    return _lower_bound(starts, ends, sizes)


def _lower_bound(starts: list[int], ends: list[int], sizes: list[int]) -> int:
    events: list[tuple[int, int]] = []
    for s, e, n in zip(starts, ends, sizes):
        if n:
            events.append((s, n))
            events.append((e, -n))
    events.sort()  # at equal times frees (-n) sort before allocations: half-open lifetimes
    live = best = 0
    for _, d in events:
        live += d
        if live > best:
            best = live
    return best


def plan_height(buffers: Sequence[Buffer], offsets: Sequence[int]) -> int:
    """Arena height of a plan (0 for no buffers)."""
    return max((int(o) + int(b[2]) for b, o in zip(buffers, offsets)), default=0)


def check_plan(buffers: Sequence[Buffer], offsets: Sequence[int]) -> None:
    """Raise ValueError if two lifetime-overlapping buffers overlap in memory."""
    starts, ends, sizes = _normalise(buffers)
    if len(offsets) != len(sizes):
        raise ValueError(f"{len(offsets)} offsets for {len(sizes)} buffers")
    if any(int(o) < 0 for o in offsets):
        raise ValueError("negative offset")
    order = sorted(range(len(sizes)), key=lambda i: starts[i])
    active: list[int] = []
    for i in order:
        if not sizes[i]:
            continue
        active = [j for j in active if ends[j] > starts[i]]
        oi, ti = int(offsets[i]), int(offsets[i]) + sizes[i]
        for j in active:
            oj = int(offsets[j])
            if oi < oj + sizes[j] and oj < ti:
                raise ValueError(
                    f"buffers {j} and {i} are live together and overlap in memory "
                    f"([{oj}, {oj + sizes[j]}) vs [{oi}, {ti}))"
                )
        active.append(i)


# --------------------------------------------------------------------------- shared problem data
class _Problem:
    """Conflict graph and time sections of a buffer set (zero-size buffers dropped)."""

    def __init__(self, starts: list[int], ends: list[int], sizes: list[int]):
        self.idx = [i for i, n in enumerate(sizes) if n > 0]  # original indices
        self.s = [starts[i] for i in self.idx]
        self.e = [ends[i] for i in self.idx]
        self.size = [sizes[i] for i in self.idx]
        n = self.n = len(self.idx)
        self.lb = _lower_bound(self.s, self.e, self.size)
        # per buffer: indices of the buffers whose lifetimes overlap it
        self.ov_np: list[np.ndarray] = []
        self._overlaps: list[list[int]] | None = None
        if n == 0:
            self._overlaps = []
            self.dense = False
            return
        s = np.asarray(self.s, dtype=np.int64)
        e = np.asarray(self.e, dtype=np.int64)
        # Conflict lists, built in row blocks so memory stays O(block * n), not O(n^2).
        n_conflicts = 0
        block = 1024
        for a in range(0, n, block):
            b = min(n, a + block)
            c = (s[a:b, None] < e[None, :]) & (s[None, :] < e[a:b, None])
            c[np.arange(b - a), np.arange(a, b)] = False
            rows, cols = np.nonzero(c)  # row-major: grouped by row, ascending
            cuts = np.searchsorted(rows, np.arange(b - a + 1)).tolist()
            self.ov_np.extend(cols[cuts[k]:cuts[k + 1]] for k in range(b - a))
            n_conflicts += len(cols)
        self.dense = n_conflicts > 48 * n
        # Time sections: the elementary intervals between consecutive distinct endpoints.
        pts = np.unique(np.concatenate([s, e]))
        self.points = pts
        self.sec_lo = np.searchsorted(pts, s).tolist()  # first section of each buffer
        self.sec_hi = np.searchsorted(pts, e).tolist()  # one past its last section
        self.n_sections = len(pts) - 1

    @property
    def overlaps(self) -> list[list[int]]:
        """Conflicts as Python lists (built on first use: the dense paths never need them)."""
        if self._overlaps is None:
            self._overlaps = [o.tolist() for o in self.ov_np]
        return self._overlaps

    def peak_time(self) -> int:
        """A time at which the live bytes reach the lower bound (the SoD² 'peak')."""
        events = sorted([(t, n) for t, n in zip(self.s, self.size)] + [(t, -n) for t, n in zip(self.e, self.size)])
        live = best = 0
        at = self.s[0]
        for t, d in events:
            live += d
            if live > best:
                best, at = live, t
        return at


def _place_best_fit(p: _Problem, order: Sequence[int], cap: int | None = None,
                    first_fit: bool = False) -> tuple[list[int], int] | None:
    """Place buffers in ``order``: best-fit (or lowest) gap among placed conflicting buffers.

    With ``cap`` set, returns None as soon as the height would exceed it (cheap abandon).
    """
    if p.dense:
        return _place_best_fit_dense(p, order, cap, first_fit)
    off = [-1] * p.n
    size = p.size
    overlaps = p.overlaps
    height = 0
    for i in order:
        si = size[i]
        placed = sorted((off[j], off[j] + size[j]) for j in overlaps[i] if off[j] >= 0)
        best_o = -1
        best_gap = -1
        cur = 0
        for o, t in placed:
            if o > cur:
                gap = o - cur
                if gap >= si and (best_o < 0 or (not first_fit and gap < best_gap)):
                    best_o, best_gap = cur, gap
                    if first_fit or gap == si:
                        break
            if t > cur:
                cur = t
        if best_o < 0:
            best_o = cur
        top = best_o + si
        if top > height:
            height = top
            if cap is not None and height > cap:
                return None
        off[i] = best_o
    return off, height


def _place_best_fit_dense(p: _Problem, order: Sequence[int], cap: int | None,
                          first_fit: bool) -> tuple[list[int], int] | None:
    """Vectorised twin of ``_place_best_fit`` for dense conflict graphs (long-lived buffers)."""
    n = p.n
    off_np = np.full(n, -1, dtype=np.int64)
    size_np = np.asarray(p.size, dtype=np.int64)
    ov_np = p.ov_np
    height = 0
    for i in order:
        si = p.size[i]
        ov = ov_np[i]
        po = off_np[ov]
        sel = po >= 0
        if not sel.any():
            o = 0
        else:
            po = po[sel]
            pt = po + size_np[ov[sel]]
            srt = np.argsort(po, kind="stable")
            po, pt = po[srt], pt[srt]
            reach = np.maximum.accumulate(pt)  # highest top among the first k intervals
            gap_lo = np.concatenate(([0], reach[:-1]))
            gaps = po - gap_lo
            fits = np.flatnonzero(gaps >= si)
            if fits.size:
                k = int(fits[0]) if first_fit else int(fits[np.argmin(gaps[fits])])
                o = int(gap_lo[k])
            else:
                o = int(reach[-1])
        top = o + si
        if top > height:
            height = top
            if cap is not None and height > cap:
                return None
        off_np[i] = o
    return off_np.tolist(), height


def _place_skyline(p: _Problem, rank: Sequence[int]) -> tuple[list[int], int]:
    """Lowest-offset-first greedy: always place the buffer that can sit lowest (ties by rank).

    This is MiniMalloc's canonical construction without backtracking; it tends to pack the
    time-crowded region tightly because every buffer rests on the current skyline. Sparse
    conflict graphs (real DNN lifetimes) use a heap; dense ones a vectorised argmin.
    """
    if p.dense:
        return _place_skyline_dense(p, rank)

    n = p.n
    size = p.size
    overlaps = p.overlaps
    min_off = [0] * n
    off = [-1] * n
    heap = [(0, rank[i], i) for i in range(n)]
    heapq.heapify(heap)
    height = 0
    while heap:
        o, _, i = heapq.heappop(heap)
        if off[i] >= 0 or o != min_off[i]:
            continue
        off[i] = o
        top = o + size[i]
        if top > height:
            height = top
        for j in overlaps[i]:
            if off[j] < 0 and min_off[j] < top:
                min_off[j] = top
                heapq.heappush(heap, (top, rank[j], j))
    return off, height


def _place_skyline_dense(p: _Problem, rank: Sequence[int]) -> tuple[list[int], int]:
    n = p.n
    big = n + 1
    rank_np = np.asarray(rank, dtype=np.int64)
    mo = np.zeros(n, dtype=np.int64)
    key = rank_np.copy()  # mo * big + rank for unplaced buffers, DONE for placed ones
    done = np.iinfo(np.int64).max
    size = p.size
    ov_np = p.ov_np
    off = [-1] * n
    height = 0
    for _ in range(n):
        i = int(key.argmin())
        o = int(mo[i])
        off[i] = o
        top = o + size[i]
        if top > height:
            height = top
        key[i] = done
        ov = ov_np[i]
        m = np.maximum(mo[ov], top)
        mo[ov] = m
        k = key[ov]
        key[ov] = np.where(k == done, done, m * big + rank_np[ov])
    return off, height


def _orders(p: _Problem) -> Iterator[tuple[str, list[int]]]:
    """Deterministic placement orders, cheapest first, produced lazily (easy inputs stop
    after the first): each is one best-fit pass and one skyline pass in stage 1."""
    n = p.n
    size, s, e = p.size, p.s, p.e
    r = range(n)
    # exactly greedy_by_size's order first: the result is never worse than TFLite's
    yield "size", sorted(r, key=lambda i: (-size[i], s[i], i))
    length = [e[i] - s[i] for i in r]
    peak = p.peak_time()
    live_at_peak = [1 if s[i] <= peak < e[i] else 0 for i in r]
    dist = [0 if live_at_peak[i] else min(abs(s[i] - peak), abs(e[i] - 1 - peak)) for i in r]
    yield "peak", sorted(r, key=lambda i: (-live_at_peak[i], dist[i], -size[i], s[i]))
    # MiniMalloc's preorder keys: T = bytes live in the buffer's most crowded section,
    # W = lifetime width, A = area.
    diff = np.zeros(p.n_sections + 1, dtype=np.int64)
    np.add.at(diff, p.sec_lo, size)
    np.subtract.at(diff, p.sec_hi, size)
    sec_total = np.cumsum(diff)[:-1]
    total = [int(sec_total[p.sec_lo[i]:p.sec_hi[i]].max()) for i in r]
    area = [size[i] * length[i] for i in r]
    yield "TAW", sorted(r, key=lambda i: (-total[i], -area[i], -length[i], i))
    yield "WAT", sorted(r, key=lambda i: (-length[i], -area[i], -total[i], i))
    yield "TWA", sorted(r, key=lambda i: (-total[i], -length[i], -area[i], i))
    yield "peak_size", sorted(r, key=lambda i: (-live_at_peak[i], -size[i], -length[i], s[i]))
    yield "area", sorted(r, key=lambda i: (-area[i], s[i]))
    yield "length", sorted(r, key=lambda i: (-length[i], -size[i], s[i]))
    yield "start", sorted(r, key=lambda i: (s[i], -length[i], -size[i]))


def _rank_of(order: Sequence[int]) -> list[int]:
    rank = [0] * len(order)
    for k, i in enumerate(order):
        rank[i] = k
    return rank


# --------------------------------------------------------------------------- exact-ish search
class _Search:
    """MiniMalloc-style canonical branch and bound, as a decision procedure for a capacity.

    Every unplaced buffer has a minimum offset (the highest top of its placed conflicts). The
    search places buffers in non-decreasing (offset, preorder) order, so a state is a
    "skyline" and each buffer sits at its minimum offset when placed. Pruning:
    * dominance — a buffer whose min offset is at or above some other unplaced buffer's
      min top would leave a gap that buffer could fill; skip it;
    * section inference — in every time section, the sizes still to place must fit between
      that section's floor and the capacity, where the floor is the max of the last placed
      offset (monotonic), the tops placed there, and the lowest min offset of its unplaced
      buffers ("unallocated floor").
    The per-section minima are kept incrementally: placing a buffer only touches the sections
    spanned by it and its conflicts.
    """

    def __init__(self, p: _Problem):
        self.p = p
        n = p.n
        S = p.n_sections
        # Padded membership matrix: section -> buffers live there (pad = n, a sentinel).
        # Built vectorised: large dense inputs (thousands of long-lived buffers) stay cheap.
        lo = np.asarray(p.sec_lo, dtype=np.int64)
        hi = np.asarray(p.sec_hi, dtype=np.int64)
        secs = np.arange(S, dtype=np.int64)[:, None]
        live = (lo[None, :] <= secs) & (secs < hi[None, :])  # S x n
        width = max(1, int(live.sum(axis=1).max(initial=1)))
        idx = np.argsort(~live, axis=1, kind="stable")[:, :width]
        self.members = np.where(np.take_along_axis(live, idx, axis=1), idx, n).astype(np.int64)
        self.size_np = np.asarray(p.size + [0], dtype=np.int64)
        self.total0 = self.size_np[self.members].sum(axis=1)
        # Sections whose "unallocated floor" can change when buffer i is placed: the span of
        # i and all its conflicts.
        self.span = [(min(int(lo[i]), int(lo[o].min(initial=S))),
                      max(int(hi[i]), int(hi[o].max(initial=0)))) for i, o in enumerate(p.ov_np)]
        self.ov_np = p.ov_np
        self.nodes = 0

    def dive(self, cap: int, rank: Sequence[int]) -> tuple[list[int] | None, list[int]]:
        """One greedy descent of the canonical search with one-step lookahead (no deep
        backtracking): at each step place the lowest (offset, rank) candidate whose placement
        passes the section inference. Returns (offsets, []) on success, else (None, blame):
        the unplaced buffers of the section that could not be satisfied, so a squeaky-wheel
        loop can place them earlier next time. ~10x cheaper per placement than ``solve``.
        """
        p = self.p
        n = p.n
        INF = 1 << 62
        big = n + 1
        rank_np = np.asarray(rank, dtype=np.int64)
        eff = np.zeros(n + 1, dtype=np.int64)
        eff[n] = INF
        key = rank_np.copy()  # eff * big + rank for unplaced, INF for placed
        unf = np.zeros(p.n_sections, dtype=np.int64)
        floor = np.zeros(p.n_sections, dtype=np.int64)
        total = self.total0.copy()
        members = self.members
        size, size_np = p.size, self.size_np[:n]
        sec_lo, sec_hi = p.sec_lo, p.sec_hi
        span = self.span
        ov_np = p.ov_np
        off = [-1] * n
        last_o, last_r = 0, -1
        self.nodes += 1
        for _step in range(n):
            min_height = int((eff[:n] + size_np).min())  # placed: INF + size, never the min
            # Canonical order: only keys above the last placement; dominance: offsets below
            # the lowest top any unplaced buffer could reach.
            masked = np.where(key > last_o * big + last_r, key, INF)
            limit_key = min_height * big
            first = int(masked.argmin())
            placed_one = False
            level = -1
            blame_sec = -1
            if int(masked[first]) >= limit_key:
                cands: list[int] = []
            else:
                cands = [first]
            tried_rest = False
            ci = 0
            while ci < len(cands) or not tried_rest:
                if ci >= len(cands):
                    # The best candidate failed: fall back to the others, in key order.
                    tried_rest = True
                    if not cands:
                        break
                    rest = np.flatnonzero(masked < limit_key)
                    rest = rest[np.argsort(masked[rest], kind="stable")].tolist()
                    cands = [c for c in rest if c != first]
                    ci = 0
                    continue
                i = cands[ci]
                ci += 1
                k = int(key[i])
                o, r = k // big, k % big
                si = size[i]
                top = o + si
                if top > cap:
                    continue
                if o != level:
                    level = o
                    base = np.maximum(floor, o) + total
                    bad = np.flatnonzero(base > cap)
                    if bad.size:
                        blame_sec = int(bad[0])
                        break
                ov = ov_np[i]
                old_eff = eff[ov]
                new_eff = np.maximum(old_eff, top)
                eff[ov] = new_eff
                eff[i] = INF
                lo, hi = sec_lo[i], sec_hi[i]
                old_floor = floor[lo:hi].copy()
                floor[lo:hi] = top
                total[lo:hi] -= si
                a, b = span[i]
                old_unf = unf[a:b].copy()
                m = eff[members[a:b]].min(axis=1)
                m[m >= INF] = 0
                unf[a:b] = m
                # Only [a, b) changed; elsewhere the previous step's check still holds and the
                # raised level o is covered by the per-level test above.
                viol = np.flatnonzero(
                    np.maximum(np.maximum(floor[a:b], unf[a:b]), o) + total[a:b] > cap)
                if viol.size == 0:
                    off[i] = o
                    k_ov = key[ov]
                    key[ov] = np.where(k_ov >= INF, INF, new_eff * big + rank_np[ov])
                    key[i] = INF
                    last_o, last_r = o, r
                    placed_one = True
                    break
                if blame_sec < 0:
                    blame_sec = a + int(viol[0])
                # undo and try the next candidate
                unf[a:b] = old_unf
                total[lo:hi] += si
                floor[lo:hi] = old_floor
                eff[i] = o
                eff[ov] = old_eff
            if not placed_one:
                if blame_sec < 0:
                    blame = [i for i in range(n) if off[i] < 0]
                else:
                    row = members[blame_sec]
                    blame = [int(j) for j in row if j < n and off[int(j)] < 0]
                return None, blame
        return off, []

    def solve(self, cap: int, preorder: Sequence[int], node_limit: int,
              deadline: float) -> list[int] | None | bool:
        """Offsets fitting ``cap``; None if proven infeasible; False if the budget ran out."""
        p = self.p
        n = p.n
        if n == 0:
            return []
        INF = 1 << 62
        eff = np.zeros(n + 1, dtype=np.int64)  # min offset of unplaced buffers, INF if placed
        eff[n] = INF
        unf = np.zeros(p.n_sections, dtype=np.int64)  # lowest eff among a section's buffers
        floor = np.zeros(p.n_sections, dtype=np.int64)
        total = self.total0.copy()
        if int(total.max(initial=0)) > cap:
            return None
        off = [-1] * n
        size = p.size
        size_np = self.size_np
        rank_np = np.asarray(_rank_of(preorder) + [n], dtype=np.int64)
        members = self.members
        sec_lo, sec_hi, span = p.sec_lo, p.sec_hi, self.span
        sec_lo_np = np.asarray(sec_lo, dtype=np.int64)
        sec_hi_np = np.asarray(sec_hi, dtype=np.int64)
        ov_np = self.ov_np
        unplaced = np.ones(n, dtype=bool)
        budget = [node_limit]
        found: list[int] = []
        perf = time.perf_counter

        def rec(last_o: int, last_r: int) -> int:
            # 1 = solved, 0 = infeasible subtree, -1 = budget exhausted
            self.nodes += 1
            budget[0] -= 1
            if budget[0] < 0 or ((self.nodes & 31) == 0 and perf() > deadline):
                budget[0] = -1
                return -1
            un = np.flatnonzero(unplaced)
            if un.size == 0:
                found[:] = off
                return 1
            mo = eff[un]
            min_height = int((mo + size_np[un]).min())
            ru = rank_np[un]
            ok = (mo < min_height) & ((mo > last_o) | ((mo == last_o) & (ru > last_r)))
            if not ok.any():
                return 0
            cu, cm, cr = un[ok], mo[ok], ru[ok]
            srt = np.lexsort((cr, cm))
            level = -1
            bmin = bmax = 0
            for o, r, i in zip(cm[srt].tolist(), cr[srt].tolist(), cu[srt].tolist()):
                si = size[i]
                top = o + si
                if top > cap:
                    continue
                if o != level:
                    # Candidate-independent bound: placing anything at >= o keeps
                    # max(floor, o) + total in every section (see class docstring).
                    level = o
                    base = np.maximum(floor, o) + total
                    if bool((base > cap).any()):
                        break  # every later candidate sits at >= o: all fail
                    bad = np.flatnonzero(np.maximum(base, unf + total) > cap)
                    if bad.size:
                        bmin, bmax = int(bad[0]), int(bad[-1])
                    else:
                        bmin, bmax = -1, -1
                a, b = span[i]
                if bmin >= 0 and (bmin < a or bmax >= b):
                    continue  # a violated section this placement cannot touch
                ov = ov_np[i]
                old_eff = eff[ov]  # fancy indexing copies
                raised = old_eff < top
                eff[ov] = np.maximum(old_eff, top)
                eff[i] = INF
                unplaced[i] = False
                lo, hi = sec_lo[i], sec_hi[i]
                old_floor = floor[lo:hi].copy()
                floor[lo:hi] = top
                total[lo:hi] -= si
                if raised.any():
                    ch = ov[raised]
                    a = min(lo, int(sec_lo_np[ch].min()))
                    b = max(hi, int(sec_hi_np[ch].max()))
                else:
                    a, b = lo, hi
                old_unf = unf[a:b].copy()
                m = eff[members[a:b]].min(axis=1)
                m[m >= INF] = 0
                unf[a:b] = m
                off[i] = o
                fl = np.maximum(np.maximum(floor, unf), o)
                res = rec(o, r) if bool(((fl + total) <= cap).all()) else 0
                off[i] = -1
                unf[a:b] = old_unf
                total[lo:hi] += si
                floor[lo:hi] = old_floor
                unplaced[i] = True
                eff[i] = o
                eff[ov] = old_eff
                if res != 0:
                    return res
            return 0

        old_limit = sys.getrecursionlimit()
        sys.setrecursionlimit(max(old_limit, 4 * n + 1000))
        try:
            res = rec(0, -1)
        finally:
            sys.setrecursionlimit(old_limit)
        if res == 1:
            return found
        if res == 0:
            return None
        return False


# --------------------------------------------------------------------------- public API
def greedy_by_size(buffers: Sequence[Buffer]) -> tuple[list[int], int]:
    """TFLite's greedy-by-size: largest first, each into the best-fitting gap. For comparison."""
    starts, ends, sizes = _normalise(buffers)
    p = _Problem(starts, ends, sizes)
    offsets = [0] * len(sizes)
    if p.n == 0:
        return offsets, 0
    order = sorted(range(p.n), key=lambda i: (-p.size[i], p.s[i], i))
    placed = _place_best_fit(p, order)
    if placed is None:  # only a height cap makes a placement fail, and none is given
        raise RuntimeError("uncapped best-fit placement failed")
    off, height = placed
    for k, i in enumerate(p.idx):
        offsets[i] = off[k]
    return offsets, height


def plan_offsets(buffers: Sequence[Buffer], time_limit_s: float | None = 0.05,
                 seed: int = 0, tolerance: float = 0.01,
                 max_nodes: int | None = None) -> tuple[list[int], int]:
    """Offsets (same order as ``buffers``) and arena height; see the module docstring.

    ``time_limit_s`` bounds the improvement stages (the first heuristic pass always runs);
    None means no time limit: then the restarts run a fixed number of passes and the search
    stops after ``max_nodes`` nodes (default ``200 * len(buffers)``) — fully deterministic.
    Stops early once the height is within ``(1 + tolerance)`` of the lower bound.
    For a fixed ``seed`` and a budget that is not cut by the clock, results are repeatable.
    """
    offsets, _stats = plan_offsets_stats(buffers, time_limit_s, seed, tolerance, max_nodes)
    return offsets, _stats.height


def plan_offsets_stats(buffers: Sequence[Buffer], time_limit_s: float | None = 0.05,
                       seed: int = 0, tolerance: float = 0.01,
                       max_nodes: int | None = None) -> tuple[list[int], PlanStats]:
    """Like ``plan_offsets`` but also returns what was done (stage, bounds, nodes, time)."""
    t0 = time.perf_counter()
    deadline = float("inf") if time_limit_s is None else t0 + float(time_limit_s)
    starts, ends, sizes = _normalise(buffers)
    p = _Problem(starts, ends, sizes)
    offsets = [0] * len(sizes)
    if p.n == 0:
        return offsets, PlanStats(0, 0, "empty", 0, seconds=time.perf_counter() - t0,
                                  proven_optimal=True)
    lb = p.lb
    goal = lb if tolerance <= 0 else int(lb * (1.0 + tolerance))

    best_off: list[int] | None = None
    best_h = -1
    best_order: list[int] = []
    stage = "heuristic"

    def consider(res: tuple[list[int], int] | None, order: list[int]) -> None:
        nonlocal best_off, best_h, best_order
        if res is not None and (best_h < 0 or res[1] < best_h):
            best_off, best_h = res
            best_order = order

    # Stage 1: deterministic orders, best-fit and the skyline greedy.
    for k, (_name, order) in enumerate(_orders(p)):
        if k >= _MIN_ORDERS and time.perf_counter() > deadline:
            break  # the first orders always run: a good plan whatever the clock says
        consider(_place_best_fit(p, order, cap=best_h - 1 if best_h > 0 else None), order)
        if best_h <= goal:
            break
        consider(_place_skyline(p, _rank_of(order)), order)
        if best_h <= goal:
            break
    heuristic_h = best_h
    assert best_off is not None

    # Stage 2: squeaky-wheel restarts of the skyline greedy. Buffers that end up above the
    # lower-bound band get their priority raised in proportion to how far they stick out, so
    # the next pass places them earlier; after `patience` passes without progress it restarts
    # from the next base order. Cheap (a pass is ~1-3 ms for 400 buffers) and strong on
    # crowded peaks; seeded noise breaks ties so runs are repeatable.
    rng = random.Random(seed)
    nodes = 0
    targets: list[int] = []
    proven = best_h <= lb
    n = p.n
    named = dict(_orders(p))
    if best_h > goal and time.perf_counter() < deadline:
        stage = "restarts"
        sw_deadline = t0 + (deadline - t0) * _SW_SHARE if time_limit_s is not None else float("inf")
        max_passes = 1 << 30 if time_limit_s is not None else 20 * len(named)
        bases = ["peak", "TAW", "start", "TWA", "length", "WAT", "area", "size", "peak_size"]
        size = p.size
        passes = 0
        run = 0
        while best_h > goal and passes < max_passes and time.perf_counter() < sw_deadline:
            base = named[bases[run % len(bases)]]
            run += 1
            prio = [0.0] * n
            for k, i in enumerate(base):
                prio[i] = float(n - k)
            run_best = -1
            stale = 0
            while stale < 40 and passes < max_passes and best_h > goal:
                if time.perf_counter() > sw_deadline:
                    break
                passes += 1
                order = sorted(range(n), key=prio.__getitem__, reverse=True)
                off, h = _place_skyline(p, _rank_of(order))
                consider((off, h), order)
                if run_best < 0 or h < run_best:
                    run_best, stale = h, 0
                else:
                    stale += 1
                thr = lb + (h - lb) // 2
                span = h - thr + 1
                for i in range(n):
                    top = off[i] + size[i]
                    if top > thr:
                        prio[i] += 0.5 * n * (top - thr) / span + rng.random()

    # Stage 3: search below the best height found so far.
    # (a) A few complete-search dives straight at the lower bound (crowded-peak problems often
    #     pack exactly; on small inputs this search finishes and proves optimality).
    # (b) Squeaky-wheel dives: one-step-lookahead descents of the canonical search at a target
    #     just below the best. A failed dive blames the buffers of the section it could not
    #     satisfy; they rise in priority so the next dive places them earlier. A success lowers
    #     the target.
    if best_h > goal and time.perf_counter() < deadline and n <= _SEARCH_MAX_N:
        stage = "search" if stage == "heuristic" else stage
        sr = _Search(p)
        node_cap = max_nodes
        if node_cap is None and time_limit_s is None:
            node_cap = 200 * n
        lo = goal  # no plan below this exists (or it is good enough)
        # One complete-search dive with some backtracking, then two plain dives.
        for k, order in enumerate((named["peak"], named["start"], best_order)):
            if best_h <= lo or time.perf_counter() > deadline:
                break
            if node_cap is not None and nodes >= node_cap:
                break
            if k == 0:
                before = sr.nodes
                limit = n + n // 2 + 16
                if n <= _EXACT_N:
                    limit = 50 * n * n
                if node_cap is not None:
                    limit = min(limit, node_cap - nodes)
                # at most a tenth of the budget: large inputs rarely need this backtracking
                solve_deadline = deadline
                if time_limit_s is not None and n > _EXACT_N:
                    solve_deadline = min(deadline, time.perf_counter() + 0.1 * time_limit_s)
                res = sr.solve(lo, order, limit, solve_deadline)
                nodes += sr.nodes - before
                if res is None:
                    lo += 1  # proven: nothing fits the bound
                    break
            else:
                res, _blame = sr.dive(lo, _rank_of(order))
            if isinstance(res, list):
                consider((res, max(o + s for o, s in zip(res, p.size))), order)
                stage = "search"
        # Small inputs: binary search with complete solves; each answer is a proof either way.
        if n <= _EXACT_N and lo < best_h:
            while lo < best_h and time.perf_counter() < deadline:
                if node_cap is not None and nodes >= node_cap:
                    break
                mid = (lo + best_h - 1) // 2
                before = sr.nodes
                limit = 50 * n * n if node_cap is None else min(50 * n * n, node_cap - nodes)
                res = sr.solve(mid, named["peak"], limit, deadline)
                nodes += sr.nodes - before
                if isinstance(res, list):
                    consider((res, max(o + s for o, s in zip(res, p.size))), named["peak"])
                    stage = "search"
                elif res is None:
                    lo = mid + 1
                else:
                    break
        step = max(1, lb // 100)
        base_orders = [named["peak"], best_order] + [named[k] for k in ("TWA", "start", "WAT", "length")]
        run = 0
        while best_h > lo and time.perf_counter() < deadline:
            if node_cap is not None and nodes >= node_cap:
                break
            prio = [0.0] * n
            for k, i in enumerate(base_orders[run % len(base_orders)]):
                prio[i] = float(n - k)
            # Each run hammers one target (learning is target-specific) placed a fraction of the
            # way from the best down to the bound: tighter targets prune earlier and often
            # succeed where looser ones fail, so the fractions are spread, not just "a bit less".
            frac = _GAP_FRACTIONS[run % len(_GAP_FRACTIONS)]
            run += 1
            fails = 0
            while fails < _RUN_FAILS and best_h > lo and time.perf_counter() < deadline:
                if node_cap is not None and nodes >= node_cap:
                    break
                target = max(lo, min(best_h - step, best_h - int((best_h - lo) * frac)))
                if not targets or targets[-1] != target:
                    targets.append(target)
                order = sorted(range(n), key=prio.__getitem__, reverse=True)
                dived, blame = sr.dive(target, _rank_of(order))
                nodes += n  # a dive costs about one node per buffer
                if dived is not None:
                    consider((dived, max(o + s for o, s in zip(dived, p.size))), order)
                    stage = "search"
                    fails = 0
                else:
                    fails += 1
                    for j in blame:
                        prio[j] += 0.1 * n + rng.random()
        if best_h <= lo and tolerance <= 0:
            proven = True

    for k, i in enumerate(p.idx):
        offsets[i] = best_off[k]
    stats = PlanStats(lower_bound=lb, height=best_h, stage=stage, heuristic_height=heuristic_h,
                      search_nodes=nodes, seconds=time.perf_counter() - t0,
                      proven_optimal=proven or best_h == lb, targets_tried=targets)
    return offsets, stats
