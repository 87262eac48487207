"""The stage runtime: concurrency on two CPU groups, early exit, deadlines, mapping files, unit plans."""
from __future__ import annotations

import os
import threading
import time
from dataclasses import replace

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import yaml

from dynnet_ros.engine.runtime.base import Executor
from dynnet_ros.mapper import runtime
from dynnet_ros.mapper.build import build_stages
from dynnet_ros.mapper.hardware import load_hardware
from dynnet_ros.mapper.mapping import load_mapping, parse_mapping
from dynnet_ros.mapper.partition import Partition, parse_partition
from dynnet_ros.mapper.runtime import FrameResult, StageExecutor
from dynnet_ros.mapper.units import affinity_string, open_stage, plan_unit, trt_reason
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


class _Timeline:
    """The runtime's clock in the deadline tests: it moves only when a stage finishes, to the
    time the stage's schedule gives (ms after the frame began), however long the stage really ran.
    Which exits finish by the deadline is then the schedule's, not the machine's load's."""

    def __init__(self, finish_ms: dict[int, float], hangs: frozenset[int] = frozenset()) -> None:
        self.now = 0.0
        self.finish_ms = finish_ms
        self.hangs = hangs              # stages that move the clock, then run until cancelled

    def __call__(self) -> float:
        return self.now


class _ScheduledStage:
    """A stage's real runner that finishes on its timeline."""

    def __init__(self, runner, index: int, timeline: _Timeline) -> None:
        self.runner, self.index, self.timeline = runner, index, timeline

    def run(self, feeds, run_options=None):
        outputs = self.runner.run(feeds, run_options)
        self.timeline.now = self.timeline.finish_ms[self.index] / 1000.0
        if self.index in self.timeline.hangs:
            # a wait for the cancel, not a speed requirement: the caller's deadline check runs every
            # few milliseconds once the clock is past it
            give_up = time.monotonic() + 60.0
            while not run_options.terminate and time.monotonic() < give_up:
                time.sleep(0.001)
            raise RuntimeError(f"stage {self.index} cancelled" if run_options.terminate else "never cancelled")
        return outputs

    def close(self) -> None:
        self.runner.close()


def _scheduled_executor(monkeypatch, depth_set, timeline: _Timeline, deadline_ms: float | None) -> StageExecutor:
    index_of = {id(stage.model): stage.index for stage in depth_set.stages}
    opened: list[int] = []

    def open_scheduled(model, plan):
        opened.append(index_of[id(model)])
        return _ScheduledStage(open_stage(model, plan), opened[-1], timeline)

    monkeypatch.setattr(runtime, "open_stage", open_scheduled)
    executor = StageExecutor(depth_set, _mapping([2.0, 2.0, None], deadline=deadline_ms), clock=timeline)
    assert sorted(opened) == [0, 1, 2]   # each stage one part, each on its timeline
    return executor


@pytest.mark.parametrize("finish_ms,hangs,exit_index,deadline_hit,skipped,latency_ms", [
    # nothing is done by the 10 ms deadline: the first exit to finish answers, as the deadline's
    ({0: 15.0, 1: 20.0, 2: 25.0}, (), 0, True, (1, 2), 15.0),
    # exits 0 and 1 are done by then; stage 2, still running at the deadline, is cancelled
    ({0: 3.0, 1: 6.0, 2: 12.0}, (2,), 1, True, (2,), 12.0),
    # exit 1 finishes after the deadline: exit 0 answers, however soon after it exit 1 came
    ({0: 3.0, 1: 12.0, 2: 14.0}, (), 0, True, None, 12.0),
    # the whole frame within the deadline changes nothing
    ({0: 3.0, 1: 6.0, 2: 9.0}, (), 2, False, (), 9.0),
], ids=["none-in-time", "running-stage-cancelled", "late-exit-not-taken", "all-in-time"])
def test_deadline_mode_answers_with_the_deepest_exit_done_by_then(monkeypatch, multiexit, depth_set, finish_ms, hangs,
                                                                  exit_index, deadline_hit, skipped, latency_ms):
    timeline = _Timeline(finish_ms, frozenset(hangs))
    executor = _scheduled_executor(monkeypatch, depth_set, timeline, deadline_ms=10.0)
    try:
        feed = example_inputs("multiexit", 96, 128)
        out = executor.run(feed)
        result = executor.last_result
        assert result is not None and (result.exit_index, result.deadline_hit) == (exit_index, deadline_hit)
        if skipped is not None:
            assert result.skipped == skipped
        else:   # exit 1's stage finished too late to count: cancelled, or done before the answer
            assert result.skipped in ((1, 2), (2,))
        # the answer is that exit's real output, under the final exit's name
        ref = ort.InferenceSession(multiexit.SerializeToString(), providers=["CPUExecutionProvider"]).run(
            [f"exit{exit_index}"], feed)[0]
        assert list(out) == ["exit2"] and np.array_equal(out["exit2"], ref)
        assert result.latency_ms == pytest.approx(latency_ms)   # answered once it could be, no later
    finally:
        executor.close()


