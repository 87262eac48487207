"""Runtime costs kept per hardware description and used inside the search: the handoff cost
raises an alternating mapping's prediction by exactly the crossings it pays, a large one moves
the pick to a single unit, the kept file round-trips, and a damaged one is ignored with a warning."""
from __future__ import annotations

import json

import numpy as np
import pytest

from dynnet_ros.cli import main
from dynnet_ros.mapper.hardware import load_hardware, parse_hardware
from dynnet_ros.mapper.nsga import run_search
from dynnet_ros.mapper.runtime_cache import (
    KeptCosts,
    costs_file,
    load_costs,
    read_costs_file,
    search_costs,
    write_costs,
)
from dynnet_ros.mapper.search import NEVER, ExitTable, StageCosts, StageSpace, pick
from dynnet_ros.mapper.system_model import RuntimeCosts

HW = parse_hardware({"name": "two-groups", "units": [
    {"name": "cpu0", "kind": "cpu", "dvfs": [{"name": "d", "power_w": 4}]},
    {"name": "cpu1", "kind": "cpu", "dvfs": [{"name": "d", "power_w": 4}]}],
    "exchange": {"default": {"latency_ms": 0.1, "ms_per_mb": 0.0}}})
# stage k costs 1 ms on its own unit (cpu0, cpu1, cpu0) and 3 ms on the other
OWN = ("cpu0", "cpu1", "cpu0")
ALTERNATING = ["cpu0", "cpu1", "cpu0"]
HANDOFF = 5.0


def _space(runtime=None):
    costs = StageCosts(("stage0", "stage1", "stage2"), ((), (0,), (1,)), (4096, 4096, 0), (1.0, 1.0, 1.0),
                       (("cpu0", "cpu1"),) * 3, {},
                       lambda s, unit, dvfs: ((1.0, 4.0) if unit == OWN[s] else (3.0, 12.0)))
    # early exits never agree with the final one: only "never exit early" keeps the accuracy
    exits = ExitTable(np.zeros((10, 3)), np.tile([False, False, True], (10, 1)))
    return StageSpace(HW, costs, exits, runtime=runtime)


def _latency(space, units):
    return space.score(units, {u: "d" for u in units}, [NEVER, NEVER]).latency_ms


def test_handoff_cost_raises_an_alternating_mapping_by_its_crossings():
    ideal, handed = _space(), _space(RuntimeCosts(handoff_ms=HANDOFF))
    # three 1 ms stages, two crossings of the 0.1 ms exchange
    assert _latency(ideal, ALTERNATING) == pytest.approx(3.0 + 2 * 0.1)
    assert _latency(handed, ALTERNATING) == pytest.approx(3.0 + 2 * 0.1 + 2 * HANDOFF)
    # no crossing, no handoff: cpu0-only is 1 + 3 + 1 ms either way
    assert _latency(ideal, ["cpu0"] * 3) == pytest.approx(5.0) == _latency(handed, ["cpu0"] * 3)


@pytest.mark.slow
def test_a_large_handoff_moves_the_pick_from_alternating_to_one_group():
    picks = {}
    for name, runtime in (("ideal", None), ("handoff", RuntimeCosts(handoff_ms=HANDOFF))):
        space = _space(runtime)
        result = run_search(space, generations=6, population=12, seed=0)
        chosen = pick(result, "latency", 0.01, space.exits.base_accuracy)
        every = [[a, b, c] for a in ("cpu0", "cpu1") for b in ("cpu0", "cpu1") for c in ("cpu0", "cpu1")]
        best = min(every, key=lambda units: _latency(space, units))
        assert [u for _, u in chosen.assignment] == best
        assert chosen.latency_ms == pytest.approx(_latency(space, best))
        picks[name] = best
    assert picks == {"ideal": ALTERNATING, "handoff": ["cpu0"] * 3}


