"""Scheduler: DP optimality, budget feasibility, minimum budget, and the look-up table."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from dynnet_ros.swap.delay_model import DelayModel
from dynnet_ros.swap.scheduler import MB, AtomTable, LookupTable, MemoryModel, Scheduler

DELAY = DelayModel(alpha=1e-9, beta=5e-5, gamma=2e-10, eta=5e-6)


def table(seed: int, n: int) -> AtomTable:
    rng = np.random.default_rng(seed)
    return AtomTable(tuple(int(x) for x in rng.integers(1, 20, n) * MB), tuple(int(x) for x in rng.integers(1, 8, n)),
                     tuple(int(x) for x in rng.integers(1, 50, n) * 10**8), tuple(int(x) for x in rng.integers(1, 10, n) * MB))


def all_partitions(n):
    for mask in itertools.product([0, 1], repeat=n - 1):
        yield tuple([0] + [i + 1 for i, m in enumerate(mask) if m] + [n])


@pytest.mark.parametrize("seed", range(6))
def test_dp_matches_brute_force_for_all_swapped_partitions(seed):
    sched = Scheduler(table(seed, 6), DELAY, MemoryModel(8 * MB, act_factor=1.0))
    scored = [sched.predict(c, (False,) * (len(c) - 1), 2) for c in all_partitions(sched.n)]
    budget = int(np.median([peak for _, peak in scored]))
    feasible = [latency for latency, peak in scored if peak <= budget]
    bounds = sched._dp(budget, 2)
    assert bounds is not None and feasible
    latency, peak = sched.predict(bounds, (False,) * (len(bounds) - 1), 2)
    assert peak <= budget
    assert latency == pytest.approx(min(feasible), rel=1e-9)


@pytest.mark.parametrize("seed", range(4))
def test_plan_fits_budget_and_more_budget_is_never_slower(seed):
    sched = Scheduler(table(seed, 8), DELAY, MemoryModel(10 * MB))
    low, high = sched.min_budget_bytes(), sched.full_budget_bytes()
    for budget in np.linspace(low, high, 12).astype(int):
        partition = sched.plan(int(budget))
        assert partition.predicted_peak_bytes <= budget
        assert partition.bounds[0] == 0 and partition.bounds[-1] == sched.n
    lut = LookupTable(sched, levels=12)
    previous = float("inf")
    for level, partition in zip(lut.levels, lut.partitions):
        assert partition.predicted_peak_bytes <= level
        assert partition.predicted_ms <= previous * (1 + 1e-9)
        previous = partition.predicted_ms
    top = sched.plan(high)
    assert all(top.pinned)  # enough budget: nothing is swapped per frame


def test_minimum_budget_is_largest_atom_plus_activations_plus_overhead():
    atoms = AtomTable((4 * MB, 9 * MB, 2 * MB), (1, 1, 1), (10**9,) * 3, (3 * MB, 1 * MB, 5 * MB))
    sched = Scheduler(atoms, DELAY, MemoryModel(7 * MB, act_factor=1.0))
    assert sched.min_budget_bytes() == 7 * MB + 10 * MB
    with pytest.raises(ValueError, match="below this model's minimum"):
        sched.plan(sched.min_budget_bytes() - 1)
    assert sched.plan(sched.min_budget_bytes()).count == 3


def test_lookup_table_switches_partitions_by_budget():
    sched = Scheduler(table(3, 8), DELAY, MemoryModel(10 * MB))
    lut = LookupTable(sched, levels=16)
    assert lut.levels == sorted(lut.levels) and len(lut.levels) >= 2
    assert lut.lookup(lut.levels[0]) is lut.partitions[0]
    assert lut.lookup(lut.levels[-1] * 10) is lut.partitions[-1]
    middle = lut.levels[len(lut.levels) // 2]
    assert lut.lookup(middle + 1) is lut.partitions[len(lut.levels) // 2]
    with pytest.raises(ValueError, match="minimum"):
        lut.lookup(lut.levels[0] - 1)
    latencies = [ms for _, ms in lut.latency_table()]
    assert all(b <= a * (1 + 1e-9) for a, b in zip(latencies, latencies[1:]))
    assert lut.latency_table()[0][0] == pytest.approx(lut.levels[0] / MB)


def test_naive_partition_uses_equal_weight_blocks():
    atoms = AtomTable((5 * MB,) * 8, (1,) * 8, (10**9,) * 8, (MB,) * 8)
    sched = Scheduler(atoms, DELAY, MemoryModel(4 * MB, act_factor=1.0))
    partition = sched.naive(4 * MB + 21 * MB)  # two blocks of 10 MB + activations fit, not one of 20
    sizes = np.diff(partition.bounds)
    assert sizes.max() - sizes.min() <= 1 and not any(partition.pinned)
    assert partition.predicted_peak_bytes <= 25 * MB


def test_bad_tables_rejected():
    with pytest.raises(ValueError):
        AtomTable((), (), (), ())
    with pytest.raises(ValueError):
        Scheduler(table(0, 3), DELAY, MemoryModel(0), resident_limit=0)
