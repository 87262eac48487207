"""Picks from a cached search result under a budget (mapper/choices.py), the budget manager's
per-unit memory (budget/), and `dynnet map search` writing the cache."""
from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest
from _waiting import wait_for

from dynnet_ros.budget.planner import BudgetPlanner, ManagerConfig, NodeConfig, split_units
from dynnet_ros.budget.protocol import ModelProfile, unit_budget
from dynnet_ros.budget.sources import MemoryReading
from dynnet_ros.mapper.choices import (
    Constraints,
    SearchChoices,
    cache_file,
    covering_set,
    load_choices,
    pick_within,
    write_choices,
)
from dynnet_ros.mapper.hardware import load_hardware
from dynnet_ros.mapper.search import NEVER, Candidate, choose, pareto_front


def cand(name: str, latency: float, energy: float, memory: dict[str, float], accuracy: float = 1.0,
         worst: float | None = None) -> Candidate:
    units = tuple(memory) or ("gpu",)
    return Candidate(tuple((f"stage{i}", u) for i, u in enumerate(units)), tuple((u, "") for u in units), (NEVER,),
                     latency, energy, accuracy, worst if worst is not None else latency, (0.0, 1.0),
                     tuple(memory.items()), name)


def choices_of(*candidates: Candidate, base: float = 1.0, rule: Constraints | None = None) -> SearchChoices:
    return SearchChoices("digest", "jetson", "64x64", base, rule or Constraints(prefer="latency"), candidates)


FAST = cand("fast", 10.0, 50.0, {"dla0": 60.0, "gpu": 10.0})
MIDDLE = cand("middle", 14.0, 40.0, {"dla0": 20.0, "gpu": 50.0})
GPU = cand("gpu", 20.0, 80.0, {"gpu": 70.0}, worst=30.0)


def test_a_shrinking_unit_memory_moves_the_pick_to_a_lighter_candidate():
    stored = choices_of(FAST, MIDDLE, GPU)
    assert pick_within(stored, Constraints(prefer="latency")).candidate.label == "fast"
    tighter = pick_within(stored, Constraints({"dla0": 30.0}, prefer="latency"))
    assert tighter.candidate.label == "middle"
    assert tighter.excluded == {"dla0's 30 MB": 1} and "best of 2 of 3 cached candidates" in tighter.reason
    assert pick_within(stored, Constraints({"dla0": 0.0}, prefer="latency")).candidate.label == "gpu"
    with pytest.raises(ValueError, match="1 over the 25 ms deadline") as err:
        pick_within(stored, Constraints({"dla0": 0.0}, deadline_ms=25.0))
    assert "2 over dla0's 0 MB" in str(err.value)
    # the rule: energy prefers the middle one; an accuracy drop limit can rule the fast one out
    assert pick_within(stored, Constraints(prefer="energy")).candidate.label == "middle"
    sloppy = choices_of(FAST, MIDDLE, GPU, cand("inexact", 5.0, 5.0, {"gpu": 1.0}, accuracy=0.9))
    assert pick_within(sloppy, Constraints(prefer="latency", max_accuracy_drop=0.2)).candidate.label == "inexact"
    assert pick_within(sloppy, Constraints(prefer="latency", max_accuracy_drop=0.05)).candidate.label == "fast"


def test_constraints_refuse_bad_values():
    for bad in ({"prefer": "speed"}, {"max_accuracy_drop": 2.0}, {"deadline_ms": 0.0},
                {"unit_memory_mb": {"dla0": -1.0}}, {"unit_memory_mb": {"dla0": math.inf}}):
        with pytest.raises(ValueError):
            Constraints(**bad)


def test_the_covering_set_keeps_the_lighter_candidate_the_pareto_front_drops():
    heavy = cand("heavy", 10.0, 10.0, {"dla0": 50.0})
    light = cand("light", 12.0, 12.0, {"dla0": 10.0})          # dominated on latency/energy, lighter
    worse = cand("worse", 13.0, 13.0, {"dla0": 60.0})          # beaten everywhere by heavy
    assert [c.label for c in pareto_front([heavy, light, worse])] == ["heavy"]
    assert [c.label for c in covering_set([heavy, light, worse])] == ["heavy", "light"]


