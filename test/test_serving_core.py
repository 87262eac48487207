"""The serving core without ROS (perception/serving.py): numpy frames in, outcomes and status out.

A small segmentation model (a 1x1 convolution, test/_perception_models.py) behind the core; the
"adapter" here is a few callbacks that record what the core tells them. Covers the newest-frame
mailbox and its drop count, the budget split between frame buffers and the engine, a failing
frame (ERROR status, the core keeps serving), a core swap on a parameter change and a refused
one, the size-class announcements, and closing while the worker is stuck in a frame; and four
cameras on one batching core: their frames run as one batch, each result goes back to its own
camera, a silent camera holds nobody up, and a budget too small for the batch lowers it.
"""
from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _perception_models import pixel_map
from _waiting import wait_for

from dynnet_ros.budget.protocol import size_key
from dynnet_ros.perception import Segmenter
from dynnet_ros.perception.batch_budget import batch_need
from dynnet_ros.perception.budget_split import FrameCosts
from dynnet_ros.perception.mailbox import Arrival, Mailbox
from dynnet_ros.perception.serving import CAMERA, Decoded, FrameInfo, Publish, ServingCore, ServingTask, engine_runs
from dynnet_ros.perception.size_classes import announced_minimums

WEIGHTS = np.array([[4.0, -2.0, -2.0]], np.float32)
BIAS = np.array([0.0], np.float32)
PARAMS: dict[str, Any] = {
    "model_path": "", "model_format": "auto", "backend": "cpu", "threads": 1, "max_input_side": 0,
    "memory_budget_mb": 0.0, "budget_owner": "", "enabled": True, "max_rate_hz": 0.0, "mapping": "",
    "exit_threshold": -1.0, "deadline_ms": 0.0, "camera_sizes": ["96x64"], "classes": [""],
    "batch_window_ms": 5.0, "max_batch": 0, "max_latency_ms": 100.0, "batches_in_flight": 1, "cameras": [],
}
COSTS = FrameCosts(output_bytes_per_pixel=8.0)


class ClosingSegmenter(Segmenter):
    """A Segmenter that says when it is closed."""

    closed: list[ClosingSegmenter] = []

    def close(self) -> None:
        ClosingSegmenter.closed.append(self)
        super().close()


class Adapter:
    """What a node would do with the core's callbacks: record every outcome and status change."""

    def __init__(self) -> None:
        self.outcomes: list[tuple[str, int, str]] = []   # (source, stamp, outcome)
        self.batches: list[list[tuple[str, int, str, tuple[int, ...]]]] = []   # (source, stamp, frame_id, mask shape)
        self.engine_runs: list[int] = []   # per batch: the engine runs its core.batch took
        self.compare = True   # check each result against the frame run alone (an engine run of its own)
        self.served: list[tuple[int, int]] = []          # (stamp, id of the core that ran it)
        self.statuses = 0
        self.gate: threading.Event | None = None         # set: frames wait on it inside serve
        self.in_frame = threading.Event()
        self.published: list[int] = []   # stamps, as the core runs each batch's publishing
        self.hold: dict[int, threading.Event] = {}   # a frame of this stamp waits after its results are made
        self.holding = threading.Event()

    def decode(self, payload: Any) -> Decoded:
        if isinstance(payload, str):
            raise ValueError(f"cannot decode {payload!r}")
        return Decoded(payload, None, "rgb8", payload.nbytes)

    def serve(self, frames: list[FrameInfo], rgbs: list[np.ndarray], core: Any) -> Publish:
        self.in_frame.set()
        if self.gate is not None:
            self.gate.wait()
        runs = core.engine.engine_stats().runs
        results = core.batch(rgbs)
        self.engine_runs.append(core.engine.engine_stats().runs - runs)
        for frame, rgb, result in zip(frames, rgbs, results):
            if self.compare:
                np.testing.assert_array_equal(result.mask, core(rgb).mask)   # as the frame alone
            self.served.append((frame.stamp_ns, id(core)))
        self.batches.append([(f.source, f.stamp_ns, f.frame_id, r.mask.shape) for f, r in zip(frames, results)])
        for frame in frames:
            if frame.stamp_ns in self.hold:   # post-processing that takes long
                self.holding.set()
                self.hold[frame.stamp_ns].wait(timeout=60)
        stamps = [frame.stamp_ns for frame in frames]
        return lambda: self.published.extend(stamps)

    def outcome(self, arrival: Arrival, what: str) -> None:
        self.outcomes.append((arrival.source, arrival.stamp_ns, what))

    def changed(self) -> None:
        self.statuses += 1


