"""OOM kills without processes: the evidence rules on fixture files, the budget manager's answer
(planner), the node-event wire format and the store of run-time parameters a restart reapplies."""
from __future__ import annotations

import math
import signal
from pathlib import Path

import pytest

from dynnet_ros.budget.cgroup import CgroupPaths
from dynnet_ros.budget.oom import (
    MemorySignals,
    OomPolicy,
    OomRule,
    oom_action,
    oom_evidence,
    parse_oom_kills,
    parse_psi,
    process_cgroup,
    read_signals,
)
from dynnet_ros.budget.planner import BudgetPlanner, ManagerConfig, NodeConfig
from dynnet_ros.budget.policy import Hysteresis, PoolConfig
from dynnet_ros.budget.protocol import ModelProfile, NodeEvent
from dynnet_ros.budget.sources import MemoryReading
from dynnet_ros.graph_config import ProcessSpec, RuntimeParameters, restart_spec

SIGKILL = -signal.SIGKILL
CALM_PSI = "some avg10=0.00 avg60=0.00 avg300=0.00 total=1000\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=500\n"


def write_root(root: Path, *, vmstat_kills: int = 0, psi: str = CALM_PSI, available_kb: int = 8_000_000,
               total_kb: int = 16_000_000) -> Path:
    (root / "proc/pressure").mkdir(parents=True, exist_ok=True)
    (root / "proc/vmstat").write_text(f"nr_free_pages 1000\noom_kill {vmstat_kills}\n")
    (root / "proc/pressure/memory").write_text(psi)
    (root / "proc/meminfo").write_text(f"MemTotal: {total_kb} kB\nMemFree: 1000 kB\nMemAvailable: {available_kb} kB\n")
    return root


def cgroup_dir(root: Path, version: int, kills: int) -> CgroupPaths:
    directory = root / f"cg{version}"
    directory.mkdir(exist_ok=True)
    if version == 2:
        (directory / "memory.events").write_text(f"low 0\nhigh 0\nmax 3\noom 1\noom_kill {kills}\noom_group_kill 0\n")
    else:
        (directory / "memory.oom_control").write_text(f"oom_kill_disable 0\nunder_oom 0\noom_kill {kills}\n")
    return CgroupPaths(version, directory)


def test_parsers_read_kernel_text():
    psi = parse_psi("some avg10=1.50 avg60=0.20 avg300=0.00 total=12345\nfull avg10=0.75 avg60=0 avg300=0 total=99\n")
    assert (psi.some_avg10, psi.full_avg10, psi.some_total_us, psi.full_total_us) == (1.5, 0.75, 12345, 99)
    with pytest.raises(ValueError, match="PSI"):
        parse_psi("some avg10=1.0 total=3\n")
    assert parse_oom_kills("low 0\noom 2\noom_kill 3\n") == 3
    assert parse_oom_kills("oom_kill_disable 0\nunder_oom 0\noom_kill 7\n") == 7
    assert parse_oom_kills("oom_kill_disable 0\nunder_oom 0\n") is None


@pytest.mark.parametrize("version", [1, 2])
def test_a_rising_cgroup_counter_is_an_oom_kill_and_only_for_sigkill(tmp_path, version):
    root = write_root(tmp_path)
    group = cgroup_dir(tmp_path, version, kills=2)
    before = read_signals(root, group)
    assert before.cgroup_oom_kills == 2 and before.system_oom_kills == 0
    cgroup_dir(tmp_path, version, kills=3)
    after = read_signals(root, group)
    why = oom_evidence(SIGKILL, before, after)
    assert why is not None and "memory cgroup" in why and "1 OOM kill" in why
    assert oom_evidence(-signal.SIGSEGV, before, after) is None
    assert oom_evidence(1, before, after) is None
    assert oom_evidence(SIGKILL, before, before) is None  # a calm machine: a plain kill -9


