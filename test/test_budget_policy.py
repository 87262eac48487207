"""Budget policy and planner: pure functions, no ROS (allocation, pool, hysteresis, retries)."""
from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynnet_ros.budget.planner import BudgetPlanner, ManagerConfig, NodeConfig
from dynnet_ros.budget.policy import Hysteresis, NodeSpec, PoolConfig, allocate, apply_hysteresis, dnn_pool_mb, segments
from dynnet_ros.budget.profile import ProfileHold, engine_profile
from dynnet_ros.budget.protocol import BudgetReport, ModelProfile
from dynnet_ros.budget.sources import MemoryReading

# ----------------------------------------------------------------------------- strategies


@st.composite
def node_specs(draw, name: str) -> NodeSpec:
    lo = draw(st.floats(0, 200))
    hi = lo + draw(st.floats(0, 400))
    if draw(st.booleans()):
        mbs = sorted(draw(st.lists(st.floats(lo, hi), min_size=1, max_size=6)))
        # latency falls (weakly) as the budget grows, like a real partition table
        mss = sorted(draw(st.lists(st.floats(1, 500), min_size=len(mbs), max_size=len(mbs))), reverse=True)
        table = tuple(zip([lo] + mbs[1:], mss))
    else:
        table = ()
    return NodeSpec(name, draw(st.floats(0.1, 10)), lo, hi, table)


specs_lists = st.integers(1, 4).flatmap(
    lambda n: st.tuples(*[node_specs(f"/n{i}") for i in range(n)]).map(list))


# ----------------------------------------------------------------------------- allocate


@given(specs_lists, st.floats(0, 3000))
@settings(max_examples=300, deadline=None)
def test_allocation_respects_total_and_bounds(specs, total):
    alloc = allocate(total, specs)
    need = sum(s.min_mb for s in specs)
    for s in specs:
        assert s.min_mb - 1e-6 <= alloc.budgets[s.name] <= s.max_mb + 1e-6
    if total + 1e-9 >= need:
        assert not alloc.infeasible
        assert sum(alloc.budgets.values()) <= total + 1e-6
        # nothing is left over while some node could still use it
        if any(alloc.budgets[s.name] < s.max_mb - 1e-6 for s in specs):
            assert sum(alloc.budgets.values()) == pytest.approx(total, abs=1e-6)
    else:
        assert alloc.infeasible and alloc.pressure
        assert alloc.budgets == {s.name: s.min_mb for s in specs}
        # the priority rule: the covered nodes' minimums fit, and each starved node's does not
        # fit next to the higher-priority covered ones
        assert alloc.starved
        covered = [s for s in specs if s.name not in alloc.starved]
        assert sum(s.min_mb for s in covered) <= total + 1e-6
        for name in alloc.starved:
            node = next(s for s in specs if s.name == name)
            ahead = [s for s in covered if (-s.weight, s.min_mb, s.name) < (-node.weight, node.min_mb, node.name)]
            assert sum(s.min_mb for s in ahead) + node.min_mb > total


@given(specs_lists, st.floats(0, 3000), st.floats(0, 1000))
@settings(max_examples=300, deadline=None)
def test_allocation_is_monotone_in_total(specs, total, extra):
    small, big = allocate(total, specs), allocate(total + extra, specs)
    for s in specs:
        assert big.budgets[s.name] >= small.budgets[s.name] - 1e-6
    if small.weighted_latency is not None and big.weighted_latency is not None:
        assert big.weighted_latency <= small.weighted_latency + 1e-6


def test_allocation_prefers_the_cheapest_latency_gain_per_mb():
    # lane saves 50 ms for 10 MB; depth saves 60 ms for 100 MB: lane first.
    lane = NodeSpec("/lane", 1.0, 10, 20, ((10, 80), (20, 30)))
    depth = NodeSpec("/depth", 1.0, 50, 150, ((50, 200), (150, 140)))
    alloc = allocate(70, [lane, depth])
    assert alloc.budgets == {"/lane": 20, "/depth": 50}
    assert alloc.predicted_ms == {"/lane": 30, "/depth": 200}
    assert alloc.pressure and not alloc.infeasible
    # priority 10 on depth makes its 0.6 ms/MB worth 6 ms/MB > lane's 5 ms/MB
    depth_hi = NodeSpec("/depth", 10.0, 50, 150, ((50, 200), (150, 140)))
    assert allocate(160, [lane, depth_hi]).budgets == {"/lane": 10, "/depth": 150}


