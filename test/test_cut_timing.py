"""The "auto" planner profile: the cut set is timed against one plain onnxruntime session once per
model file (backends/cut_timing.py, in the verdict's child process), and the leanest point of the
cost model's curve within the latency limit is taken, or one plain session where none is.

The search and the feeds are checked with given measures; the timing itself with executors whose
costs differ by construction (sleeps: load can only lengthen them); the verdict end to end with
limits no machine's noise can cross (a thousandth and a thousand times one session's time)."""
from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from dynnet_ros.cli import main
from dynnet_ros.commands import plan as plan_command
from dynnet_ros.engine import Engine
from dynnet_ros.engine.backends import cpu_planned, cut_verdict
from dynnet_ros.engine.backends.cut_timing import candidates, reference_feeds, search, time_ratio
from dynnet_ros.engine.modelio.models import InputSpec
from dynnet_ros.engine.plan.cost_model import CostTable, CutChoice, CutPoint
from dynnet_ros.engine.plan.options import PROFILES
from dynnet_ros.engine.runtime.executor import PlannedExecutor

pytestmark = pytest.mark.graph


def _chain_model(convs: int = 6, channels: int = 8) -> onnx.ModelProto:
    """Residual 3x3 convolutions at a dynamic size: the cost model cuts it and its curve has
    several points at the reference size."""
    rng = np.random.default_rng(0)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, "H", "W"])
    y = helper.make_tensor_value_info(f"t{convs}", TensorProto.FLOAT, [1, channels, "H", "W"])
    inits, nodes = [], []
    for i in range(convs):
        w = rng.standard_normal((channels, channels, 3, 3)).astype(np.float32) * 0.1
        inits.append(helper.make_tensor(f"w{i}", TensorProto.FLOAT, w.shape, w.ravel()))
        source = f"t{i}" if i else "x"
        nodes.append(helper.make_node("Conv", [source, f"w{i}"], [f"c{i}"], pads=[1, 1, 1, 1]))
        nodes.append(helper.make_node("Add", [f"c{i}", source], [f"t{i + 1}"]))
    return _model(helper.make_graph(nodes, "chain", [x], [y], inits))


def _model(graph: onnx.GraphProto) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _saved(model: onnx.ModelProto, tmp_path, monkeypatch) -> str:
    """The model's file, with a verdict cache of the test's own."""
    monkeypatch.setenv("DYNNET_LAYOUT_DIR", str(tmp_path / "cache"))
    path = tmp_path / f"{model.graph.name}.onnx"
    onnx.save(model, path)
    return str(path)


@pytest.fixture()
def chain_file(tmp_path, monkeypatch):
    return _saved(_chain_model(), tmp_path, monkeypatch)


# ----------------------------------------------------------------------------- search

def _measures(values):
    taken = []

    def measure(index):
        taken.append(index)
        return values[index]
    return measure, taken


def test_the_cost_models_pick_stands_when_it_is_within_the_limit():
    measure, taken = _measures([1.01, 0.9, 0.8])
    assert search(3, measure, 1.05) == (0, [(0, 1.01)])
    assert taken == [0]


def test_one_session_when_even_the_fastest_point_is_over_the_limit():
    measure, taken = _measures([1.9, 1.5, 1.2])
    index, probes = search(3, measure, 1.05)
    assert index is None and taken == [0, 2] and probes == [(0, 1.9), (2, 1.2)]
    assert search(1, _measures([1.2])[0], 1.05) == (None, [(0, 1.2)])
    assert search(0, _measures([])[0], 1.05) == (None, [])


def test_bisection_finds_the_leanest_point_within_the_limit():
    ratios = [2.0, 1.8, 1.5, 1.3, 1.1, 1.04, 1.02, 1.0, 0.98, 0.97]
    measure, taken = _measures(ratios)
    index, probes = search(len(ratios), measure, 1.05, max_probes=10)
    assert index == 5  # the first (leanest) within 1.05
    assert len(taken) == len(set(taken)) <= 2 + 4  # pick, fastest, then log2 of the rest


def test_bisection_stops_at_the_probe_cap_on_a_point_known_to_be_within():
    ratios = [2.0] * 4 + [1.0] * 60
    measure, taken = _measures(ratios)
    index, probes = search(len(ratios), measure, 1.05, max_probes=4)
    assert len(probes) == 4 and ratios[index] <= 1.05
    assert index < len(ratios) - 1  # it moved toward leaner points


def _point(segments: int, activation: int) -> CutPoint:
    return CutPoint(tuple((k,) for k in range(segments)), latency_s=1.0 / segments, activation_bytes=activation)


