"""The shared base of the lane, pedestrian and depth nodes.

Threading model: the subscription callback only parks the newest Image in a one-slot mailbox
(an older unprocessed frame is dropped and counted), and one worker thread runs the model on
whatever is newest. Latency therefore stays bounded by one inference, never by a queue.
Parameter changes are validated (and a new engine loaded) in the on-set callback; the worker
sees them from its next frame on.
"""
from __future__ import annotations

import os
import threading
import time
import traceback
from typing import Any

import numpy as np
import psutil
from diagnostic_msgs.msg import DiagnosticArray
from rcl_interfaces.msg import SetParametersResult
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.node import Node
from rclpy.qos import QoSProfile, qos_profile_sensor_data
from sensor_msgs.msg import CameraInfo, Image

from dynnet_ros.engine import Engine
from dynnet_ros.engine.backends import available_backends
from dynnet_ros.nodes import diagnostics as diag
from dynnet_ros.nodes.base import ParamSpec, declare
from dynnet_ros.nodes.budget_profile import ProfilePublisher, memory_now
from dynnet_ros.nodes.convert import image_to_rgb_float
from dynnet_ros.engine.memtrim import release_memory
from dynnet_ros.nodes.geometry import Letterbox, plan_letterbox, validate_intrinsics
from dynnet_ros.nodes.stats import FrameStats

ENGINE_PARAMS = ("model_path", "backend", "threads")
# Outputs: reliable (so RViz / `ros2 topic echo` defaults receive them, and best-effort
# subscribers too), keep-last 2 so a slow subscriber never builds a queue.
OUTPUT_QOS = QoSProfile(depth=2)


def _backend_check(value: str) -> str | None:
    reasons = available_backends()
    if value not in reasons:
        return f"backend must be one of {sorted(reasons)}, got {value!r}"
    if reasons[value] is not None:
        return f"backend '{value}' is unavailable: {reasons[value]}"
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
    ]


