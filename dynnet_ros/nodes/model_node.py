"""The shared base of the lane, pedestrian and depth nodes.

Threading model: the subscription callback only parks the newest Image in a one-slot mailbox
(an older unprocessed frame is dropped and counted), and one worker thread runs the model on
whatever is newest. Latency therefore stays bounded by one inference, never by a queue.
Parameter changes are validated (and a new engine loaded) in the on-set callback; the worker
sees them from its next frame on.

Memory: the node's budget (``memory_budget_mb``) bounds its RSS growth since before the model
loaded, so the node charges its own per-frame memory (camera messages in flight, the model-input
tensors it fills, post-processing; ``frame_memory.frame_bytes``) to it and hands its engine the
rest. Frames are converted from views over the message data into one reused input tensor, and
the message is released before the engine runs (docs/budget.md, "node memory").
"""
from __future__ import annotations

import os
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray
from rcl_interfaces.msg import SetParametersResult
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.node import Node
from rclpy.qos import QoSHistoryPolicy, QoSProfile, qos_profile_sensor_data
from sensor_msgs.msg import CameraInfo, Image

from dynnet_ros.budget.protocol import size_key
from dynnet_ros.engine import Engine
from dynnet_ros.engine.backends import available_backends
from dynnet_ros.engine.memtrim import release_memory
from dynnet_ros.engine.model_io import input_specs, output_names
from dynnet_ros.engine.plan.loader import load_skeleton
from dynnet_ros.engine.procmem import process_memory
from dynnet_ros.nodes import diagnostics as diag
from dynnet_ros.nodes.base import ParamSpec, declare
from dynnet_ros.nodes.budget_profile import ProfilePublisher, memory_now, prewarm_runtime
from dynnet_ros.nodes.convert import image_to_array
from dynnet_ros.nodes.frame_memory import FrameBytes, InputBuffer, frame_bytes
from dynnet_ros.nodes.geometry import Letterbox, plan_letterbox, validate_intrinsics
from dynnet_ros.nodes.sensor_sim import parse_resolution
from dynnet_ros.nodes.stats import FrameStats
from dynnet_ros.units import to_mb
from dynnet_ros.zoo import ensure_model

ENGINE_PARAMS = ("model_path", "backend", "threads")
#: parameters whose change re-computes the minimums the node announces per input size class
ANNOUNCE_PARAMS = ("camera_sizes", "max_input_side")
# Outputs: reliable (so RViz / `ros2 topic echo` defaults receive them, and best-effort
# subscribers too), keep-last 2 so a slow subscriber never builds a queue.
OUTPUT_QOS = QoSProfile(depth=2)
# Camera input: the sensor-data profile (best effort, volatile: matches any camera driver) with a
# history of one. The node only ever processes the newest frame, and each frame the DDS reader
# keeps is a message-sized buffer charged to the node's budget.
IMAGE_QOS = QoSProfile(history=QoSHistoryPolicy.KEEP_LAST, depth=1, reliability=qos_profile_sensor_data.reliability,
                       durability=qos_profile_sensor_data.durability)
#: Until the first frame arrives the node charges a 640x480 rgb8 camera (the engine's reference size).
DEFAULT_CAMERA = (640, 480, 3)
#: Camera messages are charged at the largest size seen this long: when the camera changes size,
#: frames of the other size are still in flight (DDS history, rclpy's copies, the mailbox) — the
#: same window as the published profile's hold (budget.profile.ProfileHold).
MESSAGE_HOLD_S = 30.0


@dataclass(frozen=True)
class ModelInterface:
    """A model's inputs and outputs, read from its graph without loading its weights."""

    inputs: list
    outputs: list[str]


def model_interface(path: str) -> ModelInterface:
    """ValueError for a missing, unreadable or invalid model file (the same messages as Engine)."""

    proto = load_skeleton(path)
    return ModelInterface(input_specs(proto), output_names(proto))


@dataclass(frozen=True)
class FrameInfo:
    """What post-processing needs of a camera message once its pixels are in the input tensor."""

    header: Any
    width: int
    height: int
    encoding: str


def _backend_check(value: str) -> str | None:
    reasons = available_backends()
    if value not in reasons:
        return f"backend must be one of {sorted(reasons)}, got {value!r}"
    if reasons[value] is not None:
        return f"backend '{value}' is unavailable: {reasons[value]}"
    return None


def _check_camera_sizes(values: list[str]) -> str | None:
    try:
        for text in values:
            parse_resolution(text)
    except ValueError as exc:
        return f"camera_sizes: {exc}"
    return None