def test_candidates_run_from_the_pick_toward_faster_points_that_still_save_memory():
    leaner, pick, coarser, no_saving = _point(9, 30), _point(7, 40), _point(5, 60), _point(3, 95)
    ort_point = CutPoint(((0, 1, 2),), 0.1, 100, single_session=True)
    choice = CutChoice((leaner, pick, coarser, no_saving, ort_point), pick, ort_point, "test")
    assert candidates(choice, fallback_min_saving=0.1) == [pick, coarser]
    assert candidates(choice, fallback_min_saving=0.01) == [pick, coarser, no_saving]


# ----------------------------------------------------------------------------- feeds and timing

def test_reference_feeds_follow_the_inputs_types_and_leave_defaults_out():
    specs = [InputSpec("image", np.dtype(np.float32), (1, 3, "H", "W")),
             InputSpec("count", np.dtype(np.int64), (1,)),
             InputSpec("threshold", np.dtype(np.float32), (1,), has_default=True),
             InputSpec("history", np.dtype(np.float32), (), kind="sequence")]
    feeds = reference_feeds(specs, {"image": (1, 3, 8, 12), "count": (1,), "threshold": (1,), "history": ()})
    assert sorted(feeds) == ["count", "image"]
    assert feeds["image"].shape == (1, 3, 8, 12) and feeds["image"].dtype == np.float32
    assert np.isfinite(feeds["image"]).all() and feeds["image"].std() > 0
    assert feeds["count"].dtype == np.int64 and not feeds["count"].any()


class _Sleeper:
    name = "sleeper"

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def run(self, feeds):
        time.sleep(self.seconds)
        return {}


def test_timing_compares_the_two_sides_in_one_run():
    ratio = time_ratio(_Sleeper(0.004), _Sleeper(0.001), {})
    assert ratio > 2.0  # 4x by construction; a sleep only ever overruns, and the minimum is kept
    assert time_ratio(_Sleeper(0.001), _Sleeper(0.004), {}) < 0.5


# ----------------------------------------------------------------------------- the verdict

def _pick(path: str) -> CutChoice:
    plan = cpu_planned.compile_here(_chain_model(), threads=2, layout="nchwc", options=PROFILES["memory"])
    assert plan is not None and plan.cut_choice is not None and not plan.one_session
    return plan.cut_choice


def test_a_cut_set_over_the_limit_gives_one_plain_session_and_says_what_was_timed(chain_file):
    verdict = cpu_planned.decide(chain_file, 2, "nchwc", {**PROFILES["auto"], "latency_limit": 1e-3})
    assert verdict["fallback"] is True
    assert "ran over 0.00x" in verdict["reason"] and "x1x8x640x640" not in verdict["reason"]
    timing = verdict["timing"]
    assert timing["shapes"] == {"x": [1, 8, 640, 640]} and timing["limit"] == 1e-3
    assert timing["load_per_core"] >= 0
    assert timing["probes"] and all(p["ratio"] > 1e-3 for p in timing["probes"])
    assert verdict["cuts"]["curve"]  # the curve stays on record for `dynnet plan`


def test_a_cut_set_within_the_limit_is_kept_and_named_by_its_segments(chain_file):
    pick = _pick(chain_file)
    verdict = cpu_planned.decide(chain_file, 2, "nchwc", {**PROFILES["auto"], "latency_limit": 1e3})
    assert verdict["fallback"] is False
    assert verdict["segments"] == pick.chosen.sessions
    assert verdict["timing"]["probes"] == [{"segments": pick.chosen.sessions,
                                            "ratio": verdict["timing"]["probes"][0]["ratio"]}]
    assert "timed within 1000.00x" in verdict["reason"]


def test_the_serving_process_runs_the_point_its_verdict_names(chain_file, monkeypatch):
    pick = _pick(chain_file)
    other = next(p for p in pick.curve if not p.single_session and p.sessions != pick.chosen.sessions)
    verdict = {"fallback": False, "segments": other.sessions, "reason": "timed: the test's point"}
    monkeypatch.setenv("DYNNET_PLAN_PROFILE", "auto")
    monkeypatch.setattr(cpu_planned, "cut_verdict", lambda *args, **kwargs: verdict)
    with Engine(chain_file) as engine:
        executor = engine._executor
        assert isinstance(executor, PlannedExecutor)
        assert len(executor.segments) == other.sessions
        assert engine.stats()["plan"]["cuts"]["reason"] == "timed: the test's point"
        feeds = {"x": np.random.default_rng(1).standard_normal((1, 8, 32, 48)).astype(np.float32)}
        reference = cpu_planned.OrtExecutor(chain_file, threads=2).run(feeds)
        np.testing.assert_allclose(engine.run(feeds)["t6"], reference["t6"], rtol=1e-4, atol=1e-4)