def test_kept_costs_round_trip_per_hardware(tmp_path):
    costs = RuntimeCosts(0.22, 1.45, 0.97, 2.1)
    path = costs_file(tmp_path, HW)
    write_costs(path, KeptCosts(costs, HW.name, "a test fit", 6, 0.08))
    kept = load_costs(path)
    assert kept == KeptCosts(costs, HW.name, "a test fit", 6, 0.08)
    used = search_costs(tmp_path, HW)
    assert used.costs == costs and used.calibrated and used.warning is None
    assert used.to_json()["runtime_costs"] == {"dispatch_ms": 0.22, "contention": 1.45, "slowdown": 0.97,
                                               "handoff_ms": 2.1}
    # another hardware description is another file: nothing kept for it
    other = parse_hardware({"name": "two-groups", "units": [
        {"name": "cpu0", "kind": "cpu", "dvfs": [{"name": "d", "power_w": 5}]},
        {"name": "cpu1", "kind": "cpu", "dvfs": [{"name": "d", "power_w": 4}]}]})
    assert costs_file(tmp_path, other) != path
    assert search_costs(tmp_path, other).costs is None and not search_costs(tmp_path, other).calibrated
    # named costs win over kept ones; "none" is the paper's model
    assert search_costs(tmp_path, HW, ("--runtime-costs none", RuntimeCosts())).costs is None
    # the file a user names may be the kept file itself or a plain object of the fields
    assert read_costs_file(path) == costs
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps({"handoff_ms": 3}))
    assert read_costs_file(plain) == RuntimeCosts(handoff_ms=3.0)


@pytest.mark.parametrize("text", ["{not json", json.dumps({"version": 99, "runtime_costs": {}}),
                                  json.dumps({"version": 1, "hardware": "x", "source": "s",
                                              "runtime_costs": {"contention": 0.5}}),
                                  json.dumps([1, 2])])
def test_a_damaged_kept_file_is_ignored_with_a_warning(tmp_path, text):
    costs_file(tmp_path, HW).write_text(text)
    used = search_costs(tmp_path, HW)
    assert used.costs is None and not used.calibrated
    assert used.warning and str(costs_file(tmp_path, HW)) in used.warning


@pytest.mark.parametrize("data,why", [({"handoff": 1}, "unknown field"), ({"slowdown": 0}, "slowdown > 0"),
                                      ({"dispatch_ms": True}, "finite number"), ([1], "JSON object")])
def test_named_costs_are_validated(tmp_path, data, why):
    path = tmp_path / "c.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=why):
        read_costs_file(path)


CHAIN = """layer,unit,dvfs,latency_ms,power_w,transition_ms
g0,gpu,,1.0,20,0.1
g1,gpu,,3.0,20,0.1
g2,gpu,,1.0,20,
g0,dla0,,3.0,2,0.1
g1,dla0,,1.0,2,0.1
g2,dla0,,3.0,2,
"""


def _chain_search(tmp_path, monkeypatch, *extra):
    monkeypatch.setenv("DYNNET_MAP_DIR", str(tmp_path / "cache"))
    csv_file = tmp_path / "chain.csv"
    csv_file.write_text(CHAIN)
    out = tmp_path / "out.json"
    assert main(["map", "search", "--profile", str(csv_file), "--hw", "jetson-agx-xavier", "--prefer", "latency",
                 "--generations", "6", "--population", "10", "--json", str(out), *extra]) == 0
    return json.loads(out.read_text())


@pytest.mark.slow
def test_the_cli_searches_with_the_kept_costs_and_says_so(tmp_path, monkeypatch, capsys):
    hw = load_hardware("jetson-agx-xavier")
    plain = _chain_search(tmp_path, monkeypatch)
    assert plain["calibrated"] is False and "none kept" in plain["runtime_costs_source"]
    assert plain["pick"]["assignment"] == {"g0": "gpu", "g1": "dla0", "g2": "gpu"}
    assert plain["pick"]["latency_ms"] == pytest.approx(3.2)

    path = costs_file(tmp_path / "cache", hw)
    write_costs(path, KeptCosts(RuntimeCosts(handoff_ms=HANDOFF), hw.name, "a test fit"))
    kept = _chain_search(tmp_path, monkeypatch)
    assert kept["calibrated"] is True and str(path) in kept["runtime_costs_source"]
    assert kept["runtime_costs"]["handoff_ms"] == HANDOFF
    assert kept["pick"]["assignment"] == {"g0": "gpu", "g1": "gpu", "g2": "gpu"}
    assert kept["pick"]["latency_ms"] == pytest.approx(5.0)
    assert all(p["latency_ms"] >= 5.0 - 1e-9 for p in kept["pareto"])
    capsys.readouterr()
    assert main(["map", "show", str(tmp_path / "out.json")]) == 0
    shown = capsys.readouterr().out
    assert "predictions with runtime costs" in shown and "handoff_ms" in shown

    none = _chain_search(tmp_path, monkeypatch, "--runtime-costs", "none")
    assert none["calibrated"] is False and none["pick"] == plain["pick"]

    path.write_text("{damaged")
    capsys.readouterr()
    damaged = _chain_search(tmp_path, monkeypatch)
    assert damaged["calibrated"] is False and damaged["pick"] == plain["pick"]
    assert "warning" in capsys.readouterr().out
