"""Choose blocks per memory budget, and precompute a look-up table over budget levels.

The budget B bounds everything the engine holds for the model — resident weights, activations
and the runtime's own overhead (sessions, skeletons, thread pools) — i.e. the RSS growth since
before the model was loaded.  Predicted peak of a partition (blocks b_0..b_{k-1}):

    peak = overhead + pinned + max_i ( act_i + w_i + w_next(i) )

where pinned blocks stay resident across frames, ``w_i`` counts only if block i is swapped,
and ``w_next(i)`` is the next swapped block, prefetched while block i runs (resident limit 2;
with limit 1 nothing is prefetched).  Predicted latency comes from the delay model with
prefetch overlapping I/O and compute:

    T = t_in(b_0) + Σ_i max(t_ex(b_i) + t_out(b_i), t_in(b_{i+1})) + t_ex(b_last) + t_out(b_last)

With frames back to back, a partition may also *wrap*: while the last block runs, the loader
prefetches the next frame's first swapped block, so the frame no longer opens with a
synchronous load; that block's weights then count at the last block's peak
(``act_last + w_last + w_first``).  The constraint is per block — activations are small where
the weights are large (deep layers), which is where the budget has room to read ahead.

A DP over cut positions (state: the last block) finds the fastest all-swapped partition under
B; then blocks are pinned greedily while the budget allows.  Wrapped and streamed variants
(``ahead_limits``: a time-varying read-ahead allowance per block) of that partition and of the
finest grouping are candidates too; the fastest that fits wins.  ``LookupTable`` does this for a
ladder of budget levels once, so a budget change is a bisect (microseconds), not a search.
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

from dynnet_ros.swap.blocks import Partition
from dynnet_ros.swap.delay_model import DelayModel

MB = 1 << 20


@dataclass(frozen=True)
class AtomTable:
    """What the scheduler knows about each atom at one input size."""

    weight_bytes: tuple[int, ...]
    depth: tuple[int, ...]
    flops: tuple[int, ...]
    act_bytes: tuple[int, ...]

    def __post_init__(self) -> None:
        n = len(self.weight_bytes)
        if n == 0 or not (len(self.depth) == len(self.flops) == len(self.act_bytes) == n):
            raise ValueError("atom table columns must be non-empty and of equal length")


@dataclass(frozen=True)
class MemoryModel:
    """Bytes the swapped engine holds besides weights and activations (measured at startup),
    and a multiplier for activation estimates (allocator slack)."""

    overhead_bytes: int
    act_factor: float = 1.1


class Scheduler:
    def __init__(self, atoms: AtomTable, delay: DelayModel, memory: MemoryModel, *, resident_limit: int = 2,
                 stream: bool = True):
        if resident_limit < 1:
            raise ValueError(f"resident_limit must be >= 1, got {resident_limit}")
        self.stream = stream
        self.atoms = atoms
        self.delay = delay
        self.memory = memory
        self.resident_limit = resident_limit
        n = len(atoms.weight_bytes)
        self.n = n
        pre = lambda col: [0] + list(_accumulate(col))  # noqa: E731
        self._w, self._d, self._f = pre(atoms.weight_bytes), pre(atoms.depth), pre(atoms.flops)
        acts = [int(a * memory.act_factor) for a in atoms.act_bytes]
        self._act = [[0] * (n + 1) for _ in range(n + 1)]
        for a in range(n):
            running = 0
            for b in range(a + 1, n + 1):
                running = max(running, acts[b - 1])
                self._act[a][b] = running

    # ----------------------------------------------------------------- block quantities
    def w(self, a: int, b: int) -> int:
        return self._w[b] - self._w[a]

    def t_in(self, a: int, b: int) -> float:
        return self.delay.t_in(self.w(a, b), self._d[b] - self._d[a])

    def t_ex(self, a: int, b: int) -> float:
        return self.delay.t_ex(self._f[b] - self._f[a])

    def t_out(self, a: int, b: int) -> float:
        return self.delay.t_out(self._d[b] - self._d[a])

    def act(self, a: int, b: int) -> int:
        return self._act[a][b]

    # ----------------------------------------------------------------- prediction
    @staticmethod
    def wrap_block(pinned: tuple[bool, ...], resident_limit: int) -> int | None:
        """The block a wrapping partition prefetches across frames: the first swapped block,
        unless it is the last block itself (then nothing is carried over)."""
        swapped = [i for i, p in enumerate(pinned) if not p]
        if resident_limit < 2 or not swapped or swapped[0] == len(pinned) - 1:
            return None
        return swapped[0]

    def predict(self, bounds: tuple[int, ...], pinned: tuple[bool, ...], resident_limit: int | None = None,
                wrap: bool = False) -> tuple[float, int]:
        """(latency seconds, peak bytes) of a partition, by simulating the prefetch pipeline.

        ``wrap``: the last block's run also prefetches the next frame's first swapped block
        (frames back to back), so that block's load overlaps the last block instead of opening
        the frame; its weights count at the last block's peak.
        """
        limit = self.resident_limit if resident_limit is None else resident_limit
        blocks = list(zip(bounds[:-1], bounds[1:]))
        pinned_bytes = sum(self.w(a, b) for (a, b), p in zip(blocks, pinned) if p)
        carried = self.wrap_block(pinned, limit) if wrap else None
        peak = 0
        for i, (a, b) in enumerate(blocks):
            held = self.act(a, b) + (0 if pinned[i] else self.w(a, b))
            if limit >= 2:
                nxt = next((j for j in range(i + 1, len(blocks)) if not pinned[j]), None)
                if nxt is None and i == len(blocks) - 1:
                    nxt = carried
                if nxt is not None:
                    held += self.w(*blocks[nxt])
            peak = max(peak, held)
        peak += pinned_bytes + self.memory.overhead_bytes
        # Timeline: one loader thread, one compute thread.
        clock = 0.0
        loader_free = 0.0
        ready = {}
        swapped = [i for i, p in enumerate(pinned) if not p]
        if carried is not None:
            # loaded during the previous frame's last block
            last = blocks[-1]
            ready[carried] = max(0.0, self.t_in(*blocks[carried]) - self.t_ex(*last) - self.t_out(*last))
            loader_free = ready[carried]
        elif swapped and limit >= 2:
            first = swapped[0]
            ready[first] = self.t_in(*blocks[first])
            loader_free = ready[first]
        for i, (a, b) in enumerate(blocks):
            if not pinned[i]:
                if i not in ready:  # no prefetch: load now, on the compute thread's time
                    clock = max(clock, loader_free) + self.t_in(a, b)
                    ready[i] = clock
                clock = max(clock, ready[i])
            if limit >= 2:
                nxt = next((j for j in swapped if j > i), None)
                if nxt is not None and nxt not in ready:
                    start = max(clock, loader_free)
                    ready[nxt] = start + self.t_in(*blocks[nxt])
                    loader_free = ready[nxt]
            clock += self.t_ex(a, b)
            if not pinned[i]:
                clock += self.t_out(a, b)
        return clock, peak

    # ----------------------------------------------------------------- streamed prefetch
    def ahead_limits(self, bounds: tuple[int, ...], pinned: tuple[bool, ...], budget_bytes: int,
                     wrap: bool = False) -> tuple[int, ...] | None:
        """Per block k, the most bytes of later swapped weights that may be resident while k runs.

        Time-varying feasibility: while block k' runs it holds ``act_k' + w_k'`` besides the
        pinned blocks, leaving ``A_k' = room - act_k' - w_k'``.  Bytes read ahead during block k
        are still ahead when k' runs, less the blocks consumed in between, so
        ``L_k = min over k' >= k of (A_k' + W(k, k'])``.  Deep blocks with small activations get
        a large allowance (read far ahead), shallow ones with large activations a small one.
        None when some block does not fit at all.
        """
        blocks = list(zip(bounds[:-1], bounds[1:]))
        count = len(blocks)
        weights = [0 if pinned[k] else self.w(*blocks[k]) for k in range(count)]
        room = budget_bytes - self.memory.overhead_bytes - sum(self.w(*b) for b, p in zip(blocks, pinned) if p)
        allowance = [room - self.act(*blocks[k]) - weights[k] for k in range(count)]
        if min(allowance) < 0:
            return None
        carried = self.wrap_block(pinned, 2) if wrap else None
        limits = []
        for k in range(count):
            later = list(range(k + 1, count)) + (list(range(carried + 1)) if carried is not None else [])
            best, consumed = allowance[k], 0
            for j in later:
                consumed += weights[j]
                best = min(best, allowance[j] + consumed)
            total = sum(weights[k + 1:]) + (weights[carried] if carried is not None else 0)
            limits.append(max(0, min(best, total)))
        return tuple(limits)

    def predict_streamed(self, bounds: tuple[int, ...], pinned: tuple[bool, ...], ahead: tuple[int, ...],
                         wrap: bool = False) -> tuple[float, int]:
        """(latency seconds, peak bytes) with a loader streaming later blocks' bytes in order,
        never more than ``ahead[k]`` bytes beyond the running block k (frames back to back)."""
        blocks = list(zip(bounds[:-1], bounds[1:]))
        count = len(blocks)
        weights = [0 if pinned[k] else self.w(*blocks[k]) for k in range(count)]
        pinned_bytes = sum(self.w(*b) for b, p in zip(blocks, pinned) if p)
        peak = self.memory.overhead_bytes + pinned_bytes + max(
            self.act(*blocks[k]) + weights[k] + ahead[k] for k in range(count))
        loads = [0.0 if pinned[k] else self.t_in(*blocks[k]) for k in range(count)]
        total = sum(weights)
        rate = sum(loads) / total if total else 0.0  # seconds per byte, block overheads spread
        carried = self.wrap_block(pinned, 2) if wrap else None
        ends = list(_accumulate(weights))

        def frame(pre: int) -> tuple[float, int]:
            clock = loader = 0.0
            position, limit = pre, 0
            for k in range(count):
                if position >= limit:  # the loader was held back by the previous allowance
                    loader = max(loader, clock)
                if position < ends[k]:
                    loader += rate * (ends[k] - position)
                    position = ends[k]
                start = max(clock, loader)
                finish = start + self.t_ex(*blocks[k]) + (self.t_out(*blocks[k]) if weights[k] else 0.0)
                limit = ends[k] + ahead[k]
                if rate > 0 and position < limit:
                    loader = max(loader, start)
                    step = min(limit - position, int((finish - loader) / rate)) if finish > loader else 0
                    position += max(step, 0)
                    loader += rate * max(step, 0)
                clock = finish
            carried_bytes = min(max(position - total, 0), weights[carried]) if carried is not None else 0
            return clock, carried_bytes

        latency, carried_bytes = frame(0)
        if carried_bytes:
            latency, _ = frame(carried_bytes)
        return latency, peak

    # ----------------------------------------------------------------- search
    def min_budget_bytes(self) -> int:
        """Smallest budget anything fits in: one atom at a time, no prefetch."""
        return self.memory.overhead_bytes + max(self.w(i, i + 1) + self.act(i, i + 1) for i in range(self.n))

    def full_budget_bytes(self) -> int:
        """Budget at which every weight stays resident (one block, pinned)."""
        return self.predict((0, self.n), (True,))[1]

    def _dp(self, budget: int, limit: int) -> tuple[int, ...] | None:
        """Fastest all-swapped partition with predicted peak <= budget (None if none fits)."""
        n, room = self.n, budget - self.memory.overhead_bytes
        inf = math.inf
        # best[a][b]: time until block [a,b) may start (its load done, predecessors finished)
        best = [[inf] * (n + 1) for _ in range(n + 1)]
        back: dict[tuple[int, int], int] = {}
        for b in range(1, n + 1):
            if self.act(0, b) + self.w(0, b) <= room:
                best[0][b] = self.t_in(0, b)
        for a in range(1, n):
            for b in range(a + 1, n + 1):
                for c in range(a):
                    if best[c][a] == inf:
                        continue
                    prev_run = self.t_ex(c, a) + self.t_out(c, a)
                    if limit >= 2:
                        held = self.act(c, a) + self.w(c, a) + self.w(a, b)
                        step = max(prev_run, self.t_in(a, b))
                    else:
                        held = max(self.act(c, a) + self.w(c, a), self.act(a, b) + self.w(a, b))
                        step = prev_run + self.t_in(a, b)
                    if held > room or self.act(a, b) + self.w(a, b) > room:
                        continue
                    if best[c][a] + step < best[a][b]:
                        best[a][b] = best[c][a] + step
                        back[(a, b)] = c
        end = min(range(n), key=lambda a: best[a][n] + self.t_ex(a, n) + self.t_out(a, n))
        if best[end][n] == inf:
            return None
        cuts = [n, end]
        a, b = end, n
        while a > 0:
            a, b = back[(a, b)], a
            cuts.append(a)
        return tuple(reversed(cuts))

    def _pin(self, bounds: tuple[int, ...], budget: int, limit: int) -> tuple[tuple[bool, ...], float, int]:
        """Greedily keep blocks resident while the budget allows, best latency gain first."""
        pinned = [False] * (len(bounds) - 1)
        latency, peak = self.predict(bounds, tuple(pinned), limit)
        while True:
            best = None
            for i, is_pinned in enumerate(pinned):
                if is_pinned:
                    continue
                trial = tuple(pinned[:i] + [True] + pinned[i + 1:])
                t, pk = self.predict(bounds, trial, limit)
                # Pinning never slows a frame down; it also saves I/O when the gain is hidden.
                if pk <= budget and t <= latency + 1e-12 and (best is None or (t, pk) < best[1:]):
                    best = (i, t, pk)
            if best is None:
                break
            pinned[best[0]] = True
            latency, peak = best[1], best[2]
        return tuple(pinned), latency, peak

    def plan(self, budget_bytes: int) -> Partition:
        """Fastest partition predicted to fit ``budget_bytes``; ValueError if nothing fits."""
        if budget_bytes < self.min_budget_bytes():
            raise ValueError(self.below_minimum_message(budget_bytes))
        candidates = []
        for limit in sorted({1, self.resident_limit}):
            bounds = self._dp(budget_bytes, limit)
            if bounds is None:
                continue
            pinned, latency, peak = self._pin(bounds, budget_bytes, limit)
            if peak <= budget_bytes:
                candidates.append((latency, peak, bounds, pinned, limit, False, None))
                if self.wrap_block(pinned, limit) is not None:
                    t_wrap, pk_wrap = self.predict(bounds, pinned, limit, wrap=True)
                    if pk_wrap <= budget_bytes:
                        candidates.append((t_wrap, pk_wrap, bounds, pinned, limit, True, None))
            if limit >= 2 and self.stream:
                candidates.extend(self._streamed(bounds, pinned, budget_bytes))
        if self.stream and self.resident_limit >= 2:
            finest = tuple(range(self.n + 1))
            candidates.extend(self._streamed(finest, (False,) * self.n, budget_bytes))
        # Everything resident in one block is always a candidate when it fits.
        t_all, pk_all = self.predict((0, self.n), (True,), 1)
        if pk_all <= budget_bytes:
            candidates.append((t_all, pk_all, (0, self.n), (True,), 1, False, None))
        if not candidates:  # the one-atom, no-prefetch partition always fits above the minimum
            bounds = tuple(range(self.n + 1))
            pinned = (False,) * self.n
            latency, peak = self.predict(bounds, pinned, 1)
            candidates.append((latency, peak, bounds, pinned, 1, False, None))
        latency, peak, bounds, pinned, limit, wrap, ahead = min(candidates, key=lambda c: (c[0], c[1]))
        return Partition(bounds, pinned, latency * 1e3, peak, limit, wrap=wrap, ahead=ahead)

    def _streamed(self, bounds: tuple[int, ...], pinned: tuple[bool, ...], budget_bytes: int) -> list[tuple]:
        """Streamed-prefetch candidates for a grouping (with and without wrapping) that fit."""
        out = []
        for wrap in (False, True):
            if wrap and self.wrap_block(pinned, 2) is None:
                continue
            if not any(not p for p in pinned):
                continue
            ahead = self.ahead_limits(bounds, pinned, budget_bytes, wrap)
            if ahead is None:
                continue
            latency, peak = self.predict_streamed(bounds, pinned, ahead, wrap)
            if peak <= budget_bytes:
                out.append((latency, peak, bounds, pinned, 2, wrap, ahead))
        return out

    def naive(self, budget_bytes: int) -> Partition:
        """The paper's "w/o-pat-sch": equal-weight blocks, the fewest that fit, nothing pinned."""
        if budget_bytes < self.min_budget_bytes():
            raise ValueError(self.below_minimum_message(budget_bytes))
        total = self._w[-1]
        for count in range(1, self.n + 1):
            cuts = sorted({min(range(self.n + 1), key=lambda p: abs(self._w[p] - total * k / count))
                           for k in range(1, count)} - {0, self.n})
            bounds = tuple([0] + cuts + [self.n])
            pinned = (False,) * (len(bounds) - 1)
            latency, peak = self.predict(bounds, pinned, self.resident_limit)
            if peak <= budget_bytes:
                return Partition(bounds, pinned, latency * 1e3, peak, self.resident_limit)
        bounds = tuple(range(self.n + 1))
        latency, peak = self.predict(bounds, (False,) * self.n, 1)
        return Partition(bounds, (False,) * self.n, latency * 1e3, peak, 1)

    def below_minimum_message(self, budget_bytes: int) -> str:
        return (f"memory budget {budget_bytes / MB:.1f} MB is below this model's minimum "
                f"{self.min_budget_bytes() / MB:.1f} MB (largest single block + its activations + "
                f"{self.memory.overhead_bytes / MB:.1f} MB runtime overhead)")


class LookupTable:
    """Partitions precomputed for a ladder of budget levels (paper §6: partition LUT)."""

    def __init__(self, scheduler: Scheduler, levels: int = 24) -> None:
        self.scheduler = scheduler
        low, high = scheduler.min_budget_bytes(), scheduler.full_budget_bytes()
        high = max(high, low)
        ladder = sorted({int(low + (high - low) * (k / (levels - 1)) ** 1.5) for k in range(levels)} | {low, high})
        self.levels: list[int] = []
        self.partitions: list[Partition] = []
        for level in ladder:
            partition = scheduler.plan(level)
            if self.partitions and partition.predicted_ms > self.partitions[-1].predicted_ms:
                # Greedy pinning is not optimal: never let more budget pick a slower partition
                # than one that already fits.
                partition = self.partitions[-1]
            if self.partitions and partition.bounds == self.partitions[-1].bounds and \
                    partition.pinned == self.partitions[-1].pinned and \
                    partition.resident_limit == self.partitions[-1].resident_limit and \
                    partition.wrap == self.partitions[-1].wrap and \
                    partition.ahead == self.partitions[-1].ahead:
                continue
            self.levels.append(level)
            self.partitions.append(partition)

    def lookup(self, budget_bytes: int) -> Partition:
        """The precomputed partition of the highest level <= budget (ValueError below minimum)."""
        if budget_bytes < self.levels[0]:
            raise ValueError(self.scheduler.below_minimum_message(budget_bytes))
        return self.partitions[bisect.bisect_right(self.levels, budget_bytes) - 1]

    def latency_table(self) -> list[tuple[float, float]]:
        """(budget MB, predicted latency ms) for every level, increasing budget."""
        return [(level / MB, p.predicted_ms) for level, p in zip(self.levels, self.partitions)]


def _accumulate(values):
    total = 0
    for v in values:
        total += v
        yield total
