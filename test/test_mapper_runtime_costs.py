"""Runtime-matching predictions: part graphs of the runtime's own parts, the fit of the runtime
costs on hand-made cases, and a mapping measured in the stage runtime against its prediction."""
from __future__ import annotations

import os
import time

import numpy as np
import onnx
import pytest

from dynnet_ros.commands.map_inputs import scene_feeds
from dynnet_ros.mapper.build import build_stages
from dynnet_ros.mapper.hardware import load_hardware, parse_hardware
from dynnet_ros.mapper.mapping import StageAssignment, StageMapping
from dynnet_ros.mapper.partition import Partition, parse_partition
from dynnet_ros.mapper.runtime import StageExecutor
from dynnet_ros.mapper.runtime_costs import (
    Observation,
    contention_matters,
    fit_runtime_costs,
    part_graph,
    part_info,
    predict,
    time_parts,
)
from dynnet_ros.mapper.system_model import RuntimeCosts, Task, TaskGraph, chain_graph
from dynnet_ros.zoo import ensure_model

HW = parse_hardware({"name": "t", "units": [
    {"name": "a", "kind": "cpu", "dvfs": [{"name": "d", "power_w": 4.0}]},
    {"name": "b", "kind": "cpu", "dvfs": [{"name": "d", "power_w": 4.0}]}]})


def _observations(truth: RuntimeCosts) -> list[Observation]:
    """Chains on one unit and across two, and pairs of equal tasks on two units, 'measured' under
    ``truth``."""
    graphs = [(chain_graph([("g0", "a", 2.0, 0.0, 0, None), ("g1", "a", 3.0, 0.0, 0, None)], [0]), (0.5, 0.5)),
              (chain_graph([("g0", "b", 1.0, 0.0, 0, None), ("g1", "b", 1.0, 0.0, 0, None),
                            ("g2", "b", 6.0, 0.0, 0, None)]), (1.0,)),
              (chain_graph([("g0", "a", 1.0, 0.0, 0, None), ("g1", "b", 2.0, 0.0, 0, None)]), (1.0,)),
              (TaskGraph((Task(0, "x", "a", 4.0, 0.0), Task(1, "y", "b", 4.0, 0.0)), (0, 1)), (0.0, 1.0)),
              (TaskGraph((Task(0, "x", "a", 2.0, 0.0), Task(1, "y", "b", 2.0, 0.0)), (0, 1)), (0.25, 0.75))]
    out = []
    for graph, rates in graphs:
        probe = Observation(graph, rates, 1.0)
        out.append(Observation(graph, rates, predict(probe, HW, truth)))
    return out


def test_fit_recovers_known_runtime_costs():
    truth = RuntimeCosts(0.3, 1.4, 1.2, 0.8)
    observations = _observations(truth)
    # by hand: a pair of equal 4 ms tasks at contention 1.4 and slowdown 1.2 both end at 1.4 (4 * 1.2 + 0.3);
    # the chain across units pays (1 * 1.2 + 0.3) + no transfer cost (exchange 0) + handoff 0.8 + (2 * 1.2 + 0.3)
    assert observations[3].measured_ms == pytest.approx(1.4 * 5.1)
    assert observations[2].measured_ms == pytest.approx(1.5 + 0.8 + 2.7)
    fitted = fit_runtime_costs(observations, HW)
    assert fitted.contention == pytest.approx(1.4)
    assert fitted.slowdown == pytest.approx(1.2, rel=1e-6)
    assert fitted.dispatch_ms == pytest.approx(0.3, abs=1e-6)
    assert fitted.handoff_ms == pytest.approx(0.8, abs=1e-6)
    assert contention_matters(observations, HW)
    chains = observations[:2]
    assert not contention_matters(chains, HW)
    dispatch_only = fit_runtime_costs(_observations(RuntimeCosts(0.7))[:2], HW, [1.0], slowdown=False)
    assert (dispatch_only.contention, dispatch_only.slowdown) == (1.0, 1.0)
    assert dispatch_only.dispatch_ms == pytest.approx(0.7)
    with pytest.raises(ValueError, match="no measured mappings"):
        fit_runtime_costs([], HW)


def _frames(size=(64, 64), count=3):
    model = onnx.load(ensure_model("multiexit"))
    return model, list(scene_feeds(model, count, *size))