def test_allocation_matches_brute_force_on_convex_tables():
    tables = {"/a": ((10, 100), (20, 60), (40, 40), (80, 35)),
              "/b": ((5, 50), (15, 20), (30, 12)),
              "/c": ((30, 300), (60, 150), (90, 110))}
    weights = {"/a": 1.0, "/b": 2.0, "/c": 0.5}
    specs = [NodeSpec(n, weights[n], t[0][0], t[-1][0], t) for n, t in tables.items()]
    for total in range(45, 205, 5):
        alloc = allocate(total, specs)
        best = min(sum(weights[n] * ms for n, (_, ms) in zip(tables, combo))
                   for combo in itertools.product(*tables.values())
                   if sum(mb for mb, _ in combo) <= total)
        # at budgets that land on a hull vertex the greedy split is optimal; in between it
        # may hold one partial upgrade, costing at most that one upgrade's gain
        gap = max(w * (t[0][1] - t[-1][1]) for w, t in zip(weights.values(), tables.values()))
        assert best - 1e-9 <= alloc.weighted_latency <= best + gap
        if total in (45, 65, 205):
            assert alloc.weighted_latency == pytest.approx(best)


def test_unprofiled_nodes_split_by_weight():
    a, b = NodeSpec("/a", 3.0, 0, 1000), NodeSpec("/b", 1.0, 0, 1000)
    alloc = allocate(400, [a, b])
    assert alloc.budgets["/a"] / alloc.budgets["/b"] == pytest.approx(3.0, rel=0.15)
    assert sum(alloc.budgets.values()) == pytest.approx(400)


def test_segments_skip_useless_memory_and_keep_headroom_last():
    node = NodeSpec("/x", 1.0, 10, 100, ((10, 50), (30, 50), (40, 20)))
    segs = segments(node)
    assert [(s.start_mb, s.end_mb) for s in segs] == [(10, 40), (40, 100)]
    assert segs[0].ratio == pytest.approx(1.0) and segs[1].ratio == 0.0


@pytest.mark.parametrize("kwargs, match", [
    (dict(weight=0), "priority"), (dict(min_mb=-1), "min_mb"), (dict(min_mb=5, max_mb=4), "max_mb"),
    (dict(table=((1, float("nan")),)), "latency table"),
])
def test_node_spec_rejects_bad_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        NodeSpec("/x", **kwargs)


def test_allocate_rejects_duplicates_and_nan():
    with pytest.raises(ValueError, match="duplicate"):
        allocate(10, [NodeSpec("/a"), NodeSpec("/a")])
    with pytest.raises(ValueError, match="NaN"):
        allocate(float("nan"), [NodeSpec("/a")])


# ----------------------------------------------------------------------------- pool


def test_pool_adds_back_held_memory_and_subtracts_reserve():
    cfg = PoolConfig(reserve_mb=1000)
    assert dnn_pool_mb(1500, 300, cfg) == 800
    # when the DNNs shrink by 100 MB, available grows by 100 MB: the pool does not move
    assert dnn_pool_mb(1600, 200, cfg) == 800
    assert dnn_pool_mb(500, 0, cfg) == 0
    assert dnn_pool_mb(5000, 0, PoolConfig(reserve_mb=1000, total_budget_mb=600)) == 600
    assert dnn_pool_mb(1200, 100, PoolConfig(reserve_mb=1000), gpu_shared_mb=50) == 350
    assert dnn_pool_mb(1200, 100, PoolConfig(reserve_mb=1000, count_gpu_shared=False), gpu_shared_mb=50) == 300
    with pytest.raises(ValueError, match="reserve_mb"):
        PoolConfig(reserve_mb=-1)


# ----------------------------------------------------------------------------- hysteresis

