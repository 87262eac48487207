"""The serving core: a perception core kept serving frames under a memory budget, without ROS.

Why: everything a model node does besides talking ROS lives here, so it can be tested with
numpy frames and one core could serve what several adapters (or cameras) hand it. The core owns
the frame mailbox and its worker (``mailbox``), the split of the budget between frame buffers
and the engine (``budget_split``), the mapped stages and their ``mapping: auto`` re-pick
(``mapped_mode``), the size-class announcements (``size_classes``), the camera intrinsics
(``intrinsics``), and the counters and status the adapter publishes as diagnostics.

Parameter changes arrive as a dict (``apply``): a change that needs a new perception core loads
it beside the old one, which serves until the swap; a change that does not load is refused with
its reason and the old core keeps serving. Frames see a change from the next frame on. The
adapter decodes its messages (``ServingTask.decode``, on the worker) and publishes results
(``ServingTask.serve``); each frame's outcome goes back to it with the frame's source and stamp.

Several cameras (``sources``) share the one core: each has its own mailbox slot, counters and
intrinsics, and the worker runs the frames waiting from several of them as one batch
(``batching``: ``batch_window_ms``, ``max_batch``, ``max_latency_ms``), handed to
``ServingTask.serve`` together; each result goes out on its own camera's outputs. With
``batches_in_flight`` > 1 that many batches are served at once, their engine runs too where the
engine lets them overlap (``engine_runs``), each batch's publishing run in the order the batches
were taken (``turns``).
"""
from __future__ import annotations

import os
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

from dynnet_ros.budget.protocol import BUDGET_PARAM, OWNER_PARAM, size_key
from dynnet_ros.bytesize import to_mb
from dynnet_ros.engine.engine import Engine
from dynnet_ros.memtrim import release_memory
from dynnet_ros.perception.batch_budget import BatchBudget
from dynnet_ros.perception.batching import BatchPolicy
from dynnet_ros.perception.budget_split import BudgetSplit, FrameCosts
from dynnet_ros.perception.core import PerceptionCore
from dynnet_ros.perception.frame_stats import SILENT_S, CameraStats, FrameStats
from dynnet_ros.perception.intrinsics import Intrinsics
from dynnet_ros.perception.letterbox import Letterbox
from dynnet_ros.perception.mailbox import Arrival, FrameWorker, Mailbox
from dynnet_ros.perception.mapped import MappedSettings, tune
from dynnet_ros.perception.mapped_mode import MappedMode
from dynnet_ros.perception.size_classes import ProfileSink, SizeClasses
from dynnet_ros.perception.turns import Turn
from dynnet_ros.procmem import ProcessMemory, process_memory
from dynnet_ros.shared_lock import SharedLock
from dynnet_ros.zoo import ensure_model

#: parameters whose change builds a new core (loaded beside the old one, which serves until then);
#: each task adds its own (``ServingTask.core_params``)
ENGINE_PARAMS = ("model_path", "model_format", "backend", "threads", "max_input_side")
#: parameters that describe the model loaded (its export format, its class names): a model switch
#: may need them changed in the same request
MODEL_BOUND_PARAMS = ("model_format", "classes", "labels_file", "output_name")
#: parameters whose change re-computes the minimums announced per input size class (at the
#: largest batch the node forms)
ANNOUNCE_PARAMS = ("camera_sizes", "max_input_side", "batch_window_ms", "max_batch")
#: How long closing waits for the worker to finish its frame or budget change: with the rest of
#: a node's shutdown (nodes/base.run_node) it stays inside the stop signal's SHUTDOWN_DEADLINE_S,
#: so a slow frame at a stop is left unfinished instead of being reported as a hang
WORKER_STOP_S = 1.5
#: How long closing then waits for the engine to be freed (it waits for a model sizing under way)
ENGINE_CLOSE_S = 0.5
#: the source name of a core's one camera
CAMERA = "camera"

#: the serving cores alive in this process: more than one means a component container, where a
#: core's share of the process is counted from its own engine (``ServingCore.held_beside_neighbours``)
CORES_IN_PROCESS: weakref.WeakSet = weakref.WeakSet()