class Profile:
    """A ProfileSink that records the minimums announced and how often it was published."""

    def __init__(self) -> None:
        self.announced: dict[str, float] | None = None
        self.publishes = 0
        self.sizes: set[str] = set()

    def announce(self, engine: Any, minimums: dict[str, float]) -> None:
        self.announced = dict(minimums)
        self.sizes |= set(minimums)

    def publish(self) -> None:
        self.publishes += 1

    def knows(self, size: str) -> bool:
        return size in self.sizes


def _model(tmp_path: Path, name: str = "seg.onnx", batch: int | str = 1) -> str:
    return pixel_map(tmp_path / name, WEIGHTS, BIAS, sigmoid=True, input_dims=(batch, 3, "H", "W"))


def _build(path: str, params: dict[str, Any], budget: float | None) -> Segmenter:
    return ClosingSegmenter(path, mean=(0, 0, 0), std=(1, 1, 1), input_size=int(params["max_input_side"]),
                            threshold=0.5, memory_budget_mb=budget, threads=int(params["threads"]), swappable=True,
                            concurrent_runs=engine_runs(params))


def _check(merged: dict[str, Any], updates: dict[str, Any]) -> None:
    if merged["classes"] == ["nothing"]:
        raise ValueError("classes: no class named 'nothing'")


@pytest.fixture()
def serving(tmp_path):
    cores: list[tuple[ServingCore, Adapter, Profile]] = []

    def make(sources: list[str] | None = None, **params: Any) -> tuple[ServingCore, Adapter, Profile]:
        adapter, profile = Adapter(), Profile()
        task = ServingTask("lane", _build, adapter.decode, adapter.serve, _check, ("classes",),
                           {"classes": [""], "model_format": "auto"}, COSTS)
        model = _model(tmp_path, "batched.onnx", "B") if sources else _model(tmp_path)
        core = ServingCore(task, {**PARAMS, "model_path": model, **params},
                           logging.getLogger("test_serving_core"), name="serving_test",
                           outcome=adapter.outcome, status_changed=adapter.changed, sources=sources)
        core.start(profile)
        cores.append((core, adapter, profile))
        return core, adapter, profile

    yield make
    for core, adapter, _ in cores:
        if adapter.gate is not None:
            adapter.gate.set()
        core.close()


def frame(height: int = 64, width: int = 96) -> np.ndarray:
    rng = np.random.default_rng(height * width)
    return rng.integers(0, 255, (height, width, 3), dtype=np.uint8)


def outcomes(adapter: Adapter, what: str) -> list[int]:
    return [stamp for _, stamp, outcome in adapter.outcomes if outcome == what]


def test_the_newest_frame_wins_and_every_replaced_frame_is_counted_as_dropped(serving):
    core, adapter, _ = serving()
    adapter.gate = threading.Event()
    core.offer(CAMERA, 1, "cam", frame())
    wait_for(adapter.in_frame.is_set, 30, "the worker in frame 1")
    for stamp in (2, 3, 4, 5):   # the worker is busy: each replaces the one waiting
        core.offer(CAMERA, stamp, "cam", frame())
    adapter.gate.set()
    wait_for(lambda: core.stats.processed == 2, 30, "frame 5 served")
    assert [stamp for stamp, _ in adapter.served] == [1, 5]
    assert outcomes(adapter, "dropped") == [2, 3, 4] and outcomes(adapter, "processed") == [1, 5]
    status = core.status()
    assert (status.values["frames_received"], status.values["frames_dropped"]) == (5, 3)
    assert status.level == "ok" and status.message == "processing"


def test_the_mailbox_keeps_one_frame_per_source_and_serves_the_longest_waiting_first():
    box = Mailbox()
    assert box.put(Arrival("left", 1, "l", "a")) is None
    assert box.put(Arrival("right", 2, "r", "b")) is None
    replaced = box.put(Arrival("left", 3, "l", "c"))
    assert replaced is not None and replaced.stamp_ns == 1
    first, second = box.take(), box.take()
    assert first is not None and second is not None
    assert (first.source, first.stamp_ns, second.source, second.stamp_ns) == ("left", 3, "right", 2)
    assert box.take() is None and not box.wait(0.0)