HYST = Hysteresis(min_change_mb=10, min_change_frac=0.1, min_interval_s=5)


def test_hysteresis_holds_small_and_frequent_changes():
    cur = {"/a": 100.0, "/b": 100.0}
    # small change (5 < max(10, 10)) is held; big one passes
    assert apply_hysteresis(cur, {"/a": 105, "/b": 150}, 1000, {}, 100, HYST) == {"/a": 100, "/b": 150}
    # rate limit: /b changed 1 s ago, so its increase waits
    assert apply_hysteresis(cur, {"/a": 100, "/b": 150}, 1000, {"/b": 99}, 100, HYST)["/b"] == 100
    # first assignment is never held
    assert apply_hysteresis({}, {"/a": 42}, 1000, {}, 0, HYST) == {"/a": 42}


def test_hysteresis_never_overcommits():
    cur = {"/a": 100.0, "/b": 100.0}
    # shrink total to 190: a held 5-MB decrease would leave 195 > 190, so it is released
    out = apply_hysteresis(cur, {"/a": 95, "/b": 95}, 190, {"/a": 99, "/b": 99}, 100, HYST)
    assert sum(out.values()) <= 190
    # bounds moved above the current value: forced even if recent
    out = apply_hysteresis(cur, {"/a": 120, "/b": 60}, 190, {"/a": 99}, 100, HYST, {"/a": (120, 200)})
    assert out["/a"] == 120


@given(st.lists(st.tuples(st.floats(0, 500), st.floats(0, 500)), min_size=1, max_size=5),
       st.floats(0, 100), st.floats(0, 10))
@settings(max_examples=300, deadline=None)
def test_hysteresis_properties(pairs, slack, since):
    cur = {f"/n{i}": c for i, (c, _) in enumerate(pairs)}
    tgt = {f"/n{i}": t for i, (_, t) in enumerate(pairs)}
    total = sum(tgt.values()) + slack
    out = apply_hysteresis(cur, tgt, total, {n: 0.0 for n in cur}, since, HYST)
    assert sum(out.values()) <= total + 1e-6
    for n in tgt:
        assert out[n] in (cur[n], tgt[n])
        if abs(cur[n] - tgt[n]) < HYST.min_change_mb and out[n] != cur[n]:
            assert out[n] < cur[n]  # only a forced decrease may bypass the threshold


# ----------------------------------------------------------------------------- planner


def _profile(name, **kw):
    base = dict(min_mb=20.0, full_mb=100.0, table=((20.0, 90.0), (50.0, 50.0), (100.0, 30.0)),
                rss_mb=150.0, held_mb=60.0, budget_mb=None)
    base.update(kw)
    return ModelProfile(node=name, **base)


def _reading(available):
    return MemoryReading("test", 16000, available)


def test_planner_pushes_split_and_tracks_acks():
    cfg = ManagerConfig(pool=PoolConfig(reserve_mb=1000), hysteresis=HYST,
                        nodes=(NodeConfig("lane_node", priority=2.0), NodeConfig("depth_node", max_mb=80)))
    planner = BudgetPlanner(cfg)
    planner.observe_profile(_profile("/lane_node"), 0.0)
    planner.observe_profile(_profile("/depth_node"), 0.0)
    assert planner.due(_reading(1100), 0.0) == "new model node /depth_node"
    ev = planner.evaluate(_reading(1100), 0.0)  # total = 1100 + 120 - 1000 = 220
    assert ev.report.total_mb == pytest.approx(220)
    assert ev.pushes["/lane_node"] == pytest.approx(100) and ev.pushes["/depth_node"] == pytest.approx(80)
    assert not ev.report.infeasible
    # nothing acknowledged yet: a second evaluation must not re-send (calls are in flight)
    assert planner.evaluate(_reading(1100), 0.5).pushes == {}
    for node, mb in ev.pushes.items():
        planner.push_result(node, mb, True, "", 0.6)
    assert planner.due(_reading(1100), 0.7) is None
    # pressure: a 300-MB drop re-evaluates before the periodic timer
    assert planner.due(_reading(800), 0.8).startswith("pressure")
    ev = planner.evaluate(_reading(800), 0.8)
    assert ev.report.total_mb == 0  # 800 + 120 held - 1000 reserve < 0
    assert ev.report.infeasible  # 0 < 20 + 20 of minimums; recent changes are overridden
    assert ev.pushes == {"/lane_node": 20.0, "/depth_node": 20.0}
    data = __import__("json").loads(ev.report.to_json())
    assert data["infeasible"] and data["nodes"]["/lane_node"]["min_mb"] == 20.0