def batches_in_flight(params: dict[str, Any], cameras: int) -> int:
    """How many batches a core serves at once (its worker threads): the ``batches_in_flight``
    parameter with several cameras, one with a single camera (one frame in flight, its latency
    and memory those of a frame served alone). Two run two batches side by side, engine runs
    included (``engine_runs``), at the memory of a second batch's frame buffers and activations;
    under a memory budget the engine runs take turns, so one is the default (docs/ros.md)."""
    return max(1, int(params["batches_in_flight"])) if cameras > 1 else 1


def engine_runs(params: dict[str, Any]) -> int:
    """How many engine runs a node's core lets overlap (``Engine(concurrent_runs=...)``): one per
    batch in flight, each with activations of its own, so two batches use two cores."""
    return batches_in_flight(params, len(params["cameras"]))


class Log(Protocol):
    """What the core logs to (an rclpy node's logger, a ``logging.Logger``)."""

    def info(self, message: str) -> Any: ...

    def warning(self, message: str) -> Any: ...

    def error(self, message: str) -> Any: ...


@dataclass(frozen=True)
class FrameInfo:
    """What serving a frame needs besides its pixels: the adapter's header (copied to outputs),
    the image size and encoding, and where and when the frame was taken."""

    header: Any
    width: int
    height: int
    encoding: str
    source: str = CAMERA
    stamp_ns: int = 0
    frame_id: str = ""


@dataclass(frozen=True)
class Decoded:
    """An adapter's message decoded on the worker: HxWx3 uint8 RGB (an rgb8 message's view over
    its own data), the header to copy to outputs, the encoding, and the message's size (charged
    to the budget)."""

    rgb: np.ndarray
    header: Any
    encoding: str
    message_bytes: int


def _no_check(merged: dict[str, Any], updates: dict[str, Any]) -> None:
    """A task without cross-parameter checks."""


#: the task's perception core: what ``build`` makes is what ``serve`` runs
CoreT = TypeVar("CoreT", bound=PerceptionCore)
#: what ``ServingTask.serve`` hands back: the batch's publishing, which the core runs in the order
#: batches were taken (None: the task published inside ``serve``)
Publish = Callable[[], None]


@dataclass(frozen=True)
class ServingTask(Generic[CoreT]):
    """The task-specific part of serving, supplied by the adapter."""

    name: str                                                            # lane, pedestrian, depth
    build: Callable[[str, dict[str, Any], float | None], CoreT]          # path, params, engine budget
    decode: Callable[[Any], Decoded]                                     # a payload -> pixels
    serve: Callable[[list[FrameInfo], list[np.ndarray], CoreT], Publish | None]  # run the core on a batch
    check: Callable[[dict[str, Any], dict[str, Any]], None] = _no_check  # ValueError: refused
    core_params: tuple[str, ...] = ()    # parameters besides ENGINE_PARAMS whose change loads a new core
    defaults: dict[str, Any] = field(default_factory=dict)              # parameter defaults (refusal hints)
    costs: FrameCosts = FrameCosts()


@dataclass(frozen=True)
class ServingStatus:
    """The core's state as the adapter publishes it: ``level`` ok / warn / error, a one-line
    message, and the values (plain data)."""

    level: str
    message: str
    values: dict[str, Any]


