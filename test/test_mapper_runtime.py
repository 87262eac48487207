"""The stage runtime: concurrency on two CPU groups, early exit, deadlines, mapping files, unit plans."""
from __future__ import annotations

import os
from dataclasses import replace

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import yaml

from dynnet_ros.engine.runtime.base import Executor
from dynnet_ros.mapper.build import build_stages
from dynnet_ros.mapper.hardware import load_hardware
from dynnet_ros.mapper.mapping import load_mapping, parse_mapping
from dynnet_ros.mapper.partition import Partition, parse_partition
from dynnet_ros.mapper.runtime import FrameResult, StageExecutor
from dynnet_ros.mapper.units import affinity_string, plan_unit, trt_reason
from dynnet_ros.zoo import ensure_model, example_inputs

TWO_GROUPS = len(os.sched_getaffinity(0)) >= 2


@pytest.fixture(scope="module")
def multiexit():
    return onnx.load(ensure_model("multiexit"))


@pytest.fixture(scope="module")
def depth_set(multiexit):
    return build_stages(multiexit, Partition())


def _mapping(thresholds, deadline=None, units=("cpu0", "cpu1", "cpu0")):
    stages = [{"unit": u, "threshold": t} for u, t in zip(units, thresholds)]
    stages[-1].pop("threshold")
    return parse_mapping({"hardware": "this-machine", "stages": stages, "deadline_ms": deadline})


def test_the_runtime_is_an_executor_and_answers_like_the_model(multiexit, depth_set):
    executor = StageExecutor(depth_set, _mapping([2.0, 2.0, None]))
    try:
        protocol: Executor = executor    # mypy (make lint) checks it satisfies the protocol
        assert protocol.name == "mapped" and protocol.arena_bytes_at({"image": (1, 3, 96, 128)}) is None
        feed = example_inputs("multiexit", 96, 128)
        out = executor.run(feed)
        ref = ort.InferenceSession(multiexit.SerializeToString(), providers=["CPUExecutionProvider"]).run(
            ["exit2"], feed)[0]
        assert list(out) == ["exit2"] and np.array_equal(out["exit2"], ref)
        result = executor.last_result
        assert result is not None and result.exit_index == 2 and not result.early
        assert set(result.stage_ms) == {0, 1, 2}
        stats = executor.executor_stats()
        assert stats.blocks == 3 and stats.details["exit_histogram"] == {"2": 1}
        assert stats.details["mean_latency_ms"] == pytest.approx(result.latency_ms, abs=1e-3)
        assert stats.details["predicted_latency_ms"] is None
        assert stats.resident_weight_bytes == sum(s.weight_bytes for s in depth_set.stages)
    finally:
        executor.close()


def test_a_confident_early_exit_skips_the_later_stages(depth_set):
    executor = StageExecutor(depth_set, _mapping([0.0, 0.0, None]))
    try:
        feed = example_inputs("multiexit", 96, 128)
        for _ in range(3):
            out = executor.run(feed)
            result = executor.last_result
            assert result is not None and result.exit_index == 0 and result.early
            assert result.skipped == (1, 2) and set(result.stage_ms) == {0}
        # the early answer stands in for the final output's name
        assert list(out) == ["exit2"] and out["exit2"].shape == (1, 10)
        assert executor.histogram == {0: 3}
        executor.set_thresholds([2.0, 0.0, None])   # exit 0 never confident now; exit 1 always
        executor.run(feed)
        assert executor.last_result.exit_index == 1
        with pytest.raises(ValueError, match="the last one None"):
            executor.set_thresholds([0.5, 0.5, 0.5])
    finally:
        executor.close()