def test_part_graph_follows_the_runtime_parts():
    hw = load_hardware("this-machine")
    model, frames = _frames((32, 32))
    depth = build_stages(model, Partition())
    info = part_info(depth, frames[0])
    timings = {(k, j, u): 1.0 + k for k, parts in enumerate(info.parts) for j in range(len(parts))
               for u in ("cpu0", "cpu1")}
    graph = part_graph(info, ["cpu0", "cpu1", "cpu0"], timings, hw)
    assert len(graph.tasks) == sum(len(p) for p in info.parts) and len(graph.exits) == 3
    assert [t.unit for t in graph.tasks] == ["cpu0", "cpu1", "cpu0"] and graph.tasks[1].needs == (0,)
    assert graph.tasks[0].out_bytes > 0 and graph.tasks[2].out_bytes == 0      # the last stage hands nothing on
    assert graph.tasks[1].energy_mj == pytest.approx(2.0 * hw.unit("cpu1").level().power_w)
    # a width split whose stage 1 reuses stage 0's features: stage 1 is cut into parts, and a part
    # after the first waits for stage 0's part
    reuse = build_stages(model, parse_partition({"width": {"stages": 2, "P": [0.5, 0.5], "I": [1, 0]}}), frames)
    info = part_info(reuse, frames[0])
    assert len(info.parts[1]) > 1
    timings = {(k, j, u): 1.0 for k, parts in enumerate(info.parts) for j in range(len(parts))
               for u in ("cpu0", "cpu1")}
    graph = part_graph(info, ["cpu0", "cpu1"], timings, hw)
    first_of_stage1 = len(info.parts[0])
    assert any(0 in t.needs for t in graph.tasks[first_of_stage1 + 1:])
    with pytest.raises(ValueError, match="1 units for 2 stages"):
        part_graph(info, ["cpu0"], timings, hw)
    with pytest.raises(ValueError, match="no timing"):
        part_graph(info, ["cpu0", "cpu1"], {}, hw)


@pytest.mark.serial
def test_measured_mappings_keep_the_predicted_order():
    """Two mappings of multiexit's depth stages on cpu0 — every frame answered at exit 0, and
    every frame run to the last exit — measured in the stage runtime in one run (interleaved,
    min of N per frame): the measured order is the predicted one, and the slower mapping's ratio
    is within the stated band, a factor of 3 either way, of the predicted ratio. No wall-clock
    threshold: both sides are ratios of one run. The parts the prediction sums are timed in the
    same rounds as the mappings, each side the min over every round: on a machine shared with
    other jobs both sides then see the same load, where timed apart they would catch different
    moments of it and the ratio would measure the load's change rather than the prediction."""
    hw = load_hardware("this-machine")
    model, frames = _frames()
    depth = build_stages(model, Partition())
    info = part_info(depth, frames[0])
    parts: dict[tuple[int, int, str], float] = {}
    early = StageMapping(hw, Partition(), (StageAssignment("cpu0", None, 0.0), StageAssignment("cpu0", None, 0.0),
                                           StageAssignment("cpu0")))
    full = StageMapping(hw, Partition(), (StageAssignment("cpu0", None, 2.0), StageAssignment("cpu0", None, 2.0),
                                          StageAssignment("cpu0")))
    runners = [StageExecutor(depth, early), StageExecutor(depth, full)]
    best = np.full((2, len(frames)), np.inf)
    try:
        for _ in range(5):
            for key, ms in time_parts(info, hw, ["cpu0"], frames[0], repeats=3).items():
                parts[key] = min(parts.get(key, np.inf), ms)
            for i, runner in enumerate(runners):
                runner.run(frames[0])
                for f, feeds in enumerate(frames):
                    began = time.perf_counter()
                    runner.run(feeds)
                    best[i, f] = min(best[i, f], time.perf_counter() - began)
        assert runners[0].last_result is not None and runners[0].last_result.exit_index == 0
        assert runners[1].last_result is not None and runners[1].last_result.exit_index == 2
    finally:
        for runner in runners:
            runner.close()
    graph = part_graph(info, ["cpu0"] * 3, parts, hw)
    predicted = [predict(Observation(graph, (1.0, 0.0, 0.0), 1.0), hw),
                 predict(Observation(graph, (0.0, 0.0, 1.0), 1.0), hw)]
    measured = best.mean(axis=1)
    assert predicted[1] > predicted[0] and measured[1] > measured[0]
    ratio = (measured[1] / measured[0]) / (predicted[1] / predicted[0])
    assert 1 / 3 <= ratio <= 3, (f"measured {measured * 1000} ms, predicted {predicted} ms, parts {parts} ms "
                                 f"(load average {os.getloadavg()})")