def test_the_budget_is_split_between_the_frame_buffers_and_the_engine(serving):
    core, adapter, _ = serving(memory_budget_mb=64.0)
    image = frame(120, 160)
    core.offer(CAMERA, 1, "cam", image)
    wait_for(lambda: core.stats.processed == 1, 30, "one frame served")
    letterbox = core.core.preprocess.plan(120, 160)
    assert core.frame_mb == COSTS.frame_bytes(image.nbytes, letterbox).total_mb > 0
    share = 64.0 - core.frame_mb
    assert core.split.engine_budget_mb == pytest.approx(share)
    assert core.engine.engine_stats().memory_budget_mb == pytest.approx(share)
    values = core.status().values
    assert values["frame_buffers_mb"] == core.frame_mb and values["engine.memory_budget_mb"] == 64.0

    core.apply({"memory_budget_mb": 48.0})   # a new node budget: the engine gets the new share at once
    assert core.engine.engine_stats().memory_budget_mb == pytest.approx(48.0 - core.frame_mb)
    assert core.params["memory_budget_mb"] == 48.0


def test_a_failing_frame_is_reported_and_the_core_keeps_serving(serving):
    core, adapter, _ = serving()
    core.offer(CAMERA, 1, "cam", "not an image")
    wait_for(lambda: core.stats.failed == 1, 30, "the bad frame failed")
    status = core.status()
    assert status.level == "error" and status.message == "bad frame: cannot decode 'not an image'"
    assert outcomes(adapter, "failed") == [1]
    core.offer(CAMERA, 2, "cam", frame())
    wait_for(lambda: core.stats.processed == 1, 30, "the next frame served")
    assert core.status().level == "ok" and core.status().values["last_error"] == ""
    assert outcomes(adapter, "processed") == [2] and adapter.statuses >= 2   # the error, then its end


def test_a_parameter_change_swaps_the_core_and_a_refused_one_keeps_the_old(serving, tmp_path):
    core, adapter, _ = serving()
    first = core.core
    core.offer(CAMERA, 1, "cam", frame())
    wait_for(lambda: core.stats.processed == 1, 30, "a frame on the first core")

    core.apply({"model_path": _model(tmp_path, "other.onnx")})
    assert core.core is not first and first in ClosingSegmenter.closed   # loaded, swapped, old closed
    core.offer(CAMERA, 2, "cam", frame())
    wait_for(lambda: core.stats.processed == 2, 30, "a frame on the new core")
    assert [owner for _, owner in adapter.served] == [id(first), id(core.core)]

    second = core.core
    with pytest.raises(ValueError, match="no class named 'nothing'"):
        core.apply({"classes": ["nothing"]})
    with pytest.raises(ValueError):
        core.apply({"model_path": str(tmp_path / "missing.onnx")})
    assert core.core is second and second not in ClosingSegmenter.closed
    assert core.params["classes"] == [""] and "missing.onnx" in core.status().values["last_rejected_change"]


def test_size_classes_are_announced_before_their_frames_and_a_new_one_is_published_when_served(serving):
    core, _, profile = serving(camera_sizes=["96x64", "160x120"])
    wait_for(lambda: profile.announced is not None and profile.publishes >= 1, 60, "the announcement")
    assert profile.announced == announced_minimums(core.core, ["96x64", "160x120"], COSTS, print)
    boxes = [core.core.preprocess.plan(h, w) for h, w in ((64, 96), (120, 160))]   # padded to the stride
    assert set(profile.announced) == {size_key(box.pad_h, box.pad_w) for box in boxes}
    published = profile.publishes
    core.offer(CAMERA, 1, "cam", frame(64, 96))   # announced: no extra publish
    wait_for(lambda: core.stats.processed == 1, 30, "the announced size served")
    core.offer(CAMERA, 2, "cam", frame(48, 64))   # a size nobody announced: published at once
    wait_for(lambda: profile.publishes > published, 30, "the new size class published")
    box = core.core.preprocess.plan(48, 64)
    assert core.size_class() == size_key(box.pad_h, box.pad_w) and core.size_class() not in profile.announced


