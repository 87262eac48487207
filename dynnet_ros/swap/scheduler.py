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

A DP over cut positions (state: the last block) finds the fastest all-swapped partition under
B; then blocks are pinned greedily while the budget allows.  ``LookupTable`` does this for a
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
    def __init__(self, atoms: AtomTable, delay: DelayModel, memory: MemoryModel, *, resident_limit: int = 2):
        if resident_limit < 1:
            raise ValueError(f"resident_limit must be >= 1, got {resident_limit}")
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
    def predict(self, bounds: tuple[int, ...], pinned: tuple[bool, ...], resident_limit: int | None = None
                ) -> tuple[float, int]:
        """(latency seconds, peak bytes) of a partition, by simulating the prefetch pipeline."""
        limit = self.resident_limit if resident_limit is None else resident_limit
        blocks = list(zip(bounds[:-1], bounds[1:]))
        pinned_bytes = sum(self.w(a, b) for (a, b), p in zip(blocks, pinned) if p)
        peak = 0
        for i, (a, b) in enumerate(blocks):
            held = self.act(a, b) + (0 if pinned[i] else self.w(a, b))
            if limit >= 2:
                nxt = next((j for j in range(i + 1, len(blocks)) if not pinned[j]), None)
                if nxt is not None:
                    held += self.w(*blocks[nxt])
            peak = max(peak, held)
        peak += pinned_bytes + self.memory.overhead_bytes
        # Timeline: one loader thread, one compute thread.
        clock = 0.0
        loader_free = 0.0
        ready = {}
        swapped = [i for i, p in enumerate(pinned) if not p]
        if swapped and limit >= 2:
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
                candidates.append((latency, peak, bounds, pinned, limit))
        # Everything resident in one block is always a candidate when it fits.
        t_all, pk_all = self.predict((0, self.n), (True,), 1)
        if pk_all <= budget_bytes:
            candidates.append((t_all, pk_all, (0, self.n), (True,), 1))
        if not candidates:  # the one-atom, no-prefetch partition always fits above the minimum
            bounds = tuple(range(self.n + 1))
            pinned = (False,) * self.n
            latency, peak = self.predict(bounds, pinned, 1)
            candidates.append((latency, peak, bounds, pinned, 1))
        latency, peak, bounds, pinned, limit = min(candidates, key=lambda c: (c[0], c[1]))
        return Partition(bounds, pinned, latency * 1e3, peak, limit)

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
                    partition.resident_limit == self.partitions[-1].resident_limit:
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
