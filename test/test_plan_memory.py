"""Arena planner: validity, bounds, comparison with greedy-by-size, MiniMalloc problems."""
from __future__ import annotations

import csv
import itertools
import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dynnet_ros.engine.plan import (
    check_plan,
    greedy_by_size,
    lower_bound,
    plan_offsets,
    plan_offsets_stats,
)
from dynnet_ros.engine.plan.memory_plan import _place_best_fit, _Problem

BENCH = Path(__file__).resolve().parents[1].parent / "shared" / "bench-data" / "minimalloc-challenging"


# ----------------------------------------------------------------- independent reference checks
def overlaps_in_memory(buffers, offsets) -> list[tuple[int, int]]:
    """All pairs that are live together and share bytes (quadratic, obviously correct)."""
    bad = []
    for i, j in itertools.combinations(range(len(buffers)), 2):
        (s1, e1, n1), (s2, e2, n2) = buffers[i], buffers[j]
        if n1 == 0 or n2 == 0:
            continue
        if s1 < e2 and s2 < e1 and offsets[i] < offsets[j] + n2 and offsets[j] < offsets[i] + n1:
            bad.append((i, j))
    return bad


def max_live(buffers) -> int:
    """Lower bound by brute force over every time point."""
    times = {s for s, _, _ in buffers}
    return max((sum(n for s, e, n in buffers if s <= t < e) for t in times), default=0)


buffer_lists = st.lists(
    st.tuples(st.integers(0, 30), st.integers(1, 12), st.integers(0, 5000)).map(
        lambda t: (t[0], t[0] + t[1], t[2])),
    min_size=0, max_size=40)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(buffer_lists, st.integers(0, 3))
def test_random_plans_are_valid_and_bounded(buffers, seed):
    offsets, height = plan_offsets(buffers, time_limit_s=0.02, seed=seed)
    assert len(offsets) == len(buffers)
    assert all(o >= 0 for o in offsets)
    assert overlaps_in_memory(buffers, offsets) == []
    assert height == max((o + n for o, (_, _, n) in zip(offsets, buffers)), default=0)
    lb = max_live(buffers)
    assert lower_bound(buffers) == lb
    assert height >= lb
    g_off, g_height = greedy_by_size(buffers)
    assert overlaps_in_memory(buffers, g_off) == []
    assert height <= g_height


def brute_force_optimum(buffers) -> int:
    """Best first-fit height over every placement order (tiny inputs only)."""
    s, e, n = zip(*buffers)
    p = _Problem(list(s), list(e), list(n))
    best = None
    for perm in itertools.permutations(range(p.n)):
        h = _place_best_fit(p, perm, first_fit=True)[1]
        best = h if best is None else min(best, h)
    return best


def test_tiny_problems_reach_the_brute_force_optimum():
    rng = random.Random(7)
    for _ in range(25):
        buffers = []
        for _ in range(rng.randint(2, 6)):
            a = rng.randint(0, 6)
            buffers.append((a, a + rng.randint(1, 5), rng.choice([1, 2, 3, 5, 8, 13])))
        offsets, stats = plan_offsets_stats(buffers, time_limit_s=None, tolerance=0.0)
        assert overlaps_in_memory(buffers, offsets) == []
        assert stats.height == brute_force_optimum(buffers)


def test_fragmentation_case_beats_greedy_by_size():
    # Greedy-by-size leaves a hole here; the skyline / search stages close it.
    buffers = [(0, 2, 4), (1, 4, 4), (3, 5, 4), (0, 5, 2), (2, 3, 2), (4, 6, 6), (0, 1, 2)]
    _, g = greedy_by_size(buffers)
    offsets, h = plan_offsets(buffers, time_limit_s=None, tolerance=0.0)
    assert overlaps_in_memory(buffers, offsets) == []
    assert h <= g
    assert h == brute_force_optimum(buffers)


def test_deterministic_for_a_seed_without_clock_limits():
    rng = random.Random(3)
    buffers = [(a, a + rng.randint(1, 20), rng.randint(1, 1000))
               for a in (rng.randint(0, 60) for _ in range(120))]
    r1 = plan_offsets(buffers, time_limit_s=None, seed=5)
    r2 = plan_offsets(buffers, time_limit_s=None, seed=5)
    assert r1 == r2
    assert overlaps_in_memory(buffers, r1[0]) == []


def test_dnn_like_chain_reaches_lower_bound_quickly():
    # A residual-network-like lifetime pattern: each step makes a tensor read by the next
    # one or two steps, with periodic long skips. Real DNN lifetimes are this easy.
    rng = random.Random(11)
    buffers = []
    for t in range(300):
        span = 2 if t % 3 else 4
        buffers.append((t, t + span, rng.choice([1, 2, 4, 8]) * 4096))
    offsets, stats = plan_offsets_stats(buffers)  # runtime defaults
    assert overlaps_in_memory(buffers, offsets) == []
    assert stats.height <= 1.02 * stats.lower_bound


def test_zero_size_and_empty_inputs():
    assert plan_offsets([]) == ([], 0)
    offsets, h = plan_offsets([(0, 3, 0), (1, 2, 10)])
    assert h == 10 and offsets[1] == 0


@pytest.mark.parametrize("bad", [
    [(0, 0, 4)],            # empty lifetime
    [(3, 1, 4)],            # negative lifetime
    [(0, 1, -5)],           # negative size
    [(0, 1)],               # wrong arity
    [(0, 1.5, 3)],          # non-int
    [(0, True, 3)],         # bool is not a size/time
])
def test_bad_buffers_raise_value_error(bad):
    with pytest.raises(ValueError, match="buffer 0"):
        plan_offsets(bad)


def test_check_plan_detects_overlap():
    with pytest.raises(ValueError, match="overlap"):
        check_plan([(0, 2, 4), (1, 3, 4)], [0, 2])
    check_plan([(0, 2, 4), (2, 3, 4)], [0, 0])  # half-open: touching lifetimes may share


def _load(path: Path) -> list[tuple[int, int, int]]:
    with path.open() as fh:
        return [(int(r["lower"]), int(r["upper"]), int(r["size"])) for r in csv.DictReader(fh)]


@pytest.mark.slow
@pytest.mark.skipif(not BENCH.is_dir(), reason="shared MiniMalloc benchmark data not present")
def test_minimalloc_challenging_problems_are_solved_validly():
    files = sorted(BENCH.glob("*.csv"))
    assert len(files) == 11
    for path in files:
        buffers = _load(path)
        # a short, node-bounded run keeps the test quick and machine-independent
        offsets, stats = plan_offsets_stats(buffers, time_limit_s=None, max_nodes=6000,
                                            tolerance=0.0)
        assert overlaps_in_memory(buffers, offsets) == [], path.name
        _, g = greedy_by_size(buffers)
        assert stats.lower_bound <= stats.height <= g, path.name
        # what is reliably reached even with this small budget (the 2 s benchmark does better)
        assert stats.height <= 1.12 * stats.lower_bound, (path.name, stats.height / stats.lower_bound)
