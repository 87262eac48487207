"""NSGA-II search: only valid candidates under every constraint, a non-dominated Pareto set,
seeded reproducibility, the pick rule, and the profile-only chain search."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from dynnet_ros.mapper.choices import load_choices
from dynnet_ros.mapper.hardware import load_hardware, parse_hardware
from dynnet_ros.mapper.nsga import run_search
from dynnet_ros.mapper.profile_io import parse_csv
from dynnet_ros.mapper.search import (
    ChainSpace,
    ExitTable,
    StageCosts,
    StageSpace,
    pick,
)

HW = parse_hardware({"name": "t", "units": [
    {"name": "gpu", "kind": "gpu", "memory_mb": 30, "idle_power_w": 0.5,
     "dvfs": [{"name": "hi", "frequency_mhz": 1000, "power_w": 20}, {"name": "lo", "frequency_mhz": 500,
                                                                      "power_w": 6}]},
    {"name": "dla0", "kind": "dla", "memory_mb": 30,
     "dvfs": [{"name": "hi", "frequency_mhz": 1000, "power_w": 3}]},
    {"name": "cpu", "kind": "cpu", "memory_mb": 100, "idle_power_w": 0.5,
     "dvfs": [{"name": "hi", "frequency_mhz": 2000, "power_w": 10}]}],
    "exchange": {"default": {"latency_ms": 0.1, "ms_per_mb": 0.05}}})
SPEED = {"gpu": 1.0, "dla0": 3.0, "cpu": 5.0}
WORK = (2.0, 3.0, 4.0)     # ms of each stage on the GPU at "hi"


def stage_cost(stage, unit, dvfs):
    level = HW.unit(unit).level(dvfs or None)
    clock = 1000.0 / (level.frequency_mhz or 1000.0) if unit == "gpu" else 1.0
    ms = WORK[stage] * SPEED[unit] * clock
    return ms, ms * level.power_w


def _exits(frames=200, seed=0):
    rng = np.random.default_rng(seed)
    confidence = rng.random((frames, 3))
    # an early exit is right more often when it is confident; the final exit is the reference
    correct = np.stack([rng.random(frames) < 0.4 + 0.6 * confidence[:, 0],
                        rng.random(frames) < 0.6 + 0.4 * confidence[:, 1], np.ones(frames, bool)], axis=1)
    return ExitTable(confidence, correct)


def _space(deadline=None, memory=None):
    costs = StageCosts(names=("stage0", "stage1", "stage2"), sources=((), (0,), (1,)),
                       out_bytes=(1 << 20, 1 << 19, 0), weight_mb=(10.0, 15.0, 20.0),
                       allowed=(("gpu", "dla0", "cpu"), ("gpu", "dla0", "cpu"), ("gpu", "cpu")),
                       why_not={(2, "dla0"): "Gemm: input rank 2"}, cost=stage_cost)
    return StageSpace(HW, costs, _exits(), deadline_ms=deadline, memory_mb=memory or {})


def _dominates(a, b):
    fa = (a.latency_ms, a.energy_mj, -a.accuracy)
    fb = (b.latency_ms, b.energy_mj, -b.accuracy)
    return all(x <= y for x, y in zip(fa, fb)) and fa != fb


def test_every_candidate_is_valid_and_the_front_is_non_dominated():
    space = _space(deadline=20.0)
    result = run_search(space, generations=8, population=16, seed=3)
    assert result.pareto and result.feasible <= result.evaluated
    for c in result.everything:
        units = dict(c.assignment)
        assert units["stage2"] != "dla0"                            # DLA pre-screen refused it
        assert c.worst_latency_ms <= 20.0 + 1e-9                    # deadline
        for unit, load in c.memory_mb:                              # memory per unit
            assert load <= HW.unit(unit).memory_mb + 1e-9
        assert len(c.thresholds) == 2 and math.isclose(sum(c.exit_rates), 1.0)
    for a in result.pareto:
        assert not any(_dominates(b, a) for b in result.everything)
    assert {b.label for b in result.baselines} == {"gpu-only", "cpu-only"}   # dla0 cannot run stage2


def test_memory_repair_moves_stages_and_deadline_filters():
    space = _space(memory={"gpu": 12.0})
    crowded = space.decode(space.encode(space.score(["gpu", "gpu", "gpu"], {"gpu": "hi"}, [math.inf] * 2)))
    loads = dict(crowded.memory_mb)
    assert loads["gpu"] <= 12.0
    with pytest.raises(ValueError, match="no candidate meets"):
        pick(run_search(_space(deadline=0.5), generations=2, population=8, seed=0))


def test_search_is_seeded_and_reproducible():
    a = run_search(_space(), generations=4, population=10, seed=11)
    b = run_search(_space(), generations=4, population=10, seed=11)
    assert [c.to_json() for c in a.pareto] == [c.to_json() for c in b.pareto]


def test_pick_rule_and_accuracy_drop():
    space = _space()
    result = run_search(space, generations=8, population=16, seed=2)
    fast = pick(result, "latency", max_accuracy_drop=1.0)
    frugal = pick(result, "energy", max_accuracy_drop=1.0)
    assert fast.latency_ms == min(c.latency_ms for c in result.pareto)
    assert frugal.energy_mj == min(c.energy_mj for c in result.pareto)
    strict = pick(result, "latency", max_accuracy_drop=0.0)
    assert strict.accuracy == pytest.approx(1.0)
    with pytest.raises(ValueError, match="--prefer"):
        pick(result, "speed")


def test_exit_table_rates_and_accuracy():
    # frame 0 is confident at exit 0 (5.0) but wrong there; frame 1 is not (0.1) and goes on to the final exit
    table = ExitTable(np.array([[5.0, 1.0], [0.1, 1.0]]), np.array([[False, True], [True, True]]))
    rates, accuracy = table.outcome([4.0])
    assert rates.tolist() == [0.5, 0.5]
    assert accuracy == 0.5          # frame 0 left early with argmax 0, the final exit says 1


CHAIN = """layer,unit,dvfs,latency_ms,power_w,transition_ms
g0,gpu,,1.0,20,0.3
g1,gpu,,1.0,20,0.3
g2,gpu,,1.0,20,
g0,dla0,,3.0,2,0.4
g1,dla0,,2.0,2,0.4
g2,dla0,,6.0,2,
"""


def test_profile_only_chain_search_against_exhaustive_front():
    hw = load_hardware("jetson-agx-xavier")
    profile = parse_csv(CHAIN, "chain.csv", hardware=hw)
    space = ChainSpace(hw, profile)
    result = run_search(space, generations=10, population=12, seed=0)
    # all 8 assignments by hand: the search's front must equal the exhaustive one
    every = []
    for code in range(8):
        units = ["dla0" if code >> j & 1 else "gpu" for j in range(3)]
        every.append(space.score(units, {u: "" for u in units}))
    exhaustive = {tuple(u for _, u in c.assignment) for c in every if not any(_dominates(o, c) for o in every)}
    assert {tuple(u for _, u in c.assignment) for c in result.pareto} == exhaustive
    mixed = space.score(["gpu", "dla0", "gpu"], {"gpu": "", "dla0": ""})
    assert mixed.latency_ms == pytest.approx(1.0 + 0.3 + 2.0 + 0.4 + 1.0)
    assert mixed.energy_mj == pytest.approx(20 + 4 + 20 + hw.unit("gpu").idle_power_w * mixed.latency_ms)
    assert {b.label for b in result.baselines} == {"gpu-only", "dla0-only"}
    deadline = ChainSpace(hw, profile, deadline_ms=4.0)
    for c in run_search(deadline, generations=5, population=8, seed=0).everything:
        assert c.latency_ms <= 4.0


def test_cli_profile_only_search_writes_the_contract(tmp_path):
    from dynnet_ros.cli import main
    csv_file = tmp_path / "chain.csv"
    csv_file.write_text(CHAIN)
    out = tmp_path / "out.json"
    assert main(["map", "search", "--profile", str(csv_file), "--hw", "jetson-agx-xavier", "--prefer", "energy",
                 "--generations", "4", "--population", "8", "--json", str(out), "--png", str(tmp_path / "p.png")]) == 0
    import json
    data = json.loads(out.read_text())
    assert set(data["pick"]["assignment"]) == {"g0", "g1", "g2"}
    assert data["pick"]["energy_mj"] == min(p["energy_mj"] for p in data["pareto"])
    assert (tmp_path / "p.png").stat().st_size > 0
    assert main(["map", "show", str(out)]) == 0
    assert main(["map", "search", "--profile", str(csv_file), "--hw", "jetson-agx-xavier", "--deadline-ms",
                 "0.1", "--generations", "2", "--population", "4"]) == 2


@pytest.mark.slow
def test_model_search_pick_runs_in_the_stage_runtime(tmp_path, monkeypatch):
    """The picked mapping runs in the stage runtime; measured vs predicted is reported, and the
    runtime costs fitted to the baselines predict the pick (no wall-clock threshold: the machine
    is shared). A small model input and budget keep it quick; every step of the real search runs."""
    import json

    import yaml

    from dynnet_ros.cli import main
    from dynnet_ros.mapper.mapping import load_mapping
    monkeypatch.setenv("DYNNET_MAP_DIR", str(tmp_path / "cache"))
    out, mapping = tmp_path / "out.json", tmp_path / "mapping.yaml"
    assert main(["map", "search", "zoo:multiexit", "--size", "32x32", "--frames", "3", "--repeats", "1", "--no-layers",
                 "--generations", "2", "--population", "4", "--max-accuracy-drop", "1", "--measure",
                 "--json", str(out), "--mapping", str(mapping)]) == 0
    data = json.loads(out.read_text())
    assert list(data["pick"]["assignment"]) == ["stage0", "stage1", "stage2"]
    assert 0 < data["measured"]["min_ms"] <= data["measured"]["mean_ms"] and data["measured"]["frames"] == 15
    assert data["measured"]["predicted_calibrated_ms"] > 0 and data["measured"]["calibrated_error"] >= 0
    held_out = data["measured"]["runtime_costs"]
    assert held_out["slowdown"] > 0 and held_out["contention"] >= 1
    assert data["calibrated"] is False and data["runtime_costs"]["handoff_ms"] == 0    # nothing kept yet
    assert abs(sum(data["measured"]["exit_rates"]) - 1) < 1e-9
    measured = data["measured_baselines"]           # every single-unit mapping and the static split ran too
    assert {"cpu0-only", "static-split"} <= set(measured) and all(m["mean_ms"] > 0 for m in measured.values())
    assert {"alternating", "alternating-flipped"} <= set(measured)   # calibration runs that cross units
    assert data["measured_mape"] >= 0
    loaded = load_mapping(mapping)
    assert [s.unit for s in loaded.stages] == list(data["pick"]["assignment"].values())
    assert yaml.safe_load(mapping.read_text())["hardware"] == "this-machine"
    assert list((tmp_path / "cache").glob("profile-*.csv"))      # cached per model + hardware
    # the costs fitted to every measured mapping are kept for the hardware; the next search predicts with them
    kept = data["runtime_costs_kept"]
    assert kept["observations"] == 1 + len(measured) and Path(kept["file"]).is_file()
    again = tmp_path / "again.json"
    assert main(["map", "search", "zoo:multiexit", "--size", "32x32", "--frames", "3", "--repeats", "1",
                 "--no-layers", "--generations", "2", "--population", "4", "--max-accuracy-drop", "1",
                 "--json", str(again)]) == 0
    second = json.loads(again.read_text())
    assert second["calibrated"] is True and second["runtime_costs"] == kept["runtime_costs"]
    assert kept["file"] in second["runtime_costs_source"]
    assert load_choices(Path(second["search_cache"])).runtime_costs["runtime_costs"] == kept["runtime_costs"]


def test_width_space_candidates_respect_shares_and_the_reuse_cap():
    from dynnet_ros.mapper.model_search import SHARE_STEPS, WidthSpace
    hw = parse_hardware({"name": "two", "units": [
        {"name": "cpu0", "kind": "cpu", "dvfs": [{"name": "d", "power_w": 4}]},
        {"name": "cpu1", "kind": "cpu", "dvfs": [{"name": "d", "power_w": 4}]}]})
    built = []

    def build(spec):
        built.append(spec)
        share = np.mean([spec.fractions(layer)[0] for layer in ("a", "b", "c")])
        reused = sum(spec.reads(layer)[1][0] for layer in ("b", "c"))
        costs = StageCosts(("stage0", "stage1"), ((), (0,) if reused else ()), (1 << 16, 0), (1.0, 1.0),
                           (("cpu0", "cpu1"), ("cpu0", "cpu1")), {},
                           lambda s, unit, dvfs: ((10 * share if s == 0 else 10 * (1 - share)) + 1, 1.0))
        rng = np.random.default_rng(len(built))
        conf = rng.random((50, 2))
        correct = np.stack([conf[:, 0] > 0.5 - 0.2 * reused, np.ones(50, bool)], axis=1)
        return costs, ExitTable(conf, correct)

    space = WidthSpace(hw, ("a", "b", "c"), ("b", "c"), 2, build, reuse_cap=0.5)
    result = run_search(space, generations=4, population=10, seed=1)
    assert result.pareto
    for c in result.everything:
        spec = json.loads(c.partition)
        for row in spec["P"]["layers"].values():
            assert abs(sum(row) - 1) < 1e-9 and min(row) >= 1 / SHARE_STEPS - 1e-9
            assert all(abs(v * SHARE_STEPS - round(v * SHARE_STEPS)) < 1e-9 for v in row)
        assert c.reuse is not None and c.reuse <= 0.5 + 1e-9
        assert len({u for _, u in c.assignment}) == 2                 # width stages on distinct units
        for matrix in spec["I"]["layers"].values():
            assert matrix[0] == [0, 0] and matrix[1][1] == 0        # a stage reads only earlier stages
        assert space.decode(space.encode(c)).key() == c.key()        # genomes round-trip
    assert len({json.dumps(s.to_json(), sort_keys=True) for s in built}) == len(built)   # each split built once