def common_specs(task: str) -> list[ParamSpec]:
    return [
        ParamSpec("model_path", "", f"ONNX model file; empty = the zoo's '{task}' model (built on first use). "
                  "Changing it loads the new model first; a file that does not load is rejected and the "
                  "old model keeps serving."),
        ParamSpec("backend", "cpu", "Engine backend (see Engine); 'tensorrt' is rejected where unavailable.",
                  check=_backend_check),
        ParamSpec("threads", 0, "Inference threads for the engine (0 = onnxruntime default).", low=0, high=256),
        ParamSpec("memory_budget_mb", 0.0, "Memory budget for this model in MiB (0 = unlimited); passed to "
                  "Engine.set_memory_budget.", low=0.0, high=1.0e6),
        ParamSpec("enabled", True, "Process frames; false stops inference and output (diagnostics continue)."),
        ParamSpec("max_input_side", 640, "Downscale camera frames whose longer side exceeds this before "
                  "padding to multiples of 32 (0 = never downscale).", low=0, high=8192),
        ParamSpec("camera_sizes", ["320x240", "640x480", "1280x720"], "Camera resolutions (WIDTHxHEIGHT) "
                  "whose minimum budgets the node announces to the budget manager before such a frame "
                  "arrives; sizes not listed are announced once seen.", kind="string_array",
                  check=_check_camera_sizes),
    ]