class ServingCore:
    """Frames in through ``offer``, one model run per newest frame on a worker thread."""

    def __init__(self, task: ServingTask[Any], params: dict[str, Any], log: Log, *, name: str,
                 outcome: Callable[[Arrival, str], None], status_changed: Callable[[], None],
                 alive: Callable[[], bool] = lambda: True, sources: Sequence[str] | None = None) -> None:
        """``outcome(arrival, what)``: each frame's fate (processed, dropped, failed, skipped);
        ``status_changed``: publish the status now; ``alive``: whether the adapter can still
        publish (False while it shuts down); ``sources``: the cameras' names (None: the one
        ``CAMERA``, reported as the core's own counters only). Loads the model (inside its
        budget); ValueError when it does not load."""
        self.task, self.params, self.log, self.name = task, dict(params), log, name
        names = list(sources) if sources is not None else [CAMERA]
        if not names or len(set(names)) != len(names):
            raise ValueError(f"camera names must be distinct and at least one, got {names}")
        self.sources: tuple[str, ...] = tuple(names)
        self.per_camera = sources is not None
        self._outcome, self._status_changed, self._alive = outcome, status_changed, alive
        # held shared while a batch runs in the core, exclusive for every swap
        self.lock = SharedLock()
        self.costs = replace(task.costs, in_flight=batches_in_flight(self.params, len(self.sources)))
        self.split = BudgetSplit(self.costs, int(self.params["max_input_side"]), log.warning, len(self.sources))
        self.baseline: ProcessMemory = process_memory()  # a budget bounds RSS growth from here
        self._turns_warned = False
        self._warn_runs_take_turns(float(self.params[BUDGET_PARAM]))
        # built inside its budget: an in-memory engine first would double the start-up peak
        self.core: PerceptionCore = self._load(self.params)
        self.held_after_load_mb = process_memory().rss_mb - self.baseline.rss_mb
        CORES_IN_PROCESS.add(self)
        self.stats = FrameStats()
        self.cameras = {source: CameraStats() for source in self.sources}
        self.camera_errors: dict[str, str] = {}   # a camera's last frame failed: why
        self.intrinsics = {source: Intrinsics() for source in self.sources}
        self.mailbox = Mailbox()
        self.worker = FrameWorker(self.mailbox, self._serve, lambda: float(self.params["max_rate_hz"]),
                                  lambda exc: log.error("".join(traceback.format_exception(exc))), f"{name}-worker",
                                  self._batching, self.costs.in_flight)
        self.last_batch = 0   # frames in the last batch served
        self.batch_budget = BatchBudget(self.costs, status_changed, log.warning, name)
        self.last_error: str | None = None
        self.rejected: str | None = None   # the last change refused (the old core kept serving)
        self._last_input_shape: list[int] | None = None
        self._last_camera: tuple[int, int] | None = None
        self._stopped_at: float | None = None   # monotonic time of the first stop()
        self._closer: threading.Thread | None = None   # frees the engine at close
        self.sizes: SizeClasses | None = None
        self.mapped = MappedMode(self.lock, lambda: (self.core, self.params), lambda: self.worker.stopped,
                                 log.info, log.error, status_changed, name)
        try:
            executor, auto = self.mapped.open(self.core, self.params)
            self.mapped.install(self.core, executor, auto)
        except ValueError as exc:  # the core serves unmapped; the reason is in its status
            self.rejected = f"mapping {self.params['mapping']!r} not used: {exc}"
        self.mapped.log_auto()

    @property
    def engine(self) -> Engine:
        """The core's Engine: what budgets, size-class minimums and calibration act on."""
        return self.core.engine

    def start(self, profile: ProfileSink) -> None:
        """Announce the size classes to ``profile`` and start serving frames."""
        self.sizes = SizeClasses(profile, self.costs, self._alive, self.log.info, self.log.warning, self.name)
        self.sizes.announce(self.core, self.params["camera_sizes"], self.batch_limit(), len(self.sources))
        self.worker.start()
        self._log_core(self.core, "loaded")

    # ------------------------------------------------------------------ frames
    def offer(self, source: str, stamp_ns: int, frame_id: str, payload: Any) -> None:
        """A frame arrived (any thread): it waits in its source's slot, replacing an older one.
        ValueError for a source the core was not made with."""
        camera = self.cameras.get(source)
        if camera is None:
            raise ValueError(f"unknown camera {source!r}: this core serves {list(self.sources)}")
        self.stats.received += 1
        camera.received(stamp_ns)
        replaced = self.mailbox.put(Arrival(source, stamp_ns, frame_id, payload))
        if replaced is not None:
            self.stats.dropped += 1
            camera.frames.dropped += 1
            self._outcome(replaced, "dropped")

    def _batching(self) -> tuple[BatchPolicy, int]:
        """The worker's batch policy and the largest batch now: ``batch_limit``, lowered to
        what the memory budget holds (1 with one camera)."""
        limit, cap = self.batch_limit(), self.batch_budget.cap
        return BatchPolicy.from_params(self.params), limit if cap is None else min(limit, cap)

    def model_batch(self) -> int:
        """The most frames the core runs as one batch now (``PerceptionCore.frames_per_run``)."""
        return self.core.frames_per_run

    def batch_limit(self) -> int:
        """The largest batch the node forms, budget aside: what its budgets are announced for.
        The model's own limit is asked only where the policy would form batches (deciding it
        follows the batch axis through the graph)."""
        cameras = len(self.sources)
        wanted = BatchPolicy.from_params(self.params).limit(cameras, cameras, self.costs.in_flight)
        return wanted if wanted <= 1 else min(wanted, self.model_batch())

    def _serve(self, arrivals: list[Arrival], turn: Turn) -> None:
        """Run one batch; its results, counters and status go out inside ``turn`` (take order),
        so with two batches in flight one's decoding, pre- and post-processing overlap the
        other's engine run while outputs still leave in the order the frames were taken. Each
        payload is taken out of its arrival: the worker holds the only reference, dropped once
        decoded (an rgb8 frame stays alive as the view the core reads). A frame that does not
        decode fails alone; a batch the core fails on fails whole."""
        if not self.params["enabled"]:
            with turn:
                for arrival in arrivals:
                    arrival.payload = None
                    self._outcome(arrival, "skipped")
            return
        start = time.perf_counter()
        taken: list[Arrival] = []
        frames: list[FrameInfo] = []
        rgbs: list[np.ndarray] = []
        messages: list[tuple[str, int]] = []
        bad: list[tuple[Arrival, Exception]] = []
        for arrival in arrivals:
            payload, arrival.payload = arrival.payload, None
            try:
                decoded = self.task.decode(payload)
            except Exception as exc:  # noqa: BLE001 - a bad message: ERROR status, the others are served
                bad.append((arrival, exc))
                continue
            del payload
            rgb = decoded.rgb
            frames.append(FrameInfo(decoded.header, int(rgb.shape[1]), int(rgb.shape[0]), decoded.encoding,
                                    arrival.source, arrival.stamp_ns, arrival.frame_id))
            rgbs.append(rgb)
            messages.append((arrival.source, decoded.message_bytes))
            taken.append(arrival)
            del decoded
        failure: Exception | None = None
        published: list[Publish] = []
        boxes: list[Letterbox] = []
        if taken:
            try:
                boxes = [self.core.preprocess.plan(frame.height, frame.width) for frame in frames]
                largest = max(range(len(frames)), key=lambda i: boxes[i].pad_h * boxes[i].pad_w)
                self.batch_budget.update(self.core, self.params["memory_budget_mb"], self.batch_limit(),
                                         frames[largest].height, frames[largest].width, len(self.sources),
                                         max(size for _, size in messages))
                cap = self.batch_budget.cap or len(frames)   # a budget lowered after the batch formed
                formed = self._batching()[1]
                for first in range(0, len(frames), cap):
                    chunk = slice(first, first + cap)
                    # takes the split's lock: not inside the frame lock, which a budget change takes after it
                    self.split.charge_frames(self.engine, lambda: self.params["memory_budget_mb"], messages[chunk],
                                             boxes[chunk], formed)
                    with self.lock.shared():
                        publish = self.task.serve(frames[chunk], rgbs[chunk], self.core)
                    if publish is not None:
                        published.append(publish)
            except Exception as exc:  # noqa: BLE001 - inference failure: ERROR status, keep serving
                failure = exc
        with turn:
            for arrival, reason in bad:
                if not self._frame_failed([arrival], reason):
                    return
            if not taken:
                return
            if failure is not None:
                self._frame_failed(taken, failure)
                return
            try:
                for publish in published:
                    publish()
            except Exception as exc:  # noqa: BLE001 - a result that does not publish: ERROR status, keep serving
                self._frame_failed(taken, exc)
                return
            self._served(taken, frames, boxes, (time.perf_counter() - start) * 1e3)

    def _served(self, taken: list[Arrival], frames: list[FrameInfo], boxes: list[Letterbox], elapsed_ms: float) -> None:
        """Count a batch served and check the budget after it (inside its turn)."""
        done = time.monotonic()
        for arrival in taken:
            self.stats.record(elapsed_ms)
            self.cameras[arrival.source].frames.record((done - arrival.arrived) * 1e3)
            self.camera_errors.pop(arrival.source, None)
            self._outcome(arrival, "processed")
        self.last_batch = len(taken)
        letterbox, frame = max(zip(boxes, frames), key=lambda pair: pair[0].pad_h * pair[0].pad_w)
        run = len(taken) if len(taken) == 1 else \
            min(len(taken), self.model_batch(), self.batch_budget.cap or len(taken))   # frames per engine run
        self._last_input_shape = [run, 3, letterbox.pad_h, letterbox.pad_w]
        self._last_camera = (frame.width, frame.height)
        size = size_key(letterbox.pad_h, letterbox.pad_w)
        if self.sizes is not None:
            self.sizes.served(size)
        over = self.split.over_budget(self.engine, self.params["memory_budget_mb"])
        if over is not None:
            if self.last_error is None and self.sizes is not None:
                self.sizes.publish_now()  # the profile carries this size's minimum: the manager can grant it now
            self.report_error(f"over budget: {over}")
            return
        if self.last_error is not None:
            self.last_error = None
            self._status_changed()

    def _frame_failed(self, arrivals: list[Arrival], exc: Exception) -> bool:
        """Count and report ``arrivals`` failed by ``exc``; False while shutting down (nothing
        reported: the outputs are gone, and the worker stops)."""
        if not self._alive():
            self.worker.stop()
            return False
        reason = f"bad frame: {exc}" if isinstance(exc, ValueError) else f"bad frame: {type(exc).__name__}: {exc}"
        for arrival in arrivals:
            self.stats.failed += 1
            self.cameras[arrival.source].frames.failed += 1
            self.camera_errors[arrival.source] = reason
            self._outcome(arrival, "failed")
        self.report_error(reason)
        return True

    def size_class(self) -> str | None:
        """The model-input size class the engine last ran ("HxW"; None before the first frame)."""
        shape = self._last_input_shape
        return None if shape is None else size_key(shape[2], shape[3])

    def report_error(self, message: str) -> None:
        """ERROR status now (logged once per episode); the next good frame clears it."""
        first = self.last_error is None
        self.last_error = message
        if first:
            self.log.error(message)
        self._status_changed()

    def set_unit_limits(self, limits: dict[str, float]) -> None:
        """Per-unit memory for this core from the budget manager (``mapping: auto`` re-picks)."""
        self.mapped.set_unit_limits(limits)

    # ------------------------------------------------------------------ memory
    @property
    def frame_mb(self) -> float:
        """The frame buffers charged now."""
        return self.split.frame.total_mb

    def own_memory_mb(self) -> float:
        """What this core's model and frames hold, counted from what they are rather than from the
        process: a streamed engine's calibrated footprint plus its resident weights
        (swap/footprint.py), or, for an engine that holds its model in memory, the RSS growth of
        its own load; plus the frame buffers."""
        window = self.engine.engine_stats().window
        engine_mb = self.held_after_load_mb if window is None else \
            to_mb(window.nonweight_bytes + window.resident_weight_bytes)
        return max(0.0, engine_mb) + self.frame_mb

    def held_beside_neighbours(self) -> tuple[float, float] | None:
        """(held, anonymous held) MB for the budget profile where other serving cores share this
        process (a component container): ``own_memory_mb``, since the process's RSS growth since
        this core's model loaded counts the neighbours' models and frames. None when the core is
        alone: its RSS growth is then its own and the more complete figure."""
        if len(CORES_IN_PROCESS) <= 1:
            return None
        mb = self.own_memory_mb()
        return mb, mb

    # ------------------------------------------------------------------ parameters
    def _load(self, params: dict[str, Any]) -> PerceptionCore:
        """The perception core for ``params``. The format is decided from the model's graph before
        its weights load, so a model that does not fit is named as such, never as "over budget"."""
        path = params["model_path"] or str(ensure_model(self.task.name))
        budget = self.split.share(params["memory_budget_mb"])
        try:
            core = self.task.build(path, params, budget)
        except ValueError as exc:
            if budget is None or budget == float(params["memory_budget_mb"]) or "memory budget" not in str(exc):
                raise
            # The budget fits the model but not next to the frame buffers: start at the whole
            # budget (over it by at most the frame buffers) rather than not at all; the published
            # minimum includes the frame buffers, so the manager raises the budget.
            budget = float(params["memory_budget_mb"])
            core = self.task.build(path, params, budget)
            self.log.warning(
                f"memory_budget_mb {budget:g} leaves the model {budget - self.frame_mb:.1f} MB next to this "
                f"node's {self.frame_mb:.1f} MB of frame buffers, below its minimum "
                f"{core.engine.min_budget_mb():.1f} MB; running the model at {budget:g} MB")
        self.split.engine_budget_mb = budget
        return core

    def apply(self, updates: dict[str, Any]) -> None:
        """Apply validated parameter ``updates`` all at once, or none: ValueError with the reason
        (the old core, stages and budget keep serving)."""
        previous_owner, previous_budget = self.params[OWNER_PARAM], self.params[BUDGET_PARAM]
        merged = {**self.params, **updates}
        changed = {name for name in updates if updates[name] != self.params.get(name)}
        new_core = None
        new_mapped = new_auto = None
        remap = "mapping" in changed
        try:
            self.task.check(merged, updates)
            if changed & {*ENGINE_PARAMS, *self.task.core_params}:
                new_core = self._load(merged)  # built inside the new budget directly
            if new_core is not None or remap:
                new_mapped, new_auto = self.mapped.open(new_core or self.core, merged)
            elif changed & {"exit_threshold", "deadline_ms"} and self.mapped.executor is not None:
                tune(self.mapped.executor, MappedSettings.from_params(merged))
            elif BUDGET_PARAM in changed:
                self._set_budget(merged)
        except ValueError as exc:
            if new_core is not None:
                new_core.close()
            reason = f"{exc}{self._kept_hint(str(exc), merged, updates)}"
            self.rejected = f"rejected {', '.join(sorted(updates))}: {reason}"
            self.log.error(self.rejected)
            self._status_changed()
            raise ValueError(reason) from None
        old = old_mapped = None
        with self.lock:
            if new_core is not None:
                old, self.core = self.core, new_core
                self.rejected = None
            if new_core is not None or remap:
                old_mapped = self.mapped.install(self.core, new_mapped, new_auto)
            self.params = merged
        if old_mapped is not None:
            old_mapped.close()
        if new_core is not None or remap:
            self.mapped.log_auto()
        if old is not None and new_core is not None:
            old.close()  # load new -> swap -> close old: two cores only while switching
            release_memory()
            self._log_core(new_core, "switched to")
        if BUDGET_PARAM in changed:
            self._warn_runs_take_turns(float(merged[BUDGET_PARAM]))
        if self.sizes is not None and (new_core is not None or changed & set(ANNOUNCE_PARAMS)):
            self.sizes.announce(self.core, merged["camera_sizes"], self.batch_limit(), len(self.sources))
        if merged[OWNER_PARAM] and merged[OWNER_PARAM] != previous_owner:
            hand = f"; the {previous_budget:g} MB set by hand no longer applies" if previous_budget else ""
            self.log.info(f"{BUDGET_PARAM} is assigned by the budget manager {merged[OWNER_PARAM]} "
                          f"from now on ({merged[BUDGET_PARAM]:g} MB){hand}")

    def _warn_runs_take_turns(self, budget_mb: float) -> None:
        """Log once that a budget makes the engine runs of the batches in flight take turns,
        each still on its share of the CPUs (``engine_runs``)."""
        if budget_mb and self.costs.in_flight > 1 and not self._turns_warned:
            self._turns_warned = True
            self.log.warning(f"memory_budget_mb {budget_mb:g}: the engine runs of the {self.costs.in_flight} "
                             f"batches in flight take turns under a budget, each on its share of the CPUs; "
                             f"batches_in_flight 1 gives one run all of them")

    def _set_budget(self, merged: dict[str, Any]) -> None:
        """A new node budget for the running core. One the engine refuses at the batch it runs
        but holds at a smaller one is taken with the batch lowered (WARN status): the engine
        gets its share from the next smaller batch's charge (``BudgetSplit.charge_frames``)."""
        try:
            self.split.set_budget(self.engine, merged[BUDGET_PARAM], lambda: self._commit_budget(merged))
        except ValueError:
            if not self.batch_budget.refit(merged[BUDGET_PARAM]):
                raise
            self._commit_budget(merged)

    def _commit_budget(self, merged: dict[str, Any]) -> None:
        with self.lock:
            self.params = {**self.params, BUDGET_PARAM: merged[BUDGET_PARAM]}

    def _kept_hint(self, reason: str, merged: dict[str, Any], updates: dict[str, Any]) -> str:
        """For a refused model switch: the parameters bound to the previous model that the
        refusal is about and the request left as they were (``model_format`` naming the old
        model's format, its ``classes``, ...), and how to change them with it; else ''."""
        if "model_path" not in updates:
            return ""
        defaults = self.task.defaults
        kept = [name for name in MODEL_BOUND_PARAMS if name in defaults and name not in updates
                and merged[name] != defaults[name]
                and (name in reason or (name == "classes" and "class" in reason))]
        if not kept:
            return ""
        values = ", ".join(f"{name} {merged[name]!r}" for name in kept)
        fix = " and ".join(kept)
        return (f" ({values} kept from the previous model: set {fix} in the same set_parameters call as "
                f"model_path{', e.g. model_format auto' if 'model_format' in kept else ''})")

    def _log_core(self, core: PerceptionCore, what: str) -> None:
        self.log.info(f"{what} {self.task.name} model {core.model_path} on {self.params['backend']}: "
                      f"format {core.format_name} ({core.format_reason}); {core.preprocess.describe()}")

    # ------------------------------------------------------------------ status
    def status(self, extra: dict[str, Any] | None = None) -> ServingStatus:
        """The level, message and values of the core's diagnostics; ``extra``: the task's values."""
        p50, p95 = self.stats.percentiles()
        typed = self.engine.engine_stats()
        auto, params, core = self.mapped.auto, self.params, self.core
        if self.last_error is not None:
            level, message = "error", self.last_error
        elif auto is not None and auto.error:
            level, message = "error", auto.error
        elif not params["enabled"]:
            level, message = "ok", "disabled (enabled=false)"
        elif self.batch_budget.reason:
            level, message = "warn", self.batch_budget.reason
        elif self.stats.processed == 0:
            level, message = "warn", ("waiting for /camera/image_raw" if not self.per_camera else
                                      f"waiting for the cameras' frames ({', '.join(self.sources)})")
        else:
            level, message = "ok", "processing"
        shape, camera = self._last_input_shape, self._last_camera
        values: dict[str, Any] = {
            "task": self.task.name,
            "pid": os.getpid(),
            "hz": self.stats.rate_hz(),
            "latency_p50_ms": p50,
            "latency_p95_ms": p95,
            "latency_last_ms": self.stats.last_ms,
            "engine_latency_ms": typed.last_latency_ms,
            "input_shape": "x".join(map(str, shape)) if shape else "",
            "camera_resolution": f"{camera[0]}x{camera[1]}" if camera else "",
            "frames_received": self.stats.received,
            "frames_processed": self.stats.processed,
            "frames_dropped": self.stats.dropped,
            "frames_failed": self.stats.failed,
            # each camera's stamps tell its own lost frames: interleaved cameras are not one sequence
            "frames_missing": sum(camera.gaps.lost for camera in self.cameras.values()),
            "frames_out_of_order": sum(camera.gaps.out_of_order for camera in self.cameras.values()),
            "rss_mb": process_memory().rss_mb,
            "model_path": core.model_path,
            "model_format": core.format_name,
            "model_format_reason": core.format_reason,
            "preprocess": core.preprocess.describe(),
            "last_rejected_change": self.rejected or "",
            "backend": params["backend"],
            "memory_budget_mb": params[BUDGET_PARAM],
            "budget_owner": params[OWNER_PARAM],
            "enabled": params["enabled"],
            "last_error": self.last_error or "",
        }
        if self.per_camera:
            values["cameras"] = ",".join(self.sources)
            values["batch_size_last"] = self.last_batch
            values["batch_limit"] = self._batching()[1]
            values["batch_formed"] = self.batch_limit()
            values["model_max_batch"] = self.model_batch()
            values["engine_runs"] = self.engine.concurrent_runs
            values["engine_runs_overlap"] = self.engine.runs_overlap
            for source, counters in self.cameras.items():
                values.update({f"camera.{source}.{key}": value for key, value in counters.values().items()})
        values.update(extra or {})
        values.update(self.mapped.diagnostics(params["mapping"]))
        values.update({f"engine.{k}": v for k, v in typed.as_dict().items()})
        # The model's budget is the node's share; the engine itself runs in it minus the frame buffers.
        values["engine.model_budget_mb"] = typed.memory_budget_mb
        values["engine.memory_budget_mb"] = params[BUDGET_PARAM] or None
        values["frame_buffers_mb"] = self.frame_mb
        values["held_after_load_mb"] = self.held_after_load_mb
        values["engine.predicted_peak_mb"] = None if typed.window is None else \
            to_mb(typed.window.predicted_peak_bytes)
        return ServingStatus(level, message, values)

    def camera_status(self, source: str) -> ServingStatus:
        """One camera's own status: ERROR when its last frame failed, WARN while it sent nothing
        (yet, or for ``SILENT_S``), else OK; values without the camera prefix, plus its name."""
        camera = self.cameras[source]
        silent = camera.silent_s()
        if source in self.camera_errors:
            level, message = "error", self.camera_errors[source]
        elif silent is None:
            level, message = "warn", "no frame yet"
        elif silent > SILENT_S:
            level, message = "warn", f"no frame for {silent:.1f} s"
        elif camera.frames.processed == 0:
            level, message = "warn", "waiting for its first result"
        else:
            level, message = "ok", "processing"
        return ServingStatus(level, message, {"camera": source, **camera.values()})

    # ------------------------------------------------------------------ shutdown
    def stop(self) -> None:
        """Stop taking frames, without waiting: a host with several cores asks them all first, so
        their frames end together and its shutdown waits for the slowest, not for each in turn."""
        if self._stopped_at is None:
            self._stopped_at = time.monotonic()
        self.worker.stop()

    def close(self) -> None:
        """Stop the worker, then free the engine. A worker still inside a frame or a budget
        change after ``WORKER_STOP_S`` keeps the engine: freeing it under a running kernel could
        crash the process, which exits without the worker instead (``unfinished_work``). The
        engine is freed on a thread of its own, waited for ``ENGINE_CLOSE_S``: an engine busy
        sizing the model at an input size (a child process, seconds) frees itself when done, and
        a process exiting meanwhile exits without it."""
        self.stop()
        CORES_IN_PROCESS.discard(self)
        assert self._stopped_at is not None
        self.worker.join(max(0.0, self._stopped_at + WORKER_STOP_S - time.monotonic()))
        if self.worker.alive():
            return
        self._closer = threading.Thread(target=self._close_core, name=f"{self.name}-close", daemon=True)
        self._closer.start()
        self._closer.join(timeout=max(0.0, self._stopped_at + WORKER_STOP_S + ENGINE_CLOSE_S - time.monotonic()))

    def _close_core(self) -> None:
        with self.lock:
            self.mapped.close()
            self.core.close()

    def unfinished_work(self) -> list[str]:
        """Threads ``close`` could not stop or wait out (the process exits without them)."""
        return [thread.name for thread in (*self.worker.threads, self._closer)
                if thread is not None and thread.is_alive()]
