"""Simulated Jetson costs: the roofline per layer by hand, the DLA's GPU fallback, and the search
on the simulated presets (valid candidates under the DLA pre-screen, a pick no worse than the
single-unit mappings on its preferred objective)."""
from __future__ import annotations

import onnx
import pytest

from dynnet_ros.commands.map_inputs import scene_feeds
from dynnet_ros.mapper.hardware import load_hardware, parse_hardware
from dynnet_ros.mapper.model_search import calibrate
from dynnet_ros.mapper.nsga import run_search
from dynnet_ros.mapper.profiler import stage_feeds
from dynnet_ros.mapper.search import StageSpace, pick
from dynnet_ros.mapper.simulate import LayerCost, layer_ms, simulated_costs, simulated_units, stage_cost
from dynnet_ros.mapper.stages import depth_stages
from dynnet_ros.zoo import ensure_model

MB = 1 << 20
HW = parse_hardware({"name": "sim", "units": [
    {"name": "gpu", "kind": "gpu", "dvfs": [{"name": "hi", "power_w": 10.0, "tops": 10.0}]},
    {"name": "dla0", "kind": "dla", "dvfs": [{"name": "hi", "power_w": 1.0, "tops": 4.0}]},
    {"name": "cpu", "kind": "cpu", "dvfs": [{"name": "hi", "power_w": 5.0}]}],
    "exchange": {"default": {"latency_ms": 0.1, "ms_per_mb": 0.05}}})


def test_layer_roofline_and_gpu_fallback_by_hand():
    conv = LayerCost("conv", 2e9, 8 * MB, 4 * MB, True)
    # GPU: 2e9 / (10e12 * 0.5 FP16 * 0.35) s = 1.142857 ms > memory 8 MB * 0.5 * 0.05 = 0.2 ms; + 0.01 launch
    assert layer_ms(conv, HW.unit("gpu"), "hi", HW) == pytest.approx(2e9 / 1.75e12 * 1e3 + 0.01)
    # DLA: 2e9 / (4e12 * 0.5 * 0.6) = 1.6667 ms + 0.02
    assert layer_ms(conv, HW.unit("dla0"), "hi", HW) == pytest.approx(2e9 / 1.2e12 * 1e3 + 0.02)
    copy = LayerCost("copy", 1e3, 80 * MB, 4 * MB, True)      # memory-bound: 80 * 0.5 * 0.05 = 2 ms
    assert layer_ms(copy, HW.unit("gpu"), "hi", HW) == pytest.approx(2.0 + 0.01)
    refused = LayerCost("odd", 2e9, 8 * MB, 4 * MB, False)
    dla, gpu = HW.unit("dla0"), HW.unit("gpu")
    latency, energy = stage_cost([conv, refused, conv], "dla0", "hi", HW)
    switch = 0.1 + 0.05 * 2.0                                  # 4 MB of float32 input as FP16: 2 MB
    on_dla, on_gpu = layer_ms(conv, dla, "hi", HW), layer_ms(refused, gpu, "hi", HW)
    assert latency == pytest.approx(2 * on_dla + on_gpu + 2 * switch)
    assert energy == pytest.approx(2 * on_dla * 1.0 + on_gpu * 10.0)
    assert stage_cost([conv, refused], "gpu", "hi", HW)[0] == pytest.approx(2 * on_gpu)   # the GPU runs both
    assert simulated_units(HW) == ("gpu", "dla0")               # the CPU has no tops: not simulated
    with pytest.raises(ValueError, match="cannot be simulated"):
        layer_ms(conv, HW.unit("cpu"), "hi", HW)


@pytest.mark.parametrize("board", ["jetson-agx-xavier", "jetson-agx-orin"])
def test_simulated_search_is_valid_and_beats_single_units(board):
    hw = load_hardware(board)
    model = onnx.load(ensure_model("multiexit"))
    frames = list(scene_feeds(model, 6, 64, 64))
    stage_set = depth_stages(model)
    calibration = calibrate(stage_set, frames)
    costs = simulated_costs(stage_set, calibration, stage_feeds(stage_set, frames[0]), hw)
    space = StageSpace(hw, costs, calibration.exits)
    result = run_search(space, generations=6, population=16, seed=0)
    assert {"gpu-only"} <= {b.label for b in result.baselines}
    for c in result.everything:
        for k, (_, unit) in enumerate(c.assignment):
            assert unit in costs.allowed[k] and (k, unit) not in costs.why_not    # DLA only where it passes
            assert hw.unit(unit).kind in ("gpu", "dla")
        for unit, level in c.dvfs:
            assert level in [lv.name for lv in hw.unit(unit).dvfs]
    base = calibration.exits.base_accuracy
    for prefer, objective in (("latency", "latency_ms"), ("energy", "energy_mj")):
        chosen = pick(result, prefer, 1.0, base)
        assert all(getattr(chosen, objective) <= getattr(b, objective) + 1e-9 for b in result.baselines)