def test_system_counter_pressure_and_low_memory_each_count(tmp_path):
    calm = read_signals(write_root(tmp_path / "a"))
    assert oom_evidence(SIGKILL, calm, calm) is None
    counted = read_signals(write_root(tmp_path / "b", vmstat_kills=1))
    assert "/proc/vmstat" in oom_evidence(SIGKILL, calm, counted)
    stalled = read_signals(write_root(tmp_path / "c", psi=CALM_PSI.replace("full avg10=0.00", "full avg10=35.00")))
    assert "stalled on memory 35.0%" in oom_evidence(SIGKILL, calm, stalled)
    # the "full" total grew by 250 ms since the reading before the death
    grown = read_signals(write_root(tmp_path / "d", psi=CALM_PSI.replace("total=500", "total=250500")))
    assert "250 ms" in oom_evidence(SIGKILL, calm, grown)
    assert oom_evidence(SIGKILL, calm, grown, OomRule(stall_ms=300.0)) is None
    low = read_signals(write_root(tmp_path / "e", available_kb=400_000))
    assert "2.5% of memory available" in oom_evidence(SIGKILL, calm, low)


def test_missing_files_give_no_evidence(tmp_path):
    empty = read_signals(tmp_path)
    assert empty == MemorySignals()
    assert oom_evidence(SIGKILL, empty, empty) is None
    assert process_cgroup(2 ** 22 + 12345) is None  # no such process


def test_the_cut_goes_to_the_reserve_where_the_minimum_stops_it():
    free = oom_action("/n", 10.0, "why", budget_mb=100.0, held_mb=80.0, min_mb=40.0)
    assert (free.cap_mb, free.reserve_add_mb, free.start_budget_mb, free.reference_mb) == (75.0, 0.0, 75.0, 100.0)
    assert free.until_s == 10.0 + OomPolicy().hold_s
    # held more than its budget: the cap still lowers the budget
    over = oom_action("/n", 0.0, "why", budget_mb=50.0, held_mb=120.0, min_mb=40.0)
    assert over.cap_mb == 40.0 and over.reserve_add_mb == pytest.approx(2.5)
    unbudgeted = oom_action("/n", 0.0, "why", budget_mb=None, held_mb=120.0, min_mb=40.0)
    assert unbudgeted.cap_mb == 90.0 and unbudgeted.reference_mb == 120.0
    floor = oom_action("/n", 0.0, "why", budget_mb=100.0, held_mb=None, min_mb=90.0)
    assert floor.cap_mb == 90.0 and floor.reserve_add_mb == pytest.approx(15.0)  # 25 cut, 10 from the node
    unknown = oom_action("/n", 0.0, "why", budget_mb=None, held_mb=None, min_mb=0.0)
    assert unknown.cap_mb is None and unknown.reserve_add_mb == OomPolicy().unknown_mb
    with pytest.raises(ValueError, match="shrink_frac"):
        OomPolicy(shrink_frac=1.0)


def profile(node: str, min_mb: float, full_mb: float, held: float, budget: float | None = None) -> ModelProfile:
    return ModelProfile(node=node, min_mb=min_mb, full_mb=full_mb, table=((min_mb, 100.0), (full_mb, 50.0)),
                        held_mb=held, anon_held_mb=held, budget_mb=budget)


def planner_with_two_nodes() -> BudgetPlanner:
    config = ManagerConfig(pool=PoolConfig(reserve_mb=100.0), hysteresis=Hysteresis(0.0, 0.0, 0.0),
                           nodes=(NodeConfig("/a", 1.0), NodeConfig("/b", 1.0)), oom=OomPolicy(hold_s=60.0))
    return BudgetPlanner(config)