def test_the_auto_profile_times_once_and_caches_its_verdict(chain_file, tmp_path, monkeypatch):
    monkeypatch.setenv("DYNNET_PLAN_PROFILE", "auto")
    with Engine(chain_file) as engine:  # decided in a child process: timed, then cached
        first = engine.stats()["plan"]
    verdicts = [json.loads(f.read_text()) for f in (tmp_path / "cache" / "verdicts").glob("*.json")]
    assert len(verdicts) == 1 and verdicts[0]["timing"]["probes"]
    if verdicts[0]["fallback"]:
        assert first["fallback"] and first["timing"] == verdicts[0]["timing"]
    else:
        assert first["cuts"]["reason"] == verdicts[0]["reason"]

    def no_child(*args, **kwargs):
        raise AssertionError("a cached verdict was decided again")

    monkeypatch.setattr(cut_verdict.subprocess, "run", no_child)
    with Engine(chain_file) as again:
        assert again.stats()["plan"].get("fallback") == first.get("fallback")


def test_dynnet_plan_shows_the_timed_points_and_the_verdict(chain_file, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DYNNET_PLAN_PROFILE", "auto")
    out = tmp_path / "plan.json"
    assert main(["plan", chain_file, "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "timed at x 1x8x640x640 against one onnxruntime session (limit 1.05x, load " in text
    report = json.loads(out.read_text())
    assert report["timing"]["probes"][0]["segments"] == _pick(chain_file).chosen.sessions
    if "fallback" in report:  # over the limit on this machine: one plain session, and why
        assert f"verdict: {report['fallback']}" in text and "ran over 1.05x" in report["fallback"]
    else:
        assert report["cuts"]["reason"].startswith("the leanest cut set timed within 1.05x")


def test_verdicts_of_engines_starting_together_are_decided_once(chain_file, monkeypatch):
    """Nodes of one graph start together: a second engine waits for the verdict the first is
    deciding (so timed verdicts never time each other) and then reads it from the cache."""
    children = []
    run = cut_verdict.subprocess.run

    def counted(*args, **kwargs):
        children.append(args)
        return run(*args, **kwargs)

    monkeypatch.setattr(cut_verdict.subprocess, "run", counted)
    with ThreadPoolExecutor(3) as pool:
        verdicts = list(pool.map(lambda _: cut_verdict.cut_verdict(chain_file, 2, "nchwc", PROFILES["memory"]),
                                 range(3)))
    assert len(children) == 1
    assert verdicts[0] is not None and verdicts.count(verdicts[0]) == 3


# ----------------------------------------------------------------------------- the single session

def _matmul_model(name: str, width: int) -> onnx.ModelProto:
    """x [N, 16] -> MatMul -> Relu -> y [N, width] (N is 1 at the reference shape): no cut holds
    less than one session's arena."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", width])
    w = helper.make_tensor("w", TensorProto.FLOAT, [16, width], np.ones(16 * width, np.float32))
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])]
    return _model(helper.make_graph(nodes, name, [x], [y], [w]))


@pytest.fixture()
def tiny_file(tmp_path, monkeypatch):
    """A few kilobytes of activations: a lean session saves nothing worth its allocations."""
    return _saved(_matmul_model("tiny", 1), tmp_path, monkeypatch)


@pytest.fixture()
def wide_file(tmp_path, monkeypatch):
    """Hundreds of kilobytes of activations: under LEAN_SAVES the lean session holds less than
    onnxruntime's defaults, and no cut set less than the lean session."""
    return _saved(_matmul_model("wide", 32768), tmp_path, monkeypatch)


#: onnxruntime's arena holding exactly what is live, a lean session half of that
LEAN_SAVES = CostTable(run_overhead_s=1e-4, fault_s_per_mb=1e-3, mac_s=1e-10, byte_s=1e-10, ort_arena_factor=1.0,
                       lean_arena_factor=0.5)


def test_a_single_session_is_lean_where_its_time_is_within_the_limit(wide_file):
    verdict = cpu_planned.decide(wide_file, 2, "nchwc",
                                 {**PROFILES["auto"], "latency_limit": 1e3, "cost_table": LEAN_SAVES})
    assert verdict["fallback"] is True and "saves less than" in verdict["reason"]
    assert verdict["lean"] is True and verdict["lean_ratio"] > 0


def test_a_single_session_keeps_onnxruntimes_defaults_where_lean_is_over_the_limit(wide_file, chain_file):
    for path, table in ((wide_file, LEAN_SAVES), (chain_file, None)):  # nothing to save; every cut set over
        verdict = cpu_planned.decide(path, 2, "nchwc",
                                     {**PROFILES["auto"], "latency_limit": 1e-3, "cost_table": table})
        assert verdict["fallback"] is True
        assert verdict["lean"] is False and verdict["lean_ratio"] > 1e-3


def test_an_untimed_single_session_is_lean_where_the_cost_model_predicts_a_saving(wide_file):
    verdict = cpu_planned.decide(wide_file, 2, "nchwc", {**PROFILES["memory"], "cost_table": LEAN_SAVES})
    assert verdict["fallback"] is True and verdict["lean"] is True and "lean_ratio" not in verdict


def test_a_single_session_that_would_save_nothing_lean_keeps_onnxruntimes_defaults(tiny_file):
    """Not timed either: a lean session allocates every tensor on every run, for no memory here."""
    for profile in ("memory", "auto"):
        verdict = cpu_planned.decide(tiny_file, 2, "nchwc", {**PROFILES[profile], "latency_limit": 1e3})
        assert verdict["fallback"] is True and verdict["lean"] is False and "lean_ratio" not in verdict
        assert verdict["reason"].startswith("one onnxruntime session: ")
    with Engine(tiny_file) as engine:
        assert engine.stats()["plan"]["lean"] is False
        assert engine._executor._session.get_session_options().enable_mem_pattern is True


@pytest.mark.parametrize("lean", [True, False])
def test_the_serving_process_runs_the_single_session_its_verdict_names(chain_file, monkeypatch, lean):
    verdict = {"fallback": True, "reason": "timed: the test's verdict", "cuts": None, "lean": lean,
               "lean_ratio": 1.0}
    monkeypatch.setenv("DYNNET_PLAN_PROFILE", "auto")
    monkeypatch.setattr(cpu_planned, "cut_verdict", lambda *args, **kwargs: verdict)
    with Engine(chain_file) as engine:
        plan = engine.stats()["plan"]
        assert plan["fallback"] is True and plan["lean"] is lean
        assert engine._executor._session.get_session_options().enable_mem_pattern is (not lean)


@pytest.mark.parametrize(("lean", "ratio", "kind"), [
    (True, 1.01, "lean: no memory patterns, arena blocks mapped afresh, timed 1.010x onnxruntime's defaults"),
    (False, 1.2, "onnxruntime's defaults, its own arena: lean timed 1.200x"),
    (False, None, "onnxruntime's defaults, its own arena)")])
def test_dynnet_plan_says_how_the_single_session_runs(tiny_file, tmp_path, monkeypatch, capsys, lean, ratio, kind):
    verdict = {"fallback": True, "reason": "one onnxruntime session: the test's verdict", "cuts": None,
               "lean": lean, "lean_ratio": ratio}
    monkeypatch.setattr(plan_command, "cut_verdict", lambda *args, **kwargs: verdict)
    out = tmp_path / "plan.json"
    assert main(["plan", tiny_file, "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["lean"] is lean and report["lean_ratio"] == ratio
    assert f"one plain onnxruntime session ({kind}" in capsys.readouterr().out


def test_a_lean_session_over_the_limit_is_timed_again_and_its_best_ratio_kept(tiny_file, monkeypatch):
    """Both sides run the same kernels: one noisy timing must not cost the lean session's memory."""
    measures = iter([1.20, 1.01, 5.0])
    calls = []

    def fake_ratio(candidate, baseline, feeds):
        calls.append(candidate)
        return next(measures)

    monkeypatch.setattr(cpu_planned, "time_ratio", fake_ratio)
    feeds = {"x": np.ones((2, 16), np.float32)}
    baseline = cpu_planned.OrtExecutor(tiny_file, threads=1)
    assert cpu_planned.lean_verdict(tiny_file, 1, baseline, feeds, 1.05) == {"lean": True, "lean_ratio": 1.01}
    assert len(calls) == 2 and all(c.lean for c in calls)
    measures = iter([1.3, 1.2, 1.4, 0.5])
    calls.clear()
    assert cpu_planned.lean_verdict(tiny_file, 1, baseline, feeds, 1.05) == {"lean": False, "lean_ratio": 1.2}
    assert len(calls) == cpu_planned.LEAN_TIMINGS == 3