def test_without_a_deadline_the_last_exit_answers_however_late(monkeypatch, depth_set):
    timeline = _Timeline({0: 15.0, 1: 20.0, 2: 25.0})
    executor = _scheduled_executor(monkeypatch, depth_set, timeline, deadline_ms=10.0)
    try:
        executor.set_deadline(None)
        executor.run(example_inputs("multiexit", 96, 128))
        result = executor.last_result
        assert result is not None and result.exit_index == 2 and not result.deadline_hit and result.skipped == ()
        assert result.latency_ms == pytest.approx(25.0)
        with pytest.raises(ValueError, match="positive or None"):
            executor.set_deadline(0.0)
    finally:
        executor.close()


class _Meeting:
    """A part's real runner whose run waits, once it has begun, until the other such part's has
    begun too; it notes the cores the running thread may use, by unit."""

    def __init__(self, runner, unit: str, meeting: threading.Barrier, cores: dict[str, set[int]]) -> None:
        self.runner, self.unit, self.meeting, self.cores = runner, unit, meeting, cores

    def run(self, feeds, run_options=None):
        self.cores[self.unit] = os.sched_getaffinity(0)   # 0: the calling thread
        self.meeting.wait()
        return self.runner.run(feeds, run_options)

    def close(self) -> None:
        self.runner.close()


@pytest.mark.skipif(not TWO_GROUPS, reason="needs two cores for two CPU groups")
def test_two_cpu_groups_run_two_width_stages_at_once(monkeypatch, multiexit):
    """Both width stages of a frame are in flight at once, each on its own group's cores.

    The two parts that read only the frame's input (stage 0, and stage 1 up to where it reads
    stage 0) each wait inside their run until the other's has begun: a runtime that ran them one
    after the other would never get past the first (the barrier breaks and the frame fails). So the
    stages' spans overlap however busy the machine is; how much two groups speed a frame up is
    measured by bench/mapper_bench.py, since it depends on what else the cores run."""
    stage_set = build_stages(multiexit, parse_partition({"width": {"stages": 2, "P": [0.5, 0.5], "I": [0, 0]}}))
    meeting = threading.Barrier(2, timeout=60.0)   # a bound on a hang, not a speed requirement
    cores: dict[str, set[int]] = {}
    met: list[str] = []

    def open_meeting(model, plan):
        runner = open_stage(model, plan)
        reads = {v.name for v in model.graph.input} - {t.name for t in model.graph.initializer}
        if reads != {"image"}:
            return runner
        met.append(plan.unit)
        return _Meeting(runner, plan.unit, meeting, cores)

    monkeypatch.setattr(runtime, "open_stage", open_meeting)
    executor = StageExecutor(stage_set, _mapping([2.0, None], units=("cpu0", "cpu1")))
    try:
        assert sorted(met) == ["cpu0", "cpu1"]
        feed = example_inputs("multiexit", 224, 320)
        for _ in range(3):
            executor.run(feed)
            result = executor.last_result
            assert result is not None and result.exit_index == 1 and set(result.spans) == {0, 1}
            assert result.overlap > 0
        groups = {unit: set(executor.plans[unit].cores) for unit in ("cpu0", "cpu1")}
        assert cores == groups and not groups["cpu0"] & groups["cpu1"]
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
    def result(runs):
        return FrameResult(1, False, 1.0, 20.0, runs=runs)

    one_after_other = result({0: ((0, 10),), 1: ((10, 20),)})
    side_by_side = result({0: ((0, 10),), 1: ((0, 10),)})
    half = result({0: ((0, 10),), 1: ((5, 15),)})
    assert one_after_other.overlap == 0.0 and side_by_side.overlap == 0.5 and half.overlap == 0.25
    # stage 1's two parts wait between them for stage 0: only its first part ran beside stage 0
    waiting = result({0: ((0, 10),), 1: ((0, 4), (10, 14))})
    assert waiting.overlap == pytest.approx(1 - 14 / 18)