def test_planner_caps_an_oom_killed_node_before_it_returns_and_lifts_the_cap_later():
    planner = planner_with_two_nodes()
    reading = MemoryReading("test", 10_000.0, 5_000.0)
    for t in (0.0, 1.0):
        planner.observe_profile(profile("/a", 20.0, 200.0, held=150.0), t)
        planner.observe_profile(profile("/b", 20.0, 200.0, held=150.0), t)
    first = planner.evaluate(reading, 1.0)
    assert first.allocation.budgets == {"/a": 200.0, "/b": 200.0}
    for name, mb in first.pushes.items():
        planner.push_result(name, mb, True, "", 1.5)
    action = planner.record_oom("/a", 2.0, "the kernel counted 1 OOM kill(s)", event=7)
    assert action.cap_mb == 150.0 and action.start_budget_mb == 150.0
    assert planner.applied_mb("/a") == 150.0  # what the supervisor starts it with
    assert planner.due(reading, 2.0) == "OOM kill of /a"  # re-planned at once, not at the next period
    after = planner.evaluate(reading, 2.0)
    assert after.allocation.budgets["/a"] == 150.0 and after.allocation.budgets["/b"] == 200.0
    [entry] = after.report.oom_kills
    assert (entry.node, entry.cap_mb, entry.event, entry.remaining_s) == ("/a", 150.0, 7, 60.0)
    assert '"oom_kills":[{"node":"/a"' in after.report.to_json()
    # a second kill while capped cuts from the cap
    again = planner.record_oom("/a", 3.0, "again", event=8)
    assert again.cap_mb == 112.5
    # the hold passes: the cap is lifted
    planner.observe_profile(profile("/a", 20.0, 200.0, held=100.0, budget=112.5), 70.0)
    planner.observe_profile(profile("/b", 20.0, 200.0, held=150.0, budget=200.0), 70.0)
    lifted = planner.evaluate(reading, 70.0)
    assert lifted.report.oom_kills == [] and lifted.allocation.budgets["/a"] == 200.0


def test_an_oom_kill_at_the_minimum_raises_the_reserve_of_the_pool():
    planner = planner_with_two_nodes()
    reading = MemoryReading("test", 10_000.0, 400.0)
    for name in ("/a", "/b"):
        planner.observe_profile(profile(name, 100.0, 300.0, held=100.0), 0.0)
    before = planner.evaluate(reading, 0.0)
    assert before.report.reserve_mb == 100.0
    for name, mb in before.pushes.items():
        planner.push_result(name, mb, True, "", 0.5)
    budget_a = planner.applied_mb("/a")
    action = planner.record_oom("/a", 1.0, "pressure")
    assert action.cap_mb == max(100.0, 0.75 * budget_a)
    after = planner.evaluate(reading, 1.0)
    assert after.report.reserve_mb == pytest.approx(100.0 + action.reserve_add_mb)
    assert after.report.total_mb == pytest.approx(before.report.total_mb - action.reserve_add_mb)


def test_node_events_round_trip_and_bad_ones_are_refused():
    event = NodeEvent("/ns/depth_node", "oom_kill", 3, -9, 1234, "the kernel counted 1 OOM kill(s)", 1.0)
    assert NodeEvent.from_json(event.to_json()) == event
    assert NodeEvent.from_json(NodeEvent("/x", "exit", 1, 1, 2).to_json()).restart_in_s is None
    for bad, field in (('{"node": "x", "kind": "exit", "event": 1, "exit_code": 1, "pid": 2}', "node"),
                       ('{"node": "/x", "kind": "boom", "event": 1, "exit_code": 1, "pid": 2}', "kind"),
                       ('{"node": "/x", "kind": "exit", "event": true, "exit_code": 1, "pid": 2}', "event"),
                       ('{"node": "/x", "kind": "exit", "event": 1, "exit_code": 1, "pid": 2, "restart_in_s": -1}',
                        "restart_in_s"),
                       ("[1]", "object"), ("{", "JSON")):
        with pytest.raises(ValueError, match=field):
            NodeEvent.from_json(bad)


def test_runtime_parameters_override_the_config_on_restart():
    store = RuntimeParameters()
    assert store.record("/ns/lane_node", "lane_threshold", 0.7)
    assert not store.record("/ns/lane_node", "lane_threshold", 0.7)
    assert store.record("/ns/lane_node", "camera_sizes", ("320x240",))
    assert store.for_node("/ns/lane_node") == {"lane_threshold": 0.7, "camera_sizes": ["320x240"]}
    assert store.for_node("/ns/depth_node") == {}
    spec = ProcessSpec("lane_node", "lane_node", "/ns", {"lane_threshold": 0.5, "threads": 1}, ())
    again = restart_spec(spec, store.for_node("/ns/lane_node"))
    assert again.parameters == {"lane_threshold": 0.7, "threads": 1, "camera_sizes": ["320x240"]}
    assert spec.parameters["lane_threshold"] == 0.5  # the config's spec is left as it was
    assert math.isclose(again.params_file_data()["/**"]["ros__parameters"]["lane_threshold"], 0.7)