def test_planner_raises_floor_after_rejection():
    planner = BudgetPlanner(ManagerConfig(hysteresis=Hysteresis(0, 0, 0)))
    planner.observe_profile(_profile("/a", min_mb=None, table=()), 0.0)
    ev = planner.evaluate(MemoryReading("t", 1000, 10.0), 0.0)  # pool = 10 + 60 held
    mb = ev.pushes["/a"]
    planner.push_result("/a", mb, False, "below the model's minimum", 0.1)
    assert planner.due(MemoryReading("t", 1000, 10.0), 0.2).startswith("/a rejected")
    ev = planner.evaluate(MemoryReading("t", 1000, 500.0), 0.2)
    assert ev.pushes["/a"] >= mb * 1.25
    assert ev.report.nodes["/a"].last_error == "below the model's minimum"


def test_planner_counts_anonymous_memory_as_held():
    planner = BudgetPlanner(ManagerConfig(pool=PoolConfig(reserve_mb=100)))
    planner.observe_profile(_profile("/a", held_mb=60.0, anon_held_mb=45.0), 0.0)
    planner.observe_profile(_profile("/b", held_mb=30.0), 0.0)  # older node: no anonymous figure
    assert planner.held_mb(0.0) == 75.0
    assert planner.evaluate(_reading(1000), 0.0).report.total_mb == pytest.approx(975.0)


def test_planner_drops_silent_nodes_and_adopts_restarted_budgets():
    cfg = ManagerConfig(profile_timeout_s=2.0)
    planner = BudgetPlanner(cfg)
    planner.observe_profile(_profile("/a"), 0.0)
    assert planner.live_nodes(1.0) == ["/a"] and planner.live_nodes(3.0) == []
    planner.observe_profile(_profile("/a", budget_mb=77.0), 10.0)
    ev = planner.evaluate(_reading(100000), 10.0)
    assert ev.report.nodes["/a"].budget_mb == 77.0


def test_planner_splits_only_its_own_hosts_memory_among_its_own_hosts_nodes():
    """Two computers in one ROS domain: each manager budgets its own host's nodes only; the other
    host's nodes neither get a share of this host's pool nor count as held here."""
    planner = BudgetPlanner(ManagerConfig(pool=PoolConfig(reserve_mb=100), hysteresis=Hysteresis(0, 0, 0)),
                            host="robot-a/1234")
    assert planner.observe_profile(_profile("/lane_node", host="robot-a/1234"), 0.0)
    assert not planner.observe_profile(_profile("/depth_node", host="robot-b/5678", held_mb=500.0), 0.0)
    assert planner.observe_profile(_profile("/legacy_node"), 0.0)  # names no host: counted as local
    assert planner.live_nodes(0.0) == ["/lane_node", "/legacy_node"]
    assert planner.other_hosts == {"/depth_node": "robot-b/5678"}
    assert planner.held_mb(0.0) == 120.0
    ev = planner.evaluate(_reading(1000), 0.0)
    assert set(ev.pushes) == {"/lane_node", "/legacy_node"}
    assert set(ev.report.nodes) == {"/lane_node", "/legacy_node"}
    # a node that moves to another host leaves this host's split
    assert not planner.observe_profile(_profile("/lane_node", host="robot-b/5678"), 1.0)
    assert planner.live_nodes(1.0) == ["/legacy_node"]
    # a manager that names no host splits among every node, as before hosts were reported
    anywhere = BudgetPlanner(ManagerConfig())
    assert anywhere.observe_profile(_profile("/depth_node", host="robot-b/5678"), 0.0)