def test_a_pick_from_the_covering_set_equals_a_pick_from_everything():
    """The cache's claim: for any memory limits and deadline the stored candidates hold the best."""
    rng = np.random.default_rng(0)
    units = ("dla0", "dla1", "gpu")
    for trial in range(40):
        everything = [cand(f"c{i}", float(rng.uniform(5, 50)), float(rng.uniform(5, 50)),
                           {u: float(rng.choice([0.0, rng.uniform(1, 40)])) for u in units},
                           accuracy=float(rng.choice([1.0, 0.98, 0.9])), worst=float(rng.uniform(20, 80)))
                      for i in range(30)]
        stored = choices_of(*covering_set(everything))
        for _ in range(10):
            limits = {u: float(rng.uniform(0, 45)) for u in units if rng.random() < 0.7}
            deadline = float(rng.uniform(30, 90)) if rng.random() < 0.5 else None
            rule = Constraints(limits, deadline, str(rng.choice(["latency", "energy", "balanced"])),
                               float(rng.choice([0.0, 0.05, 0.2])))
            fitting = [c for c in everything if all(c.memory_need(u) <= mb for u, mb in limits.items())
                       and (deadline is None or c.worst_latency_ms <= deadline)]
            try:
                best = choose(pareto_front(fitting), rule.prefer, rule.max_accuracy_drop) if fitting else None
            except ValueError:
                best = None
            if best is None:
                with pytest.raises(ValueError):
                    pick_within(stored, rule)
                continue
            got = pick_within(stored, rule).candidate
            assert (got.latency_ms, got.energy_mj, got.accuracy) == (best.latency_ms, best.energy_mj, best.accuracy), \
                (trial, rule)


def test_cache_round_trip_and_damage(tmp_path):
    stored = choices_of(FAST, MIDDLE, GPU, rule=Constraints({"dla0": 100.0}, 50.0, "balanced", 0.02))
    hw = load_hardware("jetson-agx-orin")
    path = cache_file(tmp_path, b"model bytes", hw)
    assert path != cache_file(tmp_path, b"other model", hw) != cache_file(tmp_path, b"model bytes",
                                                                         load_hardware("jetson-agx-xavier"))
    with pytest.raises(FileNotFoundError):
        load_choices(path)
    write_choices(path, stored)
    loaded = load_choices(path)
    assert loaded.rule == stored.rule and loaded.size == "64x64"
    assert [c.to_json() for c in loaded.candidates] == [c.to_json() for c in stored.candidates]
    assert math.isinf(loaded.candidates[0].thresholds[0])
    assert loaded.runtime_costs is None
    costs = {"runtime_costs": {"handoff_ms": 2.0}, "calibrated": True, "runtime_costs_source": "a test"}
    write_choices(path, replace(stored, runtime_costs=costs))
    assert load_choices(path).runtime_costs == costs
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not JSON"):
        load_choices(path)
    path.write_text(json.dumps({"version": 1, "candidates": [{"assignment": {}}]}))
    with pytest.raises(ValueError, match="search cache"):
        load_choices(path)


# ------------------------------------------------------------------------------------ budget side
def test_unit_memory_is_shared_by_priority_among_the_nodes_that_ask():
    shares = split_units({"dla0": 90.0, "gpu": 10.0}, {"/a": (2.0, ("dla0",)), "/b": (1.0, ("dla0", "gpu")),
                                                        "/c": (1.0, ())})
    assert shares == {"/a": {"dla0": 60.0}, "/b": {"dla0": 30.0, "gpu": 10.0}}
    assert split_units({}, {"/a": (1.0, ("dla0",))}) == {}


def test_the_budget_report_carries_each_nodes_unit_memory():
    planner = BudgetPlanner(ManagerConfig(nodes=(NodeConfig("/lane", priority=3.0),),
                                          unit_memory_mb={"dla0": 40.0}))
    table = ((10.0, 50.0), (20.0, 30.0))
    for name, units in (("/lane", ("dla0", "gpu")), ("/depth", ("dla0",)), ("/ped", ())):
        planner.observe_profile(ModelProfile(name, 10.0, 20.0, table, held_mb=5.0, units=units), 0.0)
    report = planner.evaluate(MemoryReading("test", 4000.0, 2000.0), 0.1).report
    assert report.unit_memory_mb == {"dla0": 40.0}
    assert report.unit_budgets == {"/lane": {"dla0": 30.0}, "/depth": {"dla0": 10.0}}
    text = report.to_json()
    assert unit_budget(text, "/lane") == {"dla0": 30.0} and unit_budget(text, "/ped") is None
    for bad in ("[]", '{"unit_budgets": []}', '{"unit_budgets": {"/lane": {"dla0": -1}}}', "nope"):
        with pytest.raises(ValueError):
            unit_budget(bad, "/lane")