def test_deadline_mode_answers_with_the_deepest_exit_done_by_then(depth_set):
    executor = StageExecutor(depth_set, _mapping([2.0, 2.0, None], deadline=1.0))
    try:
        feed = example_inputs("multiexit", 96, 128)
        executor.run(feed)
        result = executor.last_result
        # nothing is done within 1 ms: the first exit to finish answers, marked as the deadline's
        assert result.deadline_hit and result.exit_index == 0 and result.skipped == (1, 2)
        executor.set_deadline(None)
        executor.run(feed)
        assert executor.last_result.exit_index == 2 and not executor.last_result.deadline_hit
        # a deadline long past the full frame changes nothing
        executor.set_deadline(60_000.0)
        executor.run(feed)
        assert executor.last_result.exit_index == 2 and not executor.last_result.deadline_hit
    finally:
        executor.close()


@pytest.mark.serial
@pytest.mark.skipif(not TWO_GROUPS, reason="needs two cores for two CPU groups")
def test_two_cpu_groups_run_two_width_stages_at_once(multiexit):
    """The wall time the stages of a frame ran < the sum of their run times: they overlapped.

    Measured as a ratio within each frame (the time any stage ran, from their start/end times,
    over the sum of their run times), best of up to 16 frames: other jobs on the cores may starve
    one group for a whole frame, but not for every frame."""
    stage_set = build_stages(multiexit, parse_partition({"width": {"stages": 2, "P": [0.5, 0.5], "I": [0, 0]}}))
    executor = StageExecutor(stage_set, _mapping([2.0, None], units=("cpu0", "cpu1")))
    try:
        feed = example_inputs("multiexit", 224, 320)
        executor.run(feed)
        overlaps = []
        for _ in range(16):
            executor.run(feed)
            result = executor.last_result
            assert set(result.spans) == {0, 1}
            overlaps.append(result.overlap)
            if result.overlap > 0.15:
                break
        assert max(overlaps) > 0.15, overlaps
        busy = executor.busy_fractions()
        assert set(busy) == {"cpu0", "cpu1"} and all(v > 0 for v in busy.values())
    finally:
        executor.close()


def test_stage_count_must_match_the_mapping(depth_set):
    with pytest.raises(ValueError, match="2 stage entries for a model cut into 3 stages"):
        StageExecutor(depth_set, _mapping([0.5, None], units=("cpu0", "cpu1")))


def test_a_budget_smaller_than_the_stages_weights_is_refused(depth_set):
    with pytest.raises(ValueError, match="exceed the model's budget"):
        StageExecutor(depth_set, _mapping([0.5, 0.5, None]), budget_bytes=1 << 20)