def test_profile_carries_its_host():
    prof = _profile("/lane_node", host="robot-a/1234")
    assert ModelProfile.from_json(prof.to_json()).host == "robot-a/1234"
    assert ModelProfile.from_json('{"node": "/a"}').host == ""
    with pytest.raises(ValueError, match="host"):
        ModelProfile.from_json('{"node": "/a", "host": 3}')


def test_manager_config_validation():
    with pytest.raises(ValueError, match="rate_hz"):
        ManagerConfig(rate_hz=0)
    with pytest.raises(ValueError, match="duplicate"):
        ManagerConfig(nodes=(NodeConfig("a"), NodeConfig("/a")))
    with pytest.raises(ValueError, match="priority"):
        NodeConfig("a", priority=-1)


def test_profile_round_trip_and_validation():
    prof = _profile("lane_node", budget_mb=64.0)
    back = ModelProfile.from_json(prof.to_json())
    assert back == ModelProfile(**{**prof.__dict__, "node": "/lane_node"})
    for bad, match in [("[]", "object"), ("{", "JSON"), ('{"node": ""}', "node"),
                       ('{"node": "a", "min_mb": -1}', "min_mb"),
                       ('{"node": "a", "table": [[1]]}', "table entry"),
                       ('{"node": "a", "version": [1]}', "version")]:
        with pytest.raises(ValueError, match=match):
            ModelProfile.from_json(bad)
    report = BudgetReport(0.0, "psutil", 1.0, 2.0, 3.0, math.inf, False, False, "x")
    assert __import__("json").loads(report.to_json())["total_mb"] is None


# ----------------------------------------------------------------------------- node profiles


class _SwapEngine:
    def latency_table(self):
        return [(120.0, 30.0), (40.0, 55.0), (60.0, 41.0), (float("nan"), 1.0)]

    def min_budget_mb(self):
        return 38.5


class _PlainEngine:
    """No table and no minimum: only its footprint and last latency describe it."""

    def latency_table(self):
        return []

    def min_budget_mb(self):
        return None


def test_engine_profile_uses_the_engine_table():
    prof = engine_profile("/depth_node", _SwapEngine(), rss_mb=300.0, held_mb=150.0, budget_mb=None,
                          anon_held_mb=120.0)
    assert prof.min_mb == 38.5 and prof.full_mb == 120.0 and prof.anon_held_mb == 120.0
    assert prof.table == ((40.0, 55.0), (60.0, 41.0), (120.0, 30.0))  # sorted, NaN entry dropped
    assert ModelProfile.from_json(prof.to_json()) == prof


def test_engine_profile_without_swapping_is_a_single_point():
    prof = engine_profile("/lane_node", _PlainEngine(), rss_mb=200.0, held_mb=61.3, budget_mb=64.0,
                          fallback_ms=12.0)
    assert prof.min_mb == prof.full_mb == 64.0  # held rounded up to 8 MB: RSS drift is not a new need
    assert prof.table == ((64.0, 12.0),) and prof.held_mb == 61.3 and prof.budget_mb == 64.0


# ----------------------------------------------------------------------------- in-memory level, flapping

def test_policy_picks_the_in_memory_level_when_the_pool_allows():
    # table as Engine.latency_table() gives it: swapped levels, topped by the in-memory level
    table = ((30.0, 120.0), (40.0, 95.0), (45.0, 90.0), (52.0, 80.0))
    spec = NodeSpec("/lane_node", 1.0, 30.0, 52.0, table)
    assert allocate(500.0, [spec]).budgets["/lane_node"] == pytest.approx(52.0)
    assert allocate(47.0, [spec]).budgets["/lane_node"] < 52.0  # tight pool: swapped
    class _Engine:
        def latency_table(self):
            return list(table)

        def min_budget_mb(self):
            return 30.0

    prof = engine_profile("/lane_node", _Engine(), rss_mb=100.0, held_mb=40.0, budget_mb=None)
    assert prof.full_mb == pytest.approx(52.0)