def test_profiles_carry_units_and_the_manager_parameter_parses():
    from dynnet_ros.nodes.budget_control import MANAGER_SPECS, config_from_params

    profile = ModelProfile("/lane", 1.0, 2.0, units=("cpu0", "cpu1"))
    assert ModelProfile.from_json(profile.to_json()).units == ("cpu0", "cpu1")
    with pytest.raises(ValueError, match="units"):
        ModelProfile.from_json('{"node": "/x", "units": [""]}')
    params = {s.name: s.default for s in MANAGER_SPECS}
    assert config_from_params(params).unit_memory_mb == {}
    assert config_from_params({**params, "unit_memory_mb": ["dla0=64", " gpu = 512 "]}).unit_memory_mb == \
        {"dla0": 64.0, "gpu": 512.0}
    spec = next(s for s in MANAGER_SPECS if s.name == "unit_memory_mb")
    for bad in (["dla0"], ["dla0=-3"], ["=4"], ["dla0=1", "dla0=2"]):
        assert spec.validate(bad), bad


# ------------------------------------------------------------------------------------ the CLI writes it
def test_map_search_caches_candidates_that_reproduce_its_pick(tmp_path, monkeypatch):
    from dynnet_ros.cli import main
    from dynnet_ros.zoo import ensure_model

    monkeypatch.setenv("DYNNET_MAP_DIR", str(tmp_path / "cache"))
    out = tmp_path / "out.json"
    assert main(["map", "search", "zoo:multiexit", "--size", "64x64", "--frames", "4", "--repeats", "1",
                 "--no-layers", "--generations", "2", "--population", "6", "--max-accuracy-drop", "0.5",
                 "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    path = cache_file(tmp_path / "cache", ensure_model("multiexit").read_bytes(), load_hardware("this-machine"))
    assert data["search_cache"] == str(path)
    stored = load_choices(path)
    assert stored.rule == Constraints({}, None, "balanced", 0.5) and stored.size == "64x64"
    assert stored.runtime_costs is not None and stored.runtime_costs["calibrated"] is False   # none kept
    assert all(c.memory_mb and all(mb > 0 for _, mb in c.memory_mb) for c in stored.candidates)
    again = pick_within(stored, stored.rule).candidate
    assert again.to_json() == stored.pick.to_json() and dict(again.assignment) == data["pick"]["assignment"]
    # every Pareto candidate of the run is among the stored ones
    keys = {json.dumps(c.to_json(), sort_keys=True) for c in stored.candidates}
    assert all(json.dumps(p, sort_keys=True) in keys for p in data["pareto"])


# ------------------------------------------------------------------------------------ the node's re-pick runner
def test_rerun_coalesces_requests_and_reports_failures():
    import threading

    from dynnet_ros.perception.mapped import Rerun

    started, release, done = threading.Event(), threading.Event(), threading.Event()
    runs: list[int] = []
    errors: list[str] = []

    def work() -> None:
        runs.append(len(runs))
        started.set()
        assert release.wait(60)
        if len(runs) == 2:
            done.set()

    runner = Rerun(work, "test-rerun", lambda: False, errors.append)
    runner.request()
    assert started.wait(60)
    for _ in range(5):           # five budgets while the first run builds: one more run, not five
        runner.request()
    release.set()
    assert done.wait(60)
    runner.request()             # after both finished, a request runs again
    wait_for(lambda: len(runs) == 3, 60, "the third run")
    assert runs == [0, 1, 2] and not errors

    def fail() -> None:
        raise RuntimeError("cannot build")

    failed = Rerun(fail, "test-rerun-fail", lambda: False, lambda trace: (errors.append(trace), done.set()))
    done.clear()
    failed.request()
    assert done.wait(60) and "cannot build" in errors[0]
    stopped = Rerun(lambda: runs.append(99), "test-rerun-stopped", lambda: True, errors.append)
    stopped.request()
    for thread in threading.enumerate():
        if thread.name == "test-rerun-stopped":
            thread.join(60)
    assert 99 not in runs