def test_closing_with_a_busy_worker_leaves_the_engine_to_it(serving):
    core, adapter, _ = serving()
    adapter.gate = threading.Event()
    core.offer(CAMERA, 1, "cam", frame())
    wait_for(adapter.in_frame.is_set, 30, "the worker in a frame")
    engine_core = core.core
    core.close()
    assert core.unfinished_work() == ["serving_test-worker"]
    assert engine_core not in ClosingSegmenter.closed   # never freed under a running frame
    adapter.gate.set()
    core.worker.join(30)
    assert core.unfinished_work() == [] and adapter.served == [(1, id(engine_core))]


def test_closing_an_idle_core_frees_its_engine(serving):
    core, _, _ = serving()
    core.close()
    assert core.unfinished_work() == [] and core.core in ClosingSegmenter.closed


CAMERAS = ["front", "left", "right", "rear"]
SIZES = {"front": (64, 96), "left": (48, 64), "right": (80, 96), "rear": (64, 80)}   # (height, width)


def _offer_all(core: ServingCore, cameras: list[str], stamp: int) -> None:
    for i, cam in enumerate(cameras):
        core.offer(cam, stamp + i, f"{cam}_optical", frame(*SIZES[cam]))


def test_four_cameras_run_as_one_batch_and_each_result_goes_back_to_its_camera(serving):
    # a window long enough that three frames offered together always make one batch, even on a loaded machine
    # one batch in flight: the engine runs counted around a batch are that batch's alone
    core, adapter, _ = serving(sources=CAMERAS, batch_window_ms=500.0, max_latency_ms=1000.0, batches_in_flight=1)
    assert core.model_batch() > 4 and core.batch_limit() == 4
    adapter.gate = threading.Event()
    core.offer("front", 1, "front_optical", frame(*SIZES["front"]))
    wait_for(adapter.in_frame.is_set, 30, "the worker in its first batch")
    _offer_all(core, CAMERAS, 10)   # all four wait while the worker is busy
    adapter.gate.set()
    wait_for(lambda: len(adapter.batches) == 2, 30, "the four cameras' batch")
    # front was served in the first batch: the three cameras never served go first
    in_turn = ["left", "right", "rear", "front"]
    assert adapter.batches[1] == [(cam, 10 + CAMERAS.index(cam), f"{cam}_optical", SIZES[cam]) for cam in in_turn]
    assert adapter.engine_runs == [1, 1]   # one engine run for the four frames
    values = core.status().values
    assert values["batch_size_last"] == 4 and values["input_shape"].startswith("4x3x")
    assert all(values[f"camera.{cam}.processed"] == (2 if cam == "front" else 1) for cam in CAMERAS)
    assert core.camera_status("left").level == "ok"

    for round_ in range(3):   # rear falls silent: the other three are still served, as batches of three
        _offer_all(core, CAMERAS[:3], 100 * (round_ + 1))
        wait_for(lambda n=3 + round_: len(adapter.batches) == n, 30, f"round {round_} without the rear camera")
        assert sorted((src, stamp) for src, stamp, _, _ in adapter.batches[-1]) == \
            sorted((cam, 100 * (round_ + 1) + i) for i, cam in enumerate(CAMERAS[:3]))
    assert outcomes(adapter, "processed").count(13) == 1 and core.status().values["camera.rear.received"] == 1
    assert core.cameras["front"].frames.processed == 5 and core.stats.processed == 1 + 4 + 3 * 3
    latencies = [core.stats.percentiles()[1], *(core.cameras[cam].frames.percentiles()[1] for cam in CAMERAS)]
    assert all(0 < ms < 60_000 for ms in latencies)   # milliseconds of this test, not of the clock's epoch


def test_lost_frames_are_told_per_camera_so_interleaved_cameras_lose_none(serving):
    core, _, _ = serving(sources=CAMERAS, batch_window_ms=0.0)
    period = 100_000_000   # every camera at 10 Hz, each with its own phase
    for tick in range(8):
        for i, cam in enumerate(CAMERAS):
            core.offer(cam, tick * period + i * 7_000_000, f"{cam}_optical", frame(*SIZES[cam]))
    core.offer("left", 9 * period + 7_000_000, "left_optical", frame(*SIZES["left"]))   # left skipped one frame
    values = core.status().values
    assert values["frames_missing"] == 1 and values["frames_out_of_order"] == 0
    assert values["camera.left.missing"] == 1 and values["camera.front.missing"] == 0