class ModelNode(Node):
    """Camera frames in, one model run per newest frame, task-specific outputs out."""

    task = "model"
    input_multiple = 32

    def __init__(self, node_name: str, task_specs: list[ParamSpec]) -> None:
        super().__init__(node_name)
        self._specs = {s.name: s for s in common_specs(self.task) + task_specs}
        self.params: dict[str, Any] = declare(self, self._specs.values())
        self._engine_lock = threading.Lock()   # held while the worker runs a frame
        self._state_lock = threading.Lock()
        rss_before_model = memory_now()  # budget baseline: a budget bounds RSS growth from here
        # built inside its budget: an in-memory engine first would double the start-up peak
        self.engine = self._load_engine(self.params)

        self.stats = FrameStats()
        self._pending: Image | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._last_error: str | None = None
        self._last_input_shape: list[int] | None = None
        self._last_camera: tuple[int, int] | None = None
        self._camera_infos: dict[tuple[int, int], np.ndarray] = {}
        self._process = psutil.Process(os.getpid())

        self.diag_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        # sensor callbacks and the diagnostics timer run beside the parameter services (see run_node)
        self.io_group = MutuallyExclusiveCallbackGroup()
        self.create_subscription(Image, "camera/image_raw", self._on_image, qos_profile_sensor_data,
                                 callback_group=self.io_group)
        self.create_subscription(CameraInfo, "camera/camera_info", self._on_camera_info, qos_profile_sensor_data,
                                 callback_group=self.io_group)
        self.add_on_set_parameters_callback(self._on_set_parameters)
        self.create_timer(1.0, self.publish_diagnostics, callback_group=self.io_group)
        # latency-vs-budget profile for the budget manager (docs/budget.md)
        self.budget_profile = ProfilePublisher(self, lambda: self.engine,
                                               lambda: self.params["memory_budget_mb"] or None, rss_before_model)
        self._worker = threading.Thread(target=self._work, name=f"{node_name}-worker", daemon=True)
        self._worker.start()
        self.get_logger().info(f"{self.task} model {self.engine.model_path} on {self.params['backend']}; "
                               f"inputs {[s.describe() for s in self.engine.inputs]}")

    # ------------------------------------------------------------------ subclass hooks
    def check_model(self, engine: Engine) -> None:
        """Raise ValueError when the engine's model does not fit this node's task."""
        names = {s.name for s in engine.inputs}
        if "image" not in names:
            raise ValueError(f"model has inputs {sorted(names)}; a {self.task} model needs 'image'")

    def infer(self, msg: Image, rgb: np.ndarray, letterbox: Letterbox, engine: Engine) -> None:
        """Run the model on one frame and publish the results (header copied from msg)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ engine management
    def _load_engine(self, params: dict[str, Any]) -> Engine:
        path = params["model_path"]
        if not path:
            from dynnet_ros.zoo import ensure_model

            path = str(ensure_model(self.task))
        threads = int(params["threads"]) or None
        engine = Engine(path, backend=params["backend"], threads=threads,
                        memory_budget_mb=self._budget_value(params["memory_budget_mb"]))
        try:
            self.check_model(engine)
        except ValueError:
            engine.close()
            raise
        return engine

    @staticmethod
    def _budget_value(mb: float) -> float | None:
        return None if mb == 0 else float(mb)

    def _apply_budget(self, engine: Engine, mb: float) -> None:
        """Change the budget in place; the replaced executor's memory goes back to the OS at once."""
        def executor_id(stats: dict) -> tuple:
            return stats.get("executor"), (stats.get("swap") or {}).get("store")

        before = executor_id(engine.stats())
        engine.set_memory_budget(self._budget_value(mb))
        if executor_id(engine.stats()) != before:  # an executor was replaced (not just repartitioned)
            release_memory()

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
            if any(name in updates and updates[name] != self.params[name] for name in ENGINE_PARAMS):
                new_engine = self._load_engine(merged)  # built inside the new budget directly
            elif "memory_budget_mb" in updates and updates["memory_budget_mb"] != self.params["memory_budget_mb"]:
                self._apply_budget(self.engine, merged["memory_budget_mb"])  # lands between two frames
        except ValueError as exc:
            if new_engine is not None:
                new_engine.close()
            return SetParametersResult(successful=False, reason=str(exc))
        old = None
        with self._engine_lock:
            if new_engine is not None:
                old, self.engine = self.engine, new_engine
            self.params = merged
        if old is not None:
            old.close()  # load new -> swap -> close old: two engines only while switching
            release_memory()
            self.get_logger().info(f"switched to model {new_engine.model_path} ({merged['backend']})")
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
                msg, self._pending = self._pending, None
                self._wake.clear()
            if msg is None or not self.params["enabled"]:
                continue
            try:
                self._process_frame(msg)
            except Exception:  # noqa: BLE001 — the node must keep serving; the reason is reported
                if self._stop.is_set():
                    return
                self.get_logger().error(traceback.format_exc())

    def _process_frame(self, msg: Image) -> None:
        start = time.perf_counter()
        try:
            rgb = image_to_rgb_float(msg)
            if not np.all(np.isfinite(rgb)):
                raise ValueError("image contains NaN/inf values")
            letterbox = plan_letterbox(rgb.shape[0], rgb.shape[1], multiple=self.input_multiple,
                                       max_side=int(self.params["max_input_side"]))
            with self._engine_lock:
                self.infer(msg, rgb, letterbox, self.engine)
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
        self._last_camera = (int(msg.width), int(msg.height))
        if self._last_error is not None:
            self._last_error = None
            self.publish_diagnostics()

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
        engine_stats = self.engine.stats()
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
            "engine_latency_ms": engine_stats.get("last_latency_ms"),
            "input_shape": "x".join(map(str, self._last_input_shape)) if self._last_input_shape else "",
            "camera_resolution": f"{self._last_camera[0]}x{self._last_camera[1]}" if self._last_camera else "",
            "frames_received": self.stats.received,
            "frames_processed": self.stats.processed,
            "frames_dropped": self.stats.dropped,
            "frames_failed": self.stats.failed,
            "rss_mb": self._process.memory_info().rss / 2**20,
            "model_path": self.engine.model_path,
            "backend": self.params["backend"],
            "memory_budget_mb": self.params["memory_budget_mb"],
            "enabled": self.params["enabled"],
            "last_error": self._last_error or "",
        }
        values.update(self.extra_diagnostics())
        values.update({f"engine.{k}": v for k, v in engine_stats.items()})
        status = diag.make_status(f"{self.get_name()}: {self.task} model", self.get_fully_qualified_name(),
                                  level, message, values)
        try:
            self.diag_pub.publish(diag.make_array(self.get_clock().now().to_msg(), [status]))
        except Exception:  # noqa: BLE001 — context already shut down during exit
            if self.context.ok() and not self._stop.is_set():
                raise

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        self._worker.join(timeout=5.0)
        with self._engine_lock:
            self.engine.close()