def test_profile_hold_keeps_the_largest_input_bounds_within_its_window():
    small = _profile("/n", min_mb=20.2, full_mb=60.1, table=((20.2, 50.0), (60.1, 30.0)))
    large = _profile("/n", min_mb=35.3, full_mb=101.0, table=((35.3, 90.0), (101.0, 60.0)))
    hold = ProfileHold(window_s=30.0, quantum_mb=0.5)
    first = hold.update(small, 0.0, "256x320")
    assert (first.min_mb, first.full_mb, first.min_by_size, first.measured) == (20.5, 60.5, {"256x320": 20.5}, True)
    for t in range(1, 20):  # the camera alternates resolutions
        size = "480x640" if t % 2 else "256x320"
        out = hold.update(large if t % 2 else small, float(t), size)
        assert (out.min_mb, out.full_mb, out.table) == (35.5, 101.0, large.table)
        assert out.size == size and out.min_by_size == {"256x320": 20.5, "480x640": 35.5}
    late = hold.update(small, 60.0, "256x320")  # the large size is gone for a whole window
    assert late.min_mb == 20.5 and late.min_by_size == {"256x320": 20.5}


def test_profile_before_the_first_frame_is_not_measured_and_gets_no_budget():
    hold = ProfileHold()
    estimate = hold.update(_profile("/a", min_mb=20.0, held_mb=60.0, anon_held_mb=50.0), 0.0, None)
    assert not estimate.measured and estimate.size is None and estimate.min_by_size == {}
    assert not ModelProfile.from_json(estimate.to_json()).measured
    planner = BudgetPlanner(ManagerConfig(pool=PoolConfig(reserve_mb=0.0, total_budget_mb=200.0)))
    planner.observe_profile(estimate, 0.0)
    planner.observe_profile(_profile("/b", held_mb=30.0), 0.0)
    ev = planner.evaluate(_reading(100000), 0.0)
    # the waiting node keeps what it holds (its anonymous 50 MB); the others split the rest
    assert set(ev.pushes) == {"/b"} and ev.report.waiting == ["/a"] and "/a" not in ev.report.nodes
    assert ev.report.total_mb == pytest.approx(150.0)
    measured = hold.update(_profile("/a", min_mb=20.0), 1.0, "256x320")
    assert measured.measured
    planner.observe_profile(measured, 1.0)
    assert planner.due(_reading(100000), 1.0) == "/a profile changed"
    assert "/a" in planner.evaluate(_reading(100000), 1.0).pushes


@given(st.lists(st.tuples(st.sampled_from(["256x320", "384x640", "480x640"]), st.floats(5, 80),
                          st.floats(0, 60)), min_size=1, max_size=12),
       st.floats(0, 400), st.floats(1, 3))
@settings(max_examples=200, deadline=None)
def test_budget_never_below_the_minimum_of_a_size_class_the_node_announced(frames, pool, weight):
    """Whatever sizes the camera cycles through, the manager's target for a node is at least the
    node's minimum at every size class it announced, the current one included."""
    hold = ProfileHold(window_s=1000.0)
    cfg = ManagerConfig(pool=PoolConfig(reserve_mb=0.0, total_budget_mb=max(pool, 1.0)),
                        hysteresis=Hysteresis(8.0, 0.05, 2.0), nodes=(NodeConfig("a", priority=weight),))
    planner = BudgetPlanner(cfg)
    other = _profile("/b", min_mb=30.0, full_mb=90.0, table=((30.0, 60.0), (90.0, 20.0)))
    for t, (size, min_mb, extra) in enumerate(frames):
        raw = _profile("/a", min_mb=min_mb, full_mb=min_mb + extra,
                       table=((min_mb, 100.0), (min_mb + extra, 50.0)), budget_mb=planner.applied_mb("/a"))
        published = ModelProfile.from_json(hold.update(raw, float(t), size).to_json())
        planner.observe_profile(published, float(t))
        planner.observe_profile(replace(other, budget_mb=planner.applied_mb("/b")), float(t))
        ev = planner.evaluate(_reading(100000), float(t))
        for name, mb in ev.pushes.items():
            planner.push_result(name, mb, True, "", float(t))
        need = max(published.min_by_size.values())
        assert published.min_by_size[size] >= min_mb - 1e-9
        assert ev.report.nodes["/a"].target_mb >= need - 1e-9
        assert planner.applied_mb("/a") >= need - 1e-9
        if ev.report.infeasible:
            assert ev.report.starved, "an infeasible pool names the node it cannot cover"
        else:
            assert sum(n.target_mb for n in ev.report.nodes.values()) <= ev.report.total_mb + 1e-6