def _round(core: ServingCore, stamp: int, height: int, width: int) -> None:
    """One frame from every camera, all of one size, served."""
    done = core.stats.processed + len(CAMERAS)
    for i, cam in enumerate(CAMERAS):
        core.offer(cam, stamp + i, f"{cam}_optical", frame(height, width))
    wait_for(lambda: core.stats.processed >= done, 60, f"the round stamped {stamp} served")


def test_a_budget_too_small_for_the_batch_lowers_it_and_says_so(serving):
    # one batch in flight: batches of all four cameras, the engine's last run the batch's
    core, adapter, _ = serving(sources=CAMERAS, batch_window_ms=200.0, batches_in_flight=1)
    adapter.compare = False
    height, width = SIZES["front"]
    _round(core, 0, height, width)   # unlimited: whole batches
    needs = {b: batch_need(core.core, core.costs, b, height, width, 4, height * width * 3).need_mb
             for b in (1, 2, 3, 4)}
    assert needs[1] < needs[2] < needs[3] < needs[4]
    budget = round((needs[2] + needs[3]) / 2, 3)   # holds two frames per run, not three
    core.apply({"memory_budget_mb": budget})   # the engine ran four frames: taken by lowering the batch
    if not core.batch_budget.reason:   # a loaded machine split the round: sized at the next batch instead
        _round(core, 50, height, width)
    wait_for(lambda: core.batch_budget.reason, 60, "the batch lowered")
    status = core.status()
    assert status.level == "warn" and status.message.startswith(f"batches of 2, not 4: memory_budget_mb {budget:g}")
    assert core.params["memory_budget_mb"] == budget
    assert status.values["batch_limit"] == 2 and status.values["batch_formed"] == 4
    before = len(adapter.batches)
    for stamp in (100, 200):
        _round(core, stamp, height, width)
    assert adapter.batches[before:] and all(len(batch) <= 2 for batch in adapter.batches[before:])
    assert core.split.over_budget(core.engine, budget) is None   # within it at two frames per run
    core.apply({"memory_budget_mb": 0.0})
    _round(core, 300, height, width)
    assert core.status().level == "ok" and core.batch_budget.cap is None


def test_two_batches_in_flight_publish_in_the_order_taken_and_are_both_charged(serving):
    single, _, _ = serving(batches_in_flight=2)
    assert single.costs.in_flight == 1 and len(single.worker.threads) == 1   # one camera: one frame in flight
    core, adapter, _ = serving(sources=CAMERAS, batch_window_ms=0.0, batches_in_flight=2)   # each frame alone
    assert core.costs.in_flight == 2 and len(core.worker.threads) == 2
    release = adapter.hold[1] = threading.Event()
    height, width = SIZES["front"]
    core.offer("front", 1, "front_optical", frame(height, width))
    wait_for(adapter.holding.is_set, 30, "the first batch in its post-processing")
    core.offer("left", 2, "left_optical", frame(*SIZES["left"]))
    wait_for(lambda: [stamp for stamp, _ in adapter.served] == [1, 2], 30, "the second batch run beside the first")
    assert adapter.published == [] and core.stats.processed == 0   # its results wait for the first's
    release.set()
    wait_for(lambda: core.stats.processed == 2, 30, "both batches out")
    assert adapter.published == [1, 2] and outcomes(adapter, "processed") == [1, 2]
    # each batch in flight holds its own model input and outputs: both are charged
    box = core.core.preprocess.plan(*SIZES["left"])
    alone = COSTS.batch_bytes([], [box])
    assert core.split.frame.inputs == 2 * alone.inputs and core.split.frame.outputs == 2 * alone.outputs


def test_two_batches_in_flight_run_the_engine_twice_at_once_until_a_budget_makes_them_take_turns(serving, caplog):
    core, adapter, _ = serving(sources=CAMERAS, batches_in_flight=2, cameras=CAMERAS)
    _offer_all(core, CAMERAS, 10)
    wait_for(lambda: core.stats.processed == 4, 30, "the four cameras' frames")
    values = core.status().values
    assert values["engine_runs"] == 2 and values["engine_runs_overlap"] is True
    with caplog.at_level(logging.WARNING, logger="test_serving_core"):
        core.apply({"memory_budget_mb": 256.0})
    assert "take turns under a budget" in caplog.text
    assert core.status().values["engine_runs_overlap"] is False