class ModelNode(Node):
    """Camera frames in, one model run per newest frame, task-specific outputs out."""

    task = "model"
    input_multiple = 32
    #: value of the letterbox padding in the model input
    pad_value = 0.0
    #: model-input channels the node fills besides the 3 image channels (depth: the LiDAR channel)
    extra_input_channels = 0
    #: post-processing bytes per camera pixel (output arrays and the output message), and a constant
    output_bytes_per_pixel = 0.0
    output_const_bytes = 64 * 1024
    #: ...and what mapping a downscaled result back to camera pixels adds per camera pixel
    scaled_output_bytes_per_pixel = 0.0

    def __init__(self, node_name: str, task_specs: list[ParamSpec]) -> None:
        super().__init__(node_name)
        self._specs = {s.name: s for s in common_specs(self.task) + task_specs}
        self.params: dict[str, Any] = declare(self, self._specs.values())
        self._engine_lock = threading.Lock()   # held while the worker runs a frame
        self._state_lock = threading.Lock()
        self._budget_lock = threading.Lock()   # node budget -> engine budget, one change at a time
        self._image_buffer = InputBuffer(3)
        width, height, channels = DEFAULT_CAMERA
        self._frame_key: tuple | None = None
        self.frame: FrameBytes = self.frame_bytes(width * height * channels, plan_letterbox(
            height, width, multiple=self.input_multiple, max_side=int(self.params["max_input_side"])))
        self._engine_budget_mb: float | None = None   # what the engine was handed
        self._frame_warned: set = set()
        self._last_refused: tuple | None = None   # (camera size, budget) the engine refused last frame
        self._message_sizes: list[tuple[float, int]] = []   # (monotonic time, bytes) of recent frames
        # Model-independent library state (engine modules, onnx's schema registry) loads before the
        # baseline, like rclpy: it is the same for every model and stays when a model is unloaded.
        prewarm_runtime()
        rss_before_model = memory_now()  # budget baseline: a budget bounds RSS growth from here
        # built inside its budget: an in-memory engine first would double the start-up peak
        self.engine = self._load_engine(self.params)
        self._held_after_load_mb = memory_now().rss_mb - rss_before_model.rss_mb

        self.stats = FrameStats()
        self._pending: Image | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._last_error: str | None = None
        self._last_input_shape: list[int] | None = None
        self._last_camera: tuple[int, int] | None = None
        self._camera_infos: dict[tuple[int, int], np.ndarray] = {}

        self.diag_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        # sensor callbacks and the diagnostics timer run beside the parameter services (see run_node)
        self.io_group = MutuallyExclusiveCallbackGroup()
        self.create_subscription(Image, "camera/image_raw", self._on_image, IMAGE_QOS,
                                 callback_group=self.io_group)
        self.create_subscription(CameraInfo, "camera/camera_info", self._on_camera_info, qos_profile_sensor_data,
                                 callback_group=self.io_group)
        self.add_on_set_parameters_callback(self._on_set_parameters)
        self.create_timer(1.0, self.publish_diagnostics, callback_group=self.io_group)
        # latency-vs-budget profile for the budget manager (docs/budget.md)
        self.budget_profile = ProfilePublisher(self, lambda: self.engine,
                                               lambda: self.params["memory_budget_mb"] or None, rss_before_model,
                                               frame_mb=lambda: self.frame.total_mb, size=self._size_class)
        self._announce_sizes(self.engine, self.params)
        self._worker = threading.Thread(target=self._work, name=f"{node_name}-worker", daemon=True)
        self._worker.start()
        self.get_logger().info(f"{self.task} model {self.engine.model_path} on {self.params['backend']}; "
                               f"inputs {[s.describe() for s in self.engine.inputs]}")

    # ------------------------------------------------------------------ subclass hooks
    def check_model(self, engine: "ModelInterface | Engine") -> None:
        """Raise ValueError when the model (its inputs and outputs) does not fit this node's task."""
        names = {s.name for s in engine.inputs}
        if "image" not in names:
            raise ValueError(f"model has inputs {sorted(names)}; a {self.task} model needs 'image'")

    def infer(self, frame: FrameInfo, image: np.ndarray, letterbox: Letterbox, engine: Engine) -> None:
        """Run the model on one frame and publish the results (header copied from ``frame``).

        ``image`` is the letterboxed 1x3xHxW model input (a buffer the node reuses next frame).
        """
        raise NotImplementedError

    def frame_bytes(self, message_bytes: int, letterbox: Letterbox) -> FrameBytes:
        """What this node holds per frame outside its engine (charged to its budget)."""
        return frame_bytes(message_bytes, letterbox, input_channels=3 + self.extra_input_channels,
                           output_bytes_per_pixel=self.output_bytes_per_pixel,
                           output_const_bytes=self.output_const_bytes,
                           scaled_output_bytes_per_pixel=self.scaled_output_bytes_per_pixel)

    # ------------------------------------------------------------------ engine management
    def _load_engine(self, params: dict[str, Any]) -> Engine:
        path = params["model_path"]
        if not path:
            path = str(ensure_model(self.task))
        threads = int(params["threads"]) or None
        # the task check first, on the graph alone: a wrong model is named as such, not as
        # "over budget", and is never loaded
        self.check_model(model_interface(path))
        budget = self._engine_budget(params["memory_budget_mb"])
        try:
            engine = Engine(path, backend=params["backend"], threads=threads, memory_budget_mb=budget, swappable=True)
        except ValueError:
            if budget is None or budget == float(params["memory_budget_mb"]):
                raise
            # The budget fits the model but not next to this node's frame buffers: start at the
            # whole budget (over it by at most the frame buffers) rather than not at all; the
            # published minimum includes the frame buffers, so the manager raises the budget.
            budget = float(params["memory_budget_mb"])
            engine = Engine(path, backend=params["backend"], threads=threads, memory_budget_mb=budget, swappable=True)
            self.get_logger().warning(
                f"memory_budget_mb {budget:g} leaves the model {budget - self.frame.total_mb:.1f} MB next to this "
                f"node's {self.frame.total_mb:.1f} MB of frame buffers, below its minimum "
                f"{engine.min_budget_mb():.1f} MB; running the model at {budget:g} MB")
        self._engine_budget_mb = budget
        return engine

    def _engine_budget(self, node_mb: float) -> float | None:
        """The engine's share of the node's budget: the budget minus this node's frame buffers."""
        if node_mb == 0:
            return None
        return max(float(node_mb) - self.frame.total_mb, 0.01)

    def _apply_budget(self, engine: Engine, mb: float | None) -> None:
        """Change the engine's budget in place; a replaced executor's memory goes back to the OS."""
        before = engine.engine_stats().executor
        engine.set_memory_budget(mb)
        self._engine_budget_mb = mb
        if engine.engine_stats().executor != before:  # an executor was replaced (not just its window resized)
            release_memory()

    def _update_frame_memory(self, message_bytes: int, letterbox: Letterbox) -> None:
        """Charge this frame's buffers and give the engine the rest of the budget.

        Runs in the worker between two frames. Camera messages are charged at the largest size
        seen in ``MESSAGE_HOLD_S``. If the model's share is below the engine's minimum, the
        engine goes as low as it allows and the share is retried next frame (the minimum follows
        the input size the engine last ran); a refusal that persists is warned once per size and
        budget — the published profile already asks the manager for more.
        """
        now = time.monotonic()
        self._message_sizes = [(t, b) for t, b in self._message_sizes
                               if now - t <= MESSAGE_HOLD_S and b > message_bytes]
        self._message_sizes.append((now, message_bytes))
        message_bytes = max(b for _, b in self._message_sizes)  # larger frames may still be in flight
        key = (message_bytes, letterbox)
        with self._budget_lock:
            if key != self._frame_key:
                self._frame_key = key
                self.frame = self.frame_bytes(message_bytes, letterbox)
            node_mb = self.params["memory_budget_mb"]
            target = self._engine_budget(node_mb)
            self._last_refused, refused = None, self._last_refused
            if target is None or (target == self._engine_budget_mb and not self._engine_over_budget()):
                return
            try:
                self._apply_budget(self.engine, target)
                return
            except ValueError as exc:
                reason = str(exc)
            # Below the engine's minimum — which refers to the input size it last ran, so on the
            # first frame of a new size it may be stale: come as close as the engine allows now,
            # and retry the exact share next frame.
            closest = self.engine.min_budget_mb() + 0.01
            if self._engine_budget_mb is None or closest < self._engine_budget_mb:
                try:
                    self._apply_budget(self.engine, closest)
                except ValueError:
                    pass
            state = (letterbox.src_w, letterbox.src_h, node_mb)
            if state == refused and state not in self._frame_warned:  # not just a stale minimum
                self._frame_warned.add(state)
                self.get_logger().warning(
                    f"{letterbox.src_w}x{letterbox.src_h} frames need {self.frame.total_mb:.1f} MB of frame "
                    f"buffers, leaving the model {target:.1f} MB of memory_budget_mb {node_mb:g}: {reason}; "
                    f"the model keeps {self._engine_budget_mb or 0:.1f} MB")
            self._last_refused = state

    def _engine_over_budget(self) -> bool:
        """The engine's window is predicted above its budget: the input size changed under it.
        Setting the same budget again lets it re-size the window for the size it now runs."""
        window = self.engine.engine_stats().window
        if window is None or window.budget_bytes is None:
            return False
        return window.predicted_peak_bytes > window.budget_bytes + 1024

    def _on_set_parameters(self, parameters) -> SetParametersResult:
        updates: dict[str, Any] = {}
        for param in parameters:
            spec = self._specs.get(param.name)
            value = param.value
            if spec is not None and spec.type_key in ("double_array", "string_array"):
                value = list(value)
            if spec is not None:
                reason = spec.validate(value)
                if reason:
                    return SetParametersResult(successful=False, reason=reason)
            updates[param.name] = value
        merged = {**self.params, **updates}
        new_engine = None
        try:
            self.validate_task_params(merged, updates)
            changed = {name for name in updates if updates[name] != self.params.get(name)}
            if changed & set(ENGINE_PARAMS):
                new_engine = self._load_engine(merged)  # built inside the new budget directly
            elif "memory_budget_mb" in updates and updates["memory_budget_mb"] != self.params["memory_budget_mb"]:
                with self._budget_lock:  # lands between two frames
                    share = self._engine_budget(merged["memory_budget_mb"])
                    try:
                        self._apply_budget(self.engine, share)
                    except ValueError as exc:  # quote the value set first; the engine's share follows from it
                        raise ValueError(f"memory_budget_mb {merged['memory_budget_mb']:g} leaves the model "
                                         f"{round(share or 0.0, 3):g} MB after this node's {self.frame.total_mb:.1f} "
                                         f"MB of frame buffers: {exc}") from exc
                    with self._engine_lock:
                        self.params = {**self.params, "memory_budget_mb": merged["memory_budget_mb"]}
        except ValueError as exc:
            if new_engine is not None:
                new_engine.close()
            return SetParametersResult(successful=False, reason=str(exc))
        old = None
        with self._engine_lock:
            if new_engine is not None:
                old, self.engine = self.engine, new_engine
            self.params = merged
        if old is not None and new_engine is not None:
            old.close()  # load new -> swap -> close old: two engines only while switching
            release_memory()
            self.get_logger().info(f"switched to model {new_engine.model_path} ({merged['backend']})")
        if new_engine is not None or changed & set(ANNOUNCE_PARAMS):
            self._announce_sizes(self.engine, merged)
        return SetParametersResult(successful=True)

    def validate_task_params(self, merged: dict[str, Any], updates: dict[str, Any]) -> None:
        """Cross-parameter checks of subclasses; raise ValueError with the reason."""

    # ------------------------------------------------------------------ frames
    def _on_image(self, msg: Image) -> None:
        with self._state_lock:
            self.stats.received += 1
            if self._pending is not None:
                self.stats.dropped += 1
            self._pending = msg
        self._wake.set()

    def _on_camera_info(self, msg: CameraInfo) -> None:
        try:
            k = validate_intrinsics(msg.k)
        except ValueError as exc:
            self.get_logger().warning(f"ignoring CameraInfo: {exc}", throttle_duration_sec=5.0)
            return
        with self._state_lock:
            self._camera_infos[(int(msg.width), int(msg.height))] = k

    def intrinsics_for(self, width: int, height: int) -> np.ndarray | None:
        """K for this image size: an exact CameraInfo match, else the latest one rescaled."""
        with self._state_lock:
            if (width, height) in self._camera_infos:
                return self._camera_infos[(width, height)]
            if not self._camera_infos:
                return None
            (w0, h0), k0 = next(reversed(self._camera_infos.items()))
        k = k0.copy()
        k[0] *= width / w0
        k[1] *= height / h0
        return k

    def _work(self) -> None:
        while not self._stop.is_set():
            if not self._wake.wait(timeout=0.2):
                continue
            with self._state_lock:
                slot, self._pending = [self._pending], None
                self._wake.clear()
            if slot[0] is None or not self.params["enabled"]:
                continue
            try:
                self._process_frame(slot)  # takes the message out of the slot: no other reference
            except Exception:  # noqa: BLE001 — the node must keep serving; the reason is reported
                if self._stop.is_set():
                    return
                self.get_logger().error(traceback.format_exc())

    def _process_frame(self, slot: list) -> None:
        """Run one frame; ``slot`` holds the only reference to the message, which is dropped as
        soon as its pixels are in the input tensor (before the engine runs)."""
        start = time.perf_counter()
        msg = slot.pop()
        try:
            frame = FrameInfo(msg.header, int(msg.width), int(msg.height), msg.encoding)
            array = image_to_array(msg)  # a view over msg.data where the layout allows
            letterbox = plan_letterbox(array.shape[0], array.shape[1], multiple=self.input_multiple,
                                       max_side=int(self.params["max_input_side"]))
            self._update_frame_memory(len(msg.data), letterbox)
            image = self._image_buffer.fill_image(array, frame.encoding, letterbox, self.pad_value)
            del array, msg  # the message's pixels are no longer needed
            with self._engine_lock:
                self.infer(frame, image, letterbox, self.engine)
        except Exception as exc:  # bad message or inference failure: ERROR diagnostic, keep serving
            if not self.context.ok():  # shutting down: publishers are gone, nothing to report
                self._stop.set()
                return
            self.stats.failed += 1
            reason = f"{type(exc).__name__}: {exc}" if not isinstance(exc, ValueError) else str(exc)
            self.report_error(f"bad frame: {reason}")
            return
        self.stats.record((time.perf_counter() - start) * 1e3)
        self._last_input_shape = [1, 3, letterbox.pad_h, letterbox.pad_w]
        self._last_camera = (frame.width, frame.height)
        if not self.budget_profile.knows(size_key(letterbox.pad_h, letterbox.pad_w)):
            self.budget_profile.publish()  # a new size class: its minimum goes to the manager now
        if self._last_error is not None:
            self._last_error = None
            self.publish_diagnostics()

    def input_shapes(self, engine: Engine, letterbox: Letterbox) -> dict[str, tuple[int, ...]]:
        """The shapes of the image-sized (rank-4) inputs this node feeds ``engine`` for ``letterbox``."""
        shapes: dict[str, tuple[int, ...]] = {}
        for spec in engine.inputs:
            if spec.rank == 4:
                batch, channels = (d if isinstance(d, int) else 1 for d in spec.dims[:2])
                shapes[spec.name] = (batch, channels, letterbox.pad_h, letterbox.pad_w)
        return shapes

    def announced_minimums(self, engine: Engine, params: dict[str, Any]) -> dict[str, float]:
        """The node's minimum budget per input size class for the cameras in ``camera_sizes``:
        the engine's minimum at that input size plus this node's frame buffers for it, with
        camera messages at the largest of those sizes (messages are charged at the largest size
        seen lately, ``MESSAGE_HOLD_S``). A class the engine cannot size is left to be measured."""
        cameras = [parse_resolution(text) for text in params["camera_sizes"]]
        message_bytes = max((w * h * 3 for w, h in cameras), default=0)
        out: dict[str, float] = {}
        for width, height in cameras:
            box = plan_letterbox(height, width, multiple=self.input_multiple, max_side=int(params["max_input_side"]))
            try:
                engine_mb = engine.min_budget_mb(self.input_shapes(engine, box))
            except ValueError as exc:
                self.get_logger().info(f"no announced minimum for {width}x{height} frames: {exc}")
                continue
            mb = engine_mb + self.frame_bytes(message_bytes, box).total_mb
            key = size_key(box.pad_h, box.pad_w)
            out[key] = max(mb, out.get(key, 0.0))
        return out

    def _announce_sizes(self, engine: Engine, params: dict[str, Any]) -> None:
        """Compute ``announced_minimums`` beside the node (an engine may measure a size class in a
        child process) and publish them as soon as they are known."""
        def work() -> None:
            try:
                minimums = self.announced_minimums(engine, params)
            except Exception as exc:  # noqa: BLE001 — announcing is advisory; measured sizes still count
                if self.context.ok():
                    self.get_logger().warning(f"size-class minimums not announced: {exc}")
                minimums = {}
            self.budget_profile.announce(engine, minimums)
            if self.context.ok():
                self.budget_profile.publish()

        threading.Thread(target=work, name=f"{self.get_name()}-announce", daemon=True).start()

    def _size_class(self) -> str | None:
        """The model-input size class the engine last ran ("HxW"; None before the first frame)."""
        shape = self._last_input_shape
        return None if shape is None else size_key(shape[2], shape[3])

    # ------------------------------------------------------------------ diagnostics
    def report_error(self, message: str) -> None:
        """ERROR diagnostic now (logged once per episode); the next good frame clears it."""
        first = self._last_error is None
        self._last_error = message
        if first:
            self.get_logger().error(message)
        self.publish_diagnostics()

    def extra_diagnostics(self) -> dict[str, Any]:
        return {}

    def publish_diagnostics(self) -> None:
        p50, p95 = self.stats.percentiles()
        typed = self.engine.engine_stats()
        engine_stats = typed.as_dict()
        if self._last_error is not None:
            level, message = diag.ERROR, self._last_error
        elif not self.params["enabled"]:
            level, message = diag.OK, "disabled (enabled=false)"
        elif self.stats.processed == 0:
            level, message = diag.WARN, "waiting for /camera/image_raw"
        else:
            level, message = diag.OK, "processing"
        values = {
            "task": self.task,
            "pid": os.getpid(),
            "hz": self.stats.rate_hz(),
            "latency_p50_ms": p50,
            "latency_p95_ms": p95,
            "latency_last_ms": self.stats.last_ms,
            "engine_latency_ms": typed.last_latency_ms,
            "input_shape": "x".join(map(str, self._last_input_shape)) if self._last_input_shape else "",
            "camera_resolution": f"{self._last_camera[0]}x{self._last_camera[1]}" if self._last_camera else "",
            "frames_received": self.stats.received,
            "frames_processed": self.stats.processed,
            "frames_dropped": self.stats.dropped,
            "frames_failed": self.stats.failed,
            "rss_mb": process_memory().rss_mb,
            "model_path": self.engine.model_path,
            "backend": self.params["backend"],
            "memory_budget_mb": self.params["memory_budget_mb"],
            "enabled": self.params["enabled"],
            "last_error": self._last_error or "",
        }
        values.update(self.extra_diagnostics())
        values.update({f"engine.{k}": v for k, v in engine_stats.items()})
        # The model's budget is the node's share; the engine itself runs in it minus the frame buffers.
        values["engine.model_budget_mb"] = typed.memory_budget_mb
        values["engine.memory_budget_mb"] = self.params["memory_budget_mb"] or None
        values["frame_buffers_mb"] = self.frame.total_mb
        values["held_after_load_mb"] = self._held_after_load_mb
        values["engine.predicted_peak_mb"] = None if typed.window is None else to_mb(typed.window.predicted_peak_bytes)
        status = diag.make_status(f"{self.get_name()}: {self.task} model", self.get_fully_qualified_name(),
                                  level, message, values)
        try:
            self.diag_pub.publish(diag.make_array(self.get_clock().now().to_msg(), [status]))
        except Exception:  # noqa: BLE001 — context already shut down during exit
            if self.context.ok() and not self._stop.is_set():
                raise

    def close(self) -> None:
        self.budget_profile.close()
        self._stop.set()
        self._wake.set()
        self._worker.join(timeout=5.0)
        with self._engine_lock:
            self.engine.close()