def test_infeasible_pool_starves_the_lowest_priority_node_and_says_so():
    specs = [NodeSpec("/lane", 2.0, 40.0, 60.0), NodeSpec("/ped", 3.0, 35.0, 60.0),
             NodeSpec("/depth", 1.0, 50.0, 120.0), NodeSpec("/tiny", 1.0, 10.0, 20.0)]
    alloc = allocate(90.0, specs)  # ped 35 + lane 40 fit; depth 50 does not; tiny 10 still does
    assert alloc.infeasible and alloc.starved == ("/depth",)
    assert alloc.budgets == {s.name: s.min_mb for s in specs}  # never below a minimum
    # priority first, a node that does not fit is skipped: only tiny's 10 MB fits in 20
    assert allocate(20.0, specs).starved == ("/ped", "/lane", "/depth")
    assert not allocate(135.0, specs).starved  # 135 = sum of minimums: feasible


def test_planner_reports_starved_nodes_in_the_report_and_its_json():
    cfg = ManagerConfig(pool=PoolConfig(reserve_mb=0.0, total_budget_mb=50.0),
                        nodes=(NodeConfig("a", priority=3.0), NodeConfig("b", priority=1.0)))
    planner = BudgetPlanner(cfg)
    planner.observe_profile(_profile("/a", min_mb=30.0), 0.0)
    planner.observe_profile(_profile("/b", min_mb=30.0), 0.0)
    ev = planner.evaluate(_reading(100000), 0.0)
    assert ev.report.infeasible and ev.report.starved == ["/b"]
    assert ev.pushes == {"/a": 30.0, "/b": 30.0}  # the starved node at its minimum, not below
    data = __import__("json").loads(ev.report.to_json())
    assert data["starved"] == ["/b"] and data["nodes"]["/b"]["starved"] and not data["nodes"]["/a"]["starved"]


def test_budgets_stay_put_while_the_camera_cycles_resolutions():
    """The flapping seen under `dynnet up`: per-size bounds moved every cycle, and the node's
    budget, outside the new bounds, was re-pushed on nearly every evaluation."""
    small = dict(min_mb=20.0, full_mb=60.0, table=((20.0, 50.0), (40.0, 40.0), (60.0, 30.0)))
    large = dict(min_mb=35.0, full_mb=101.0, table=((35.0, 90.0), (70.0, 70.0), (101.0, 60.0)))

    def run(hold: ProfileHold | None) -> int:
        cfg = ManagerConfig(pool=PoolConfig(reserve_mb=0.0, total_budget_mb=90.0), hysteresis=HYST,
                            nodes=(NodeConfig("a"), NodeConfig("b")))
        planner = BudgetPlanner(cfg)
        pushes = 0
        for t in range(60):
            for name in ("/a", "/b"):
                sizes = large if (t // 3) % 2 else small  # 3-s resolution period, phase-shifted
                prof = _profile(name, budget_mb=planner.applied_mb(name),  # the node reports what it runs
                                **(sizes if name == "/a" else (small if sizes is large else large)))
                size = "480x640" if prof.min_mb == large["min_mb"] else "256x320"
                planner.observe_profile(hold[name].update(prof, float(t), size) if hold else prof, float(t))
            ev = planner.evaluate(_reading(16000), float(t))
            for name, mb in ev.pushes.items():
                planner.push_result(name, mb, True, "", float(t))
                pushes += 1
        return pushes

    assert run(None) > 10  # without holding: budgets move with the camera
    held = run({"/a": ProfileHold(), "/b": ProfileHold()})
    assert held <= 4  # each node: its first budget, then at most one correction once both sizes were seen