@pytest.mark.parametrize("data,reason", [
    ({"stages": [{"unit": "npu0"}]}, "has no unit 'npu0'; its units: cpu0"),
    ({"stages": [{"unit": "cpu0", "threshold": 0.5}]}, "last stage: its exit always answers"),
    ({"stages": [{"unit": "cpu0", "dvfs": "turbo"}]}, "no DVFS level 'turbo'"),
    ({"stages": []}, "'stages' must be a non-empty list"),
    ({"stages": ["cpu0"], "criterion": "vibes"}, "unknown criterion 'vibes'"),
    ({"stages": ["cpu0"], "deadline_ms": -3}, "deadline_ms must be a positive number"),
    ({"stages": ["cpu0"], "hardware": "nope"}, "unknown hardware 'nope'"),
    ({"stages": ["cpu0"], "partition": {"width": {"stages": 2, "P": [0.7, 0.7]}}}, "must sum to 1"),
    ({"stages": ["cpu0"], "partition": {"width": {"stages": 2, "P": [0.5, 0.5], "I": [[0, 1], [0, 0]]}}},
     "features from later stage 1"),
    ({"stages": ["cpu0"], "units": 3}, "unknown keys"),
    ({"stages": ["cpu0"], "predicted_latency_ms": "fast"}, "predicted_latency_ms must be a number"),
])
def test_bad_mapping_files_are_refused_with_the_reason(tmp_path, data, reason):
    path = tmp_path / "mapping.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ValueError, match=reason.replace("(", r"\(")) as info:
        load_mapping(path)
    assert str(path) in str(info.value)


def test_a_mapping_file_with_a_partition_file_beside_it(tmp_path):
    (tmp_path / "p.yaml").write_text(yaml.safe_dump({"exits": ["exit0", "exit2"]}))
    (tmp_path / "m.yaml").write_text(yaml.safe_dump({"hardware": "jetson-agx-xavier", "partition": "p.yaml",
                                                     "predicted_latency_ms": 12.5,
                                                     "stages": [{"unit": "dla0", "threshold": 0.8, "dvfs": "15W"},
                                                                {"unit": "gpu"}]}))
    mapping = load_mapping(tmp_path / "m.yaml")
    assert mapping.partition.exits == ("exit0", "exit2") and mapping.thresholds == (0.8, None)
    assert mapping.to_json()["stages"][0] == {"unit": "dla0", "dvfs": "15W", "threshold": 0.8}
    assert mapping.predicted_latency_ms == 12.5 and mapping.to_json()["predicted_latency_ms"] == 12.5


def test_cpu_units_pin_their_sessions_to_their_cores():
    hw = load_hardware("this-machine")
    plan = plan_unit(hw.units[-1], dla_units=[], trt_reason="absent")
    assert plan.backend == "ort" and plan.cores == hw.units[-1].cores and plan.threads == len(plan.cores)
    assert affinity_string((4, 5, 6)) == "6;7" and affinity_string((3,)) is None
    elsewhere = replace(hw.units[0], cores=(max(os.sched_getaffinity(0)) + 1,))
    with pytest.raises(ValueError, match="are not available to this process"):
        plan_unit(elsewhere, dla_units=[], trt_reason=None)


def test_gpu_and_dla_units_decide_their_tensorrt_build_without_tensorrt():
    hw = load_hardware("jetson-agx-orin")
    dlas = ["dla0", "dla1"]
    gpu = plan_unit(hw.unit("gpu"), dla_units=dlas, trt_reason=None, precision="fp32")
    assert gpu.backend == "tensorrt" and gpu.trt.dla_core is None and gpu.trt.precision == "fp32"
    dla = plan_unit(hw.unit("dla1"), dla_units=dlas, trt_reason=None, precision="fp32", shapes={"H": 224, "W": 320})
    # the DLA runs FP16/INT8 and static shapes only; what it cannot run falls back to the GPU
    assert dla.trt.dla_core == 1 and dla.trt.precision == "fp16" and dla.trt.allow_gpu_fallback
    assert dla.trt.shapes == "H=224,W=320" and dla.trt.max_profiles == 1
    with pytest.raises(ValueError, match="unit dla0 \\(dla\\) needs TensorRT: no CUDA"):
        plan_unit(hw.unit("dla0"), dla_units=dlas, trt_reason="no CUDA device is present")


@pytest.mark.skipif(trt_reason() is not None, reason=f"TensorRT unavailable: {trt_reason()}")
def test_a_stage_runs_on_the_gpu_through_tensorrt(depth_set):
    mapping = parse_mapping({"hardware": "jetson-agx-orin", "stages": [{"unit": "gpu", "threshold": 2.0},
                                                                      {"unit": "gpu", "threshold": 2.0}, "gpu"]})
    executor = StageExecutor(depth_set, mapping)
    try:
        out = executor.run(example_inputs("multiexit", 224, 320))
        assert out["exit2"].shape == (1, 10)
    finally:
        executor.close()


def test_overlap_is_the_share_of_run_time_spent_beside_another_stage():
    one_after_other = FrameResult(1, False, 1.0, 20.0, stage_ms={0: 10.0, 1: 10.0}, spans={0: (0, 10), 1: (10, 20)})
    side_by_side = FrameResult(1, False, 1.0, 10.0, stage_ms={0: 10.0, 1: 10.0}, spans={0: (0, 10), 1: (0, 10)})
    half = FrameResult(1, False, 1.0, 15.0, stage_ms={0: 10.0, 1: 10.0}, spans={0: (0, 10), 1: (5, 15)})
    assert one_after_other.overlap == 0.0 and side_by_side.overlap == 0.5 and half.overlap == 0.25
