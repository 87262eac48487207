"""The serving core without ROS (perception/serving.py): numpy frames in, outcomes and status out.

A small segmentation model (a 1x1 convolution, test/_perception_models.py) behind the core; the
"adapter" here is a few callbacks that record what the core tells them. Covers the newest-frame
mailbox and its drop count, the budget split between frame buffers and the engine, a failing
frame (ERROR status, the core keeps serving), a core swap on a parameter change and a refused
one, the size-class announcements, and closing while the worker is stuck in a frame.
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
from dynnet_ros.perception.budget_split import FrameCosts
from dynnet_ros.perception.mailbox import Arrival, Mailbox
from dynnet_ros.perception.serving import CAMERA, Decoded, FrameInfo, ServingCore, ServingTask
from dynnet_ros.perception.size_classes import announced_minimums

WEIGHTS = np.array([[4.0, -2.0, -2.0]], np.float32)
BIAS = np.array([0.0], np.float32)
PARAMS: dict[str, Any] = {
    "model_path": "", "model_format": "auto", "backend": "cpu", "threads": 1, "max_input_side": 0,
    "memory_budget_mb": 0.0, "budget_owner": "", "enabled": True, "max_rate_hz": 0.0, "mapping": "",
    "exit_threshold": -1.0, "deadline_ms": 0.0, "camera_sizes": ["96x64"], "classes": [""],
    "batch_window_ms": 5.0, "max_batch": 0, "max_latency_ms": 100.0,
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
        self.served: list[tuple[int, int]] = []          # (stamp, id of the core that ran it)
        self.statuses = 0
        self.gate: threading.Event | None = None         # set: frames wait on it inside serve
        self.in_frame = threading.Event()

    def decode(self, payload: Any) -> Decoded:
        if isinstance(payload, str):
            raise ValueError(f"cannot decode {payload!r}")
        return Decoded(payload, None, "rgb8", payload.nbytes)

    def serve(self, frames: list[FrameInfo], rgbs: list[np.ndarray], core: Any) -> None:
        self.in_frame.set()
        if self.gate is not None:
            self.gate.wait()
        for frame, rgb in zip(frames, rgbs):
            result = core(rgb)
            assert result.mask.shape == rgb.shape[:2]
            self.served.append((frame.stamp_ns, id(core)))

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


def _model(tmp_path: Path, name: str = "seg.onnx") -> str:
    return pixel_map(tmp_path / name, WEIGHTS, BIAS, sigmoid=True)


def _build(path: str, params: dict[str, Any], budget: float | None) -> Segmenter:
    return ClosingSegmenter(path, mean=(0, 0, 0), std=(1, 1, 1), input_size=int(params["max_input_side"]),
                            threshold=0.5, memory_budget_mb=budget, threads=int(params["threads"]), swappable=True)


def _check(merged: dict[str, Any], updates: dict[str, Any]) -> None:
    if merged["classes"] == ["nothing"]:
        raise ValueError("classes: no class named 'nothing'")


@pytest.fixture()
def serving(tmp_path):
    cores: list[tuple[ServingCore, Adapter, Profile]] = []

    def make(**params: Any) -> tuple[ServingCore, Adapter, Profile]:
        adapter, profile = Adapter(), Profile()
        task = ServingTask("lane", _build, adapter.decode, adapter.serve, _check, ("classes",),
                           {"classes": [""], "model_format": "auto"}, COSTS)
        core = ServingCore(task, {**PARAMS, "model_path": _model(tmp_path), **params},
                           logging.getLogger("test_serving_core"), name="serving_test",
                           outcome=adapter.outcome, status_changed=adapter.changed)
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
    core.worker.thread.join(timeout=30)
    assert core.unfinished_work() == [] and adapter.served == [(1, id(engine_core))]


def test_closing_an_idle_core_frees_its_engine(serving):
    core, _, _ = serving()
    core.close()
    assert core.unfinished_work() == [] and core.core in ClosingSegmenter.closed
