"""The shared base of the lane, pedestrian and depth nodes: ROS adapters over the perception cores.

A node turns a camera message into an HxWx3 uint8 RGB frame, hands it to its core
(``dynnet_ros.perception``: format decoding, preprocessing and the Engine live there) and turns
the typed result into messages, header copied. The core's Engine is the one the budget machinery
steers (budgets, size-class minimums, calibration).

Threading model: the subscription callback only parks the newest Image in a one-slot mailbox
(an older unprocessed frame is dropped and counted), and one worker thread runs the model on
whatever is newest. Latency therefore stays bounded by one inference, never by a queue. With
``max_rate_hz`` the worker waits out the rest of each period before it takes the next frame,
and frames arriving meanwhile go through the same mailbox.
Parameter changes are validated (and a new core loaded) in the on-set callback; the worker
sees them from its next frame on.

Memory: the node's budget (``memory_budget_mb``) bounds its RSS growth since before the model
loaded, so the node charges its own per-frame memory (camera messages in flight, the model-input
tensors it fills, post-processing; ``frame_memory.frame_bytes``) to it and hands its engine the
rest. An rgb8 frame reaches the core as a view over the message data, so the message being
processed is one of the buffers charged (docs/budget.md, "node memory").
"""
from __future__ import annotations

import contextlib
import os
import threading
import time
import traceback
import weakref
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray
from rcl_interfaces.msg import SetParametersResult
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.node import Node
from rclpy.qos import QoSHistoryPolicy, QoSProfile, qos_profile_sensor_data
from sensor_msgs.msg import CameraInfo, CompressedImage, Image
from std_msgs.msg import String

from dynnet_ros.budget.protocol import BUDGET_PARAM, BUDGETS_TOPIC, OWNER_PARAM, size_key, unit_budget
from dynnet_ros.bytesize import to_mb
from dynnet_ros.compressed import TRANSPORTS, compressed_topic
from dynnet_ros.engine.backends.registry import available_backends
from dynnet_ros.engine.engine import Engine
from dynnet_ros.mapper.runtime import StageExecutor
from dynnet_ros.memtrim import release_memory
from dynnet_ros.nodes import diagnostics as diag
from dynnet_ros.nodes.base import SENSOR_QOS_OVERRIDES, AtomicParameterService, ParamSpec, declare, steady_timer
from dynnet_ros.nodes.budget_profile import ProfilePublisher, memory_now, prewarm_runtime
from dynnet_ros.nodes.convert import camera_to_rgb8
from dynnet_ros.nodes.frame_memory import FrameBytes, frame_bytes
from dynnet_ros.nodes.frame_report import FrameReporter
from dynnet_ros.nodes.mapped import (
    AutoPick,
    MappedSettings,
    Rerun,
    auto_hardware,
    check_mapping,
    choose_auto,
    mapped_diagnostics,
    open_auto,
    open_mapped,
    tune,
)
from dynnet_ros.nodes.sensor_sim import parse_resolution
from dynnet_ros.nodes.stats import FrameStats, StampGaps
from dynnet_ros.perception.core import PerceptionCore
from dynnet_ros.perception.letterbox import Letterbox, plan_letterbox
from dynnet_ros.perception.model_info import ModelInfo, read_model_info
from dynnet_ros.perception.projection import validate_intrinsics
from dynnet_ros.procmem import process_memory
from dynnet_ros.settings import settings
from dynnet_ros.zoo import ensure_model

#: parameters whose change builds a new core (loaded beside the old one, which serves until then);
#: each node adds its own (``ModelNode.core_params``)
ENGINE_PARAMS = ("model_path", "model_format", "backend", "threads", "max_input_side")
#: parameters that describe the model loaded (its export format, its class names): a model switch
#: may need them changed in the same request
MODEL_BOUND_PARAMS = ("model_format", "classes", "labels_file", "output_name")
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
#: How often a worker waiting out ``max_rate_hz`` re-reads it: a lowered or cleared cap (or a
#: stop) takes effect within this time, not at the end of a long period.
RATE_POLL_S = 0.2
#: How long closing waits for the worker to finish its frame or budget change: with the rest of
#: the shutdown (run_node) it stays inside the stop signal's SHUTDOWN_DEADLINE_S, so a slow
#: frame at a stop is left unfinished instead of being reported as a hang
WORKER_STOP_S = 1.5
#: How long closing then waits for the engine to be freed (it waits for a model sizing under way)
ENGINE_CLOSE_S = 0.5


#: the model nodes alive in this process: more than one means a component container, where a
#: node's share of the process is counted from its own engine (``ModelNode.held_beside_neighbours``)
MODEL_NODES_IN_PROCESS: weakref.WeakSet = weakref.WeakSet()


def fixed_input(info: ModelInfo) -> bool:
    """The model's image input has a fixed height and width (frames are letterboxed to it, so
    ``max_input_side`` does not apply)."""
    for spec in info.inputs:
        if spec.rank != 4:
            continue
        spatial = spec.dims[2:] if spec.dims[1] == 3 else spec.dims[1:3] if spec.dims[3] == 3 else ()
        if spatial and all(isinstance(d, int) for d in spatial):
            return True
    return False


#: ``max_input_side`` default: the model's own input size (see ``input_size``)
MODEL_INPUT_SIDE = -1
#: the letterbox a node estimates its first frame's memory with before its core decides its own
#: (the zoo's models' input size)
ESTIMATE_INPUT_SIDE = 640


def input_size(path: str, params: dict[str, Any]) -> int | None:
    """The ``input_size`` option for a core: ``max_input_side`` for a dynamic-input model (frames
    fitted into a square of that side, 0 = as they come), None where the preprocessing decides:
    a fixed-input model's own size, or with ``max_input_side`` -1 the size the export recorded
    (its ``imgsz`` metadata), else its format's default (docs/models.md)."""
    side = int(params["max_input_side"])
    return None if side == MODEL_INPUT_SIDE or fixed_input(read_model_info(path)) else side


def class_list(values: list[str]) -> list[str]:
    """A ``classes`` parameter as the cores take it: blank entries dropped (a ROS string array
    cannot be declared or written in YAML empty, so [''] stands for "every class")."""
    return [v.strip() for v in values if v.strip()]


def format_spec(task: str, formats: Iterable[str], evidence: str = "signature") -> ParamSpec:
    """The ``model_format`` parameter of a node whose core decodes ``formats`` (names, or a
    mapping keyed by them): ``auto`` or one of them (whether the model fits it is checked when the
    core loads). ``evidence``: what ``auto`` decides from."""
    names = list(formats)
    choices = ["auto", *names]

    def check(value: str) -> str | None:
        return None if value in choices else f"model_format must be one of {choices}, got {value!r}"
    return ParamSpec("model_format", "auto", f"{task} export format: 'auto' (decided from the model's {evidence}; "
                     "the decision and its reason are logged and in /diagnostics) or one of "
                     f"{', '.join(names)} (docs/models.md). A change loads the model again.", check=check)


def classes_spec(meaning: str) -> ParamSpec:
    """The ``classes`` parameter (read with ``class_list``) of a node whose model may name classes."""
    return ParamSpec("classes", [""], f"{meaning} A change loads the model again.", kind="string_array")


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
        ParamSpec(BUDGET_PARAM, 0.0, "Memory budget for this model in MiB (0 = unlimited); passed to "
                  "Engine.set_memory_budget. Assigned by the budget manager named in budget_owner while it "
                  "runs (a value set by hand is then refused with the reason; docs/budget.md).",
                  low=0.0, high=1.0e6),
        ParamSpec(OWNER_PARAM, "", "The budget manager (fully qualified node name) that assigns memory_budget_mb; "
                  "'' = nobody, the value set by hand or in the parameter file holds. Written by the manager "
                  "together with each budget it pushes, not on its own."),
        ParamSpec("image_transport", "raw", "Camera transport, as image_transport names it: 'raw' subscribes to "
                  "camera/image_raw (sensor_msgs/Image), 'compressed' to camera/image_raw/compressed "
                  "(sensor_msgs/CompressedImage, JPEG or PNG; a remapped camera topic keeps the suffix). "
                  "Read-only: set it at start.", choices=TRANSPORTS, read_only=True),
        ParamSpec("enabled", True, "Process frames; false stops inference and output (diagnostics continue)."),
        ParamSpec("max_rate_hz", 0.0, "Run the model on at most this many frames per second (0 = on every "
                  "frame the worker can take). Frames arriving within a period wait in the one-frame mailbox, "
                  "a newer one replacing (and dropping) the older, so the node answers the newest frame once "
                  "the period is over and leaves the CPU to the rest of the robot meanwhile.",
                  low=0.0, high=1000.0),
        ParamSpec("max_input_side", MODEL_INPUT_SIDE, "Dynamic-input models: fit camera frames into a square of "
                  "this side (the zoo's models only shrink, exports such as Ultralytics' also enlarge) before "
                  "padding to the model's stride; -1 = the model's own size (the imgsz an export recorded in its "
                  "metadata, else its format's default: 640 for the zoo's and most formats); 0 = the camera "
                  "size. Fixed-input models are letterboxed to their size and ignore it.", low=-1, high=8192),
        ParamSpec("mapping", "", "Mapped mode (docs/mapper.md): a mapping file that cuts the model into stages "
                  "run on compute units, answering at the first confident exit; empty = unmapped. A file that "
                  "does not load is rejected and the previous mapping keeps serving. 'auto' (this machine) or "
                  "'auto:HARDWARE': the pick of the search cached by `dynnet map search`, re-picked when the "
                  "budget manager changes the node's per-unit memory.", check=check_mapping),
        ParamSpec("exit_threshold", -1.0, "Mapped mode: the confidence every early exit needs to answer "
                  "(< 0 = the mapping file's thresholds).", low=-1.0, high=1.0),
        ParamSpec("deadline_ms", 0.0, "Mapped mode: answer by this time with the deepest exit done "
                  "(0 = the mapping file's deadline, or none).", low=0.0, high=1.0e5),
        ParamSpec("camera_sizes", ["320x240", "640x480", "1280x720"], "Camera resolutions (WIDTHxHEIGHT) "
                  "whose minimum budgets the node announces to the budget manager before such a frame "
                  "arrives; sizes not listed are announced once seen.", kind="string_array",
                  check=_check_camera_sizes),
    ]


class ModelNode(Node, ABC):
    """Camera frames in, one model run per newest frame, task-specific outputs out."""

    task = "model"
    #: the zoo models' stride: what the first frame's memory is estimated with before the core loads
    input_multiple = 32
    #: task parameters whose change builds a new core (besides ``ENGINE_PARAMS``)
    core_params: tuple[str, ...] = ()
    #: model-input channels the core fills besides the 3 image channels (depth: the LiDAR channel)
    extra_input_channels = 0
    #: post-processing bytes per camera pixel (result arrays and the output message), and a constant
    output_bytes_per_pixel = 0.0
    output_const_bytes = 64 * 1024

    def __init__(self, node_name: str, task_specs: list[ParamSpec], **options: Any) -> None:
        """``options``: rclpy Node keyword arguments (a container passes its context, the node's own
        ``cli_args`` and ``use_global_arguments=False``)."""
        super().__init__(node_name, start_parameter_services=False, **options)
        # one set_parameters request (model_path + classes, say) is applied all at once or not at all
        self._parameter_service = AtomicParameterService(self)
        self._specs = {s.name: s for s in common_specs(self.task) + task_specs}
        self.params: dict[str, Any] = declare(self, self._specs.values())
        self.create_outputs()
        self._engine_lock = threading.Lock()   # held while the worker runs a frame
        self._state_lock = threading.Lock()
        self._budget_lock = threading.Lock()   # node budget -> engine budget, one change at a time
        width, height, channels = DEFAULT_CAMERA
        self._frame_key: tuple | None = None
        side = int(self.params["max_input_side"])  # the zoo's letterbox until the core decides its own
        side = ESTIMATE_INPUT_SIDE if side == MODEL_INPUT_SIDE else side
        self.frame: FrameBytes = self.frame_bytes(width * height * channels, plan_letterbox(
            height, width, target=(side, side) if side else None, multiple=self.input_multiple, scaleup=False))
        self._engine_budget_mb: float | None = None   # what the engine was handed
        self._frame_warned: set = set()
        self._last_refused: tuple | None = None   # (camera size, budget) the engine refused last frame
        self._message_sizes: list[tuple[float, int]] = []   # (monotonic time, bytes) of recent frames
        # Model-independent library state (the engine's modules) is in before the budget
        # baseline, like rclpy: it is the same for every model and stays when a model is unloaded.
        prewarm_runtime()
        rss_before_model = memory_now()  # budget baseline: a budget bounds RSS growth from here
        # built inside its budget: an in-memory engine first would double the start-up peak
        self.core: PerceptionCore = self._load_core(self.params)
        self._held_after_load_mb = memory_now().rss_mb - rss_before_model.rss_mb
        MODEL_NODES_IN_PROCESS.add(self)

        self.stats = FrameStats()
        self.gaps = StampGaps()  # frames the camera's stamps tell were lost before they reached the node
        self._pending: Image | CompressedImage | None = None
        self._last_take: float | None = None   # monotonic time the worker last took a frame (max_rate_hz)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._stopped_at: float | None = None   # monotonic time of the first stop_work()
        self._closer: threading.Thread | None = None   # frees the engine at close
        self._last_error: str | None = None
        self._rejected: str | None = None   # the last model change refused (the old core kept serving)
        self._size_publish = threading.Lock()   # held while a new size class's profile goes out
        self._last_input_shape: list[int] | None = None
        self._last_camera: tuple[int, int] | None = None
        self._camera_infos: dict[tuple[int, int], np.ndarray] = {}
        self._mapped: StageExecutor | None = None
        self._auto: AutoPick | None = None          # mapping: auto — what runs and why
        self._unit_limits: dict[str, float] = {}    # per-unit memory from the budget manager
        self._mapping_generation = 0                # bumped by every swap of the mapped stages
        try:
            self._mapped, self._auto = self._open_mapped(self.core, self.params)
        except ValueError as exc:  # the node serves unmapped; the reason is in its diagnostics
            self._rejected = f"mapping {self.params['mapping']!r} not used: {exc}"
        self.core.runner = None if self._mapped is None else self._mapped.run
        self._log_auto()

        self.diag_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        # sensor callbacks and the diagnostics timer run beside the parameter services (see run_node)
        self.io_group = MutuallyExclusiveCallbackGroup()
        self.create_sensor_inputs()
        self.frames = FrameReporter(self, self.image_subscription)
        self._repicks = Rerun(self._repick, f"{node_name}-repick", self._stop.is_set,
                              lambda trace: self.get_logger().error(f"mapping auto: re-pick failed: {trace}"))
        self.create_subscription(String, BUDGETS_TOPIC, self._on_budgets, 10, callback_group=self.io_group)
        self.add_on_set_parameters_callback(self._on_set_parameters)
        steady_timer(self, 1.0, self.publish_diagnostics, self.io_group)
        # latency-vs-budget profile for the budget manager (docs/budget.md)
        self.budget_profile = ProfilePublisher(self, lambda: self.engine,
                                               lambda: self.params["memory_budget_mb"] or None, rss_before_model,
                                               frame_mb=lambda: self.frame.total_mb, size=self._size_class,
                                               units=self._claimed_units, held=self.held_beside_neighbours)
        self._announce_sizes(self.core, self.params)
        self._worker = threading.Thread(target=self._work, name=f"{node_name}-worker", daemon=True)
        self._worker.start()
        self._log_core(self.core, "loaded")

    def own_memory_mb(self) -> float:
        """What this node's model and frames hold, counted from what they are rather than from the
        process: a streamed engine's calibrated footprint plus its resident weights (swap/footprint.py),
        or, for an engine that holds its model in memory, the RSS growth of its own load; plus the
        frame buffers."""
        window = self.engine.engine_stats().window
        engine_mb = self._held_after_load_mb if window is None else \
            to_mb(window.nonweight_bytes + window.resident_weight_bytes)
        return max(0.0, engine_mb) + self.frame.total_mb

    def held_beside_neighbours(self) -> tuple[float, float] | None:
        """(held, anonymous held) MB for the budget profile where other model nodes share this
        process (a component container): ``own_memory_mb``, since the process's RSS growth since
        this node's model loaded counts the neighbours' models and frames. None when the node is
        alone: its RSS growth is then its own and the more complete figure."""
        if len(MODEL_NODES_IN_PROCESS) <= 1:
            return None
        mb = self.own_memory_mb()
        return mb, mb

    @property
    def engine(self) -> Engine:
        """The core's Engine: what budgets, size-class minimums and calibration act on."""
        return self.core.engine

    # ------------------------------------------------------------------ subclass hooks
    def create_sensor_inputs(self) -> None:
        """Subscribe to the camera and its CameraInfo (a node with more sensors adds its own here,
        so every sensor input exists once the node shows up in the graph)."""
        compressed = self.params["image_transport"] == "compressed"
        self.image_subscription = self.create_subscription(
            CompressedImage if compressed else Image,
            compressed_topic(self.resolve_topic_name("camera/image_raw")) if compressed else "camera/image_raw",
            self._on_image, IMAGE_QOS, callback_group=self.io_group, qos_overriding_options=SENSOR_QOS_OVERRIDES)
        self.create_subscription(CameraInfo, "camera/camera_info", self._on_camera_info, qos_profile_sensor_data,
                                 callback_group=self.io_group, qos_overriding_options=SENSOR_QOS_OVERRIDES)

    @abstractmethod
    def create_outputs(self) -> None:
        """Create the node's output publishers. Runs before the model loads and before any
        subscription: a frame can never find its publisher missing, and subscribers have matched
        the outputs (discovery runs during the load) by the time the first frame is answered."""

    @abstractmethod
    def build_core(self, path: str, params: dict[str, Any], memory_budget_mb: float | None) -> PerceptionCore:
        """The task's perception core for ``path`` and the node's parameters (ValueError with the
        reason when the model fits no format, the named format, or the options)."""

    @abstractmethod
    def infer(self, frame: FrameInfo, rgb: np.ndarray, core: PerceptionCore) -> None:
        """Run the core on one HxWx3 uint8 RGB frame and publish the results (header copied from
        ``frame``)."""

    def frame_bytes(self, message_bytes: int, letterbox: Letterbox) -> FrameBytes:
        """What this node holds per frame outside its engine (charged to its budget)."""
        return frame_bytes(message_bytes, letterbox, input_channels=3 + self.extra_input_channels,
                           output_bytes_per_pixel=self.output_bytes_per_pixel,
                           output_const_bytes=self.output_const_bytes)

    # ------------------------------------------------------------------ core management
    def _load_core(self, params: dict[str, Any]) -> PerceptionCore:
        """The core for ``params``. The format is decided from the model's graph before its
        weights load, so a model that does not fit is named as such, never as "over budget"."""
        path = params["model_path"] or str(ensure_model(self.task))
        budget = self._engine_budget(params["memory_budget_mb"])
        try:
            core = self.build_core(path, params, budget)
        except ValueError as exc:
            if budget is None or budget == float(params["memory_budget_mb"]) or "memory budget" not in str(exc):
                raise
            # The budget fits the model but not next to this node's frame buffers: start at the
            # whole budget (over it by at most the frame buffers) rather than not at all; the
            # published minimum includes the frame buffers, so the manager raises the budget.
            budget = float(params["memory_budget_mb"])
            core = self.build_core(path, params, budget)
            self.get_logger().warning(
                f"memory_budget_mb {budget:g} leaves the model {budget - self.frame.total_mb:.1f} MB next to this "
                f"node's {self.frame.total_mb:.1f} MB of frame buffers, below its minimum "
                f"{core.engine.min_budget_mb():.1f} MB; running the model at {budget:g} MB")
        self._engine_budget_mb = budget
        return core

    def _open_mapped(self, core: PerceptionCore,
                     params: dict[str, Any]) -> tuple[StageExecutor | None, AutoPick | None]:
        """Mapped mode for ``core``'s model (None: unmapped) and, for ``mapping: auto``, what was
        picked and why; ValueError with the reason."""
        mapped = MappedSettings.from_params(params)
        budget = params["memory_budget_mb"] or None
        if auto_hardware(mapped.mapping) is None:
            return open_mapped(core.model_path, mapped, budget), None
        chosen = choose_auto(core.model_path, mapped.mapping, dict(self._unit_limits), settings().cache.map_dir)
        return open_auto(core.model_path, chosen, mapped, budget), chosen

    def _claimed_units(self) -> tuple[str, ...]:
        """The units whose memory this node asks the budget manager for (``mapping: auto``)."""
        auto = self._auto
        return () if auto is None else auto.hardware.unit_names

    def _log_auto(self) -> None:
        auto = self._auto
        if auto is None:
            return
        if auto.error:
            self.get_logger().error(auto.error)
        elif auto.pick is not None:
            self.get_logger().info(f"mapping auto: running {dict(auto.pick.candidate.assignment)} ({auto.pick.reason})")

    # ------------------------------------------------------------------ mapping: auto re-picks
    def _on_budgets(self, msg: String) -> None:
        """A budget report: per-unit memory for this node changed -> re-pick beside the frame loop."""
        try:
            limits = unit_budget(msg.data, self.get_fully_qualified_name()) or {}
        except ValueError as exc:
            self.get_logger().warning(f"ignoring budget report: {exc}", throttle_duration_sec=10.0)
            return
        if limits == self._unit_limits:
            return
        self._unit_limits = limits
        if auto_hardware(self.params["mapping"]) is not None:
            self._repicks.request()

    def _repick(self) -> None:
        """The cached candidate under the current per-unit limits; new stages are built here and
        swapped in between two frames (the previous ones serve meanwhile)."""
        params, core = self.params, self.core
        with self._engine_lock:
            generation, current = self._mapping_generation, self._auto
        if auto_hardware(params["mapping"]) is None:
            return
        chosen = choose_auto(core.model_path, params["mapping"], dict(self._unit_limits), settings().cache.map_dir)
        executor = None
        if not chosen.same_choice(current):
            try:
                executor = open_auto(core.model_path, chosen, MappedSettings.from_params(params),
                                     params["memory_budget_mb"] or None)
            except ValueError as exc:
                chosen = replace(chosen, pick=None, error=f"mapping auto: the pick does not run: {exc}; serving "
                                 "unmapped")
        old, stale = None, False
        with self._engine_lock:
            if generation != self._mapping_generation or self._stop.is_set():
                old, stale = executor, True   # the mapping changed meanwhile: this pick is stale
            else:
                self._auto = chosen
                if not chosen.same_choice(current):
                    old, self._mapped = self._mapped, executor
                    self.core.runner = None if executor is None else executor.run
                    self._mapping_generation += 1
        if old is not None:
            old.close()
        if not stale:
            if not chosen.same_choice(current):
                self._log_auto()
            self.publish_diagnostics()

    def _log_core(self, core: PerceptionCore, what: str) -> None:
        self.get_logger().info(f"{what} {self.task} model {core.model_path} on {self.params['backend']}: "
                               f"format {core.format_name} ({core.format_reason}); {core.preprocess.describe()}")

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
                with contextlib.suppress(ValueError):
                    self._apply_budget(self.engine, closest)
            state = (letterbox.src_w, letterbox.src_h, node_mb)
            if state == refused and state not in self._frame_warned:  # not just a stale minimum
                self._frame_warned.add(state)
                self.get_logger().warning(
                    f"{letterbox.src_w}x{letterbox.src_h} frames need {self.frame.total_mb:.1f} MB of frame "
                    f"buffers, leaving the model {target:.1f} MB of memory_budget_mb {node_mb:g}: {reason}; "
                    f"the model keeps {self._engine_budget_mb or 0:.1f} MB")
            self._last_refused = state

    def _over_budget(self) -> str | None:
        """Why the model runs above its share of ``memory_budget_mb`` now (None: it fits): the
        engine ran the frame above its budget (``over_budget="run"``: the input size needs
        more), or the node handed the engine its minimum, above the share."""
        over = self.engine.engine_stats().over_budget
        if over is not None:
            return f"{over.describe()}: running {over.overshoot_mb:.1f} MB over it"
        node_mb = self.params["memory_budget_mb"]
        share, given = self._engine_budget(node_mb), self._engine_budget_mb
        if share is not None and given is not None and given > share + 0.01:
            return (f"memory_budget_mb {node_mb:g} leaves the model {share:.1f} MB besides "
                    f"{self.frame.total_mb:.1f} MB of frame buffers, below its minimum: it runs at {given:.1f} MB")
        return None

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
        refusal = self._budget_refusal(updates)
        if refusal is not None:
            return SetParametersResult(successful=False, reason=refusal)
        previous_owner, previous_budget = self.params[OWNER_PARAM], self.params[BUDGET_PARAM]
        merged = {**self.params, **updates}
        new_core = None
        new_mapped: StageExecutor | None = None
        new_auto: AutoPick | None = None
        try:
            self.validate_task_params(merged, updates)
            changed = {name for name in updates if updates[name] != self.params.get(name)}
            if changed & {*ENGINE_PARAMS, *self.core_params}:
                new_core = self._load_core(merged)  # built inside the new budget directly
            if new_core is not None or "mapping" in changed:
                new_mapped, new_auto = self._open_mapped(new_core or self.core, merged)
            elif changed & {"exit_threshold", "deadline_ms"} and self._mapped is not None:
                tune(self._mapped, MappedSettings.from_params(merged))
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
            if new_core is not None:
                new_core.close()
            reason = f"{exc}{self._kept_hint(str(exc), merged, updates)}"
            self._rejected = f"rejected {', '.join(sorted(updates))}: {reason}"
            self.get_logger().error(self._rejected)
            self.publish_diagnostics()
            return SetParametersResult(successful=False, reason=reason)
        old = None
        old_mapped = None
        with self._engine_lock:
            if new_core is not None:
                old, self.core = self.core, new_core
                self._rejected = None
            if new_core is not None or "mapping" in changed:
                old_mapped, self._mapped = self._mapped, new_mapped
                self._auto = new_auto
                self._mapping_generation += 1
                self.core.runner = None if new_mapped is None else new_mapped.run
            self.params = merged
        if old_mapped is not None:
            old_mapped.close()
        if new_core is not None or "mapping" in changed:
            self._log_auto()
        if old is not None and new_core is not None:
            old.close()  # load new -> swap -> close old: two cores only while switching
            release_memory()
            self._log_core(new_core, "switched to")
        if new_core is not None or changed & set(ANNOUNCE_PARAMS):
            self._announce_sizes(self.core, merged)
        if merged[OWNER_PARAM] and merged[OWNER_PARAM] != previous_owner:
            hand = f"; the {previous_budget:g} MB set by hand no longer applies" if previous_budget else ""
            self.get_logger().info(f"{BUDGET_PARAM} is assigned by the budget manager {merged[OWNER_PARAM]} "
                                   f"from now on ({merged[BUDGET_PARAM]:g} MB){hand}")
        return SetParametersResult(successful=True)

    def _budget_refusal(self, updates: dict[str, Any]) -> str | None:
        """Why a change of ``memory_budget_mb``/``budget_owner`` is refused, or None.

        A budget manager pushes a budget with its own name as ``budget_owner`` (one atomic call).
        While the manager named there runs, the budget is its to assign: a value set by hand would
        hold only until its next push, so it is refused, naming where the node's share is set. A
        request that names ``budget_owner`` itself is a push (or a deliberate override, with '').
        Once that manager has stopped, a hand-set value holds again."""
        if OWNER_PARAM in updates and BUDGET_PARAM not in updates:
            return (f"{OWNER_PARAM} is written by the budget manager together with each {BUDGET_PARAM} it "
                    f"assigns; set {BUDGET_PARAM} (with {OWNER_PARAM} '') to set the budget by hand")
        if BUDGET_PARAM not in updates or OWNER_PARAM in updates:
            return None   # not a budget change, or a push
        owner = self.params[OWNER_PARAM]
        if not owner or not self._running(owner):
            return None
        return (f"{BUDGET_PARAM} is assigned by the budget manager {owner} ({OWNER_PARAM}); set this node's "
                f"share there: node_max_mb (a cap) or node_min_mb for '{self.get_name()}' in its node_names, or "
                f"its total_budget_mb; or run it with allocate false and set {BUDGET_PARAM} here")

    def _running(self, fq_name: str) -> bool:
        """A node of that fully qualified name is in the ROS graph."""
        return any(f"{namespace.rstrip('/')}/{name}" == fq_name
                   for name, namespace in self.get_node_names_and_namespaces())

    def _kept_hint(self, reason: str, merged: dict[str, Any], updates: dict[str, Any]) -> str:
        """For a refused model switch: the parameters bound to the previous model that the
        refusal is about and the request left as they were (``model_format`` naming the old
        model's format, its ``classes``, ...), and how to change them with it; else ''."""
        if "model_path" not in updates:
            return ""
        kept = [name for name in MODEL_BOUND_PARAMS if name in self._specs and name not in updates
                and merged[name] != self._specs[name].default
                and (name in reason or (name == "classes" and "class" in reason))]
        if not kept:
            return ""
        values = ", ".join(f"{name} {merged[name]!r}" for name in kept)
        fix = " and ".join(kept)
        return (f" ({values} kept from the previous model: set {fix} in the same set_parameters call as "
                f"model_path{', e.g. model_format auto' if 'model_format' in kept else ''})")

    def validate_task_params(self, merged: dict[str, Any], updates: dict[str, Any]) -> None:
        """Cross-parameter checks of subclasses; raise ValueError with the reason."""

    # ------------------------------------------------------------------ frames
    def _on_image(self, msg: Image | CompressedImage) -> None:
        self.gaps.observe(int(msg.header.stamp.sec) * 1_000_000_000 + int(msg.header.stamp.nanosec))
        with self._state_lock:
            self.stats.received += 1
            replaced, self._pending = self._pending, msg
            if replaced is not None:
                self.stats.dropped += 1
        if replaced is not None:
            self.frames.report(replaced.header, "dropped")
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
            self._wait_for_rate()
            with self._state_lock:
                slot, self._pending = [self._pending], None
                self._wake.clear()
            if slot[0] is None:
                continue
            if not self.params["enabled"]:
                self.frames.report(slot[0].header, "skipped")
                continue
            self._last_take = time.monotonic()
            try:
                self._process_frame(slot)  # takes the message out of the slot: no other reference
            except Exception:  # noqa: BLE001 — the node must keep serving; the reason is reported
                if self._stop.is_set():
                    return
                self.get_logger().error(traceback.format_exc())

    def _wait_for_rate(self) -> None:
        """Wait until ``max_rate_hz`` allows the next frame: its period counted from the last frame
        taken. The frame stays in the mailbox meanwhile, where a newer one replaces it (counted as
        dropped). The cap is re-read every ``RATE_POLL_S``, so a change applies to a wait under way."""
        while not self._stop.is_set():
            rate = float(self.params["max_rate_hz"])
            last = self._last_take
            if rate <= 0.0 or last is None:
                return
            remaining = last + 1.0 / rate - time.monotonic()
            if remaining <= 0.0:
                return
            self._stop.wait(min(remaining, RATE_POLL_S))

    def _process_frame(self, slot: list) -> None:
        """Run one frame; ``slot`` holds the only reference to the message, dropped here (an rgb8
        frame stays alive as the view the core reads)."""
        start = time.perf_counter()
        msg = slot.pop()
        header = msg.header
        try:
            rgb = camera_to_rgb8(msg)  # a view over msg.data for unpadded rgb8; JPEG/PNG decoded
            frame = FrameInfo(header, int(rgb.shape[1]), int(rgb.shape[0]), getattr(msg, "encoding", "rgb8"))
            message_bytes = len(msg.data)
            del msg
            letterbox = self.core.preprocess.plan(frame.height, frame.width)
            self._update_frame_memory(message_bytes, letterbox)  # takes the budget lock: not under the engine's
            with self._engine_lock:
                self.infer(frame, rgb, self.core)
        except Exception as exc:  # noqa: BLE001 - bad message or inference failure: ERROR diagnostic, keep serving
            if not self.context.ok():  # shutting down: publishers are gone, nothing to report
                self._stop.set()
                return
            self.stats.failed += 1
            self.frames.report(header, "failed")
            reason = f"{type(exc).__name__}: {exc}" if not isinstance(exc, ValueError) else str(exc)
            self.report_error(f"bad frame: {reason}")
            return
        self.stats.record((time.perf_counter() - start) * 1e3)
        self.frames.report(header, "processed")
        self._last_input_shape = [1, 3, letterbox.pad_h, letterbox.pad_w]
        self._last_camera = (frame.width, frame.height)
        if not self.budget_profile.knows(size_key(letterbox.pad_h, letterbox.pad_w)):
            self._publish_new_size()
        over = self._over_budget()
        if over is not None:
            if self._last_error is None:  # the profile carries this size's minimum: the manager can grant it now
                self._publish_new_size()
            self.report_error(f"over budget: {over}")
            return
        if self._last_error is not None:
            self._last_error = None
            self.publish_diagnostics()

    def _publish_new_size(self) -> None:
        """A new size class: its minimum goes to the manager now, from a thread of its own — the
        engine may first measure its latency table at that size in a child process, and frames
        keep being served meanwhile (one such publish at a time)."""
        if self._size_publish.locked():
            return

        def work() -> None:
            with self._size_publish:
                if self.context.ok():
                    self.budget_profile.publish()

        threading.Thread(target=work, name=f"{self.get_name()}-size-class", daemon=True).start()

    def announced_minimums(self, core: PerceptionCore, params: dict[str, Any]) -> dict[str, float]:
        """The node's minimum budget per input size class for the cameras in ``camera_sizes``:
        the engine's minimum at that input size plus this node's frame buffers for it, with
        camera messages at the largest of those sizes (messages are charged at the largest size
        seen lately, ``MESSAGE_HOLD_S``). A class the engine cannot size is left to be measured."""
        cameras = [parse_resolution(text) for text in params["camera_sizes"]]
        message_bytes = max((w * h * 3 for w, h in cameras), default=0)
        out: dict[str, float] = {}
        for width, height in cameras:
            box = core.preprocess.plan(height, width)
            try:
                engine_mb = core.engine.min_budget_mb(core.input_shapes(height, width))
            except ValueError as exc:
                self.get_logger().info(f"no announced minimum for {width}x{height} frames: {exc}")
                continue
            mb = engine_mb + self.frame_bytes(message_bytes, box).total_mb
            key = size_key(box.pad_h, box.pad_w)
            out[key] = max(mb, out.get(key, 0.0))
        return out

    def _announce_sizes(self, core: PerceptionCore, params: dict[str, Any]) -> None:
        """Compute ``announced_minimums`` beside the node (an engine may measure a size class in a
        child process) and publish them as soon as they are known."""
        engine = core.engine

        def work() -> None:
            try:
                minimums = self.announced_minimums(core, params)
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
        auto = self._auto
        if self._last_error is not None:
            level, message = diag.ERROR, self._last_error
        elif auto is not None and auto.error:
            level, message = diag.ERROR, auto.error
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
            "frames_missing": self.gaps.lost,
            "frames_out_of_order": self.gaps.out_of_order,
            "rss_mb": process_memory().rss_mb,
            "model_path": self.core.model_path,
            "model_format": self.core.format_name,
            "model_format_reason": self.core.format_reason,
            "preprocess": self.core.preprocess.describe(),
            "last_rejected_change": self._rejected or "",
            "backend": self.params["backend"],
            "memory_budget_mb": self.params["memory_budget_mb"],
            "budget_owner": self.params[OWNER_PARAM],
            "enabled": self.params["enabled"],
            "last_error": self._last_error or "",
        }
        values.update(self.extra_diagnostics())
        values.update(mapped_diagnostics(self._mapped, self.params["mapping"], auto))
        values.update({f"engine.{k}": v for k, v in engine_stats.items()})
        # The model's budget is the node's share; the engine itself runs in it minus the frame buffers.
        values["engine.model_budget_mb"] = typed.memory_budget_mb
        values["engine.memory_budget_mb"] = self.params["memory_budget_mb"] or None
        values["frame_buffers_mb"] = self.frame.total_mb
        values["held_after_load_mb"] = self._held_after_load_mb
        values["engine.predicted_peak_mb"] = None if typed.window is None else to_mb(typed.window.predicted_peak_bytes)
        status = diag.node_status(self, f"{self.task} model", level, message, values)
        try:
            self.diag_pub.publish(diag.make_array(self.get_clock().now().to_msg(), [status]))
        except Exception:  # context already shut down during exit
            if self.context.ok() and not self._stop.is_set():
                raise

    def stop_work(self) -> None:
        """Tell the worker and the profile publisher to stop, without waiting: a container asks all
        its nodes first, so their frames end together and its shutdown waits for the slowest
        one, not for each in turn."""
        if self._stopped_at is None:
            self._stopped_at = time.monotonic()
        self.budget_profile.stop()
        self._stop.set()
        self._wake.set()

    def close(self) -> None:
        """Stop the worker, then free the engine. A worker still inside a frame or a budget
        change after ``WORKER_STOP_S`` keeps the engine: freeing it under a running kernel could
        crash the process, which exits without the worker instead (``unfinished_work``). The
        engine is freed on a thread of its own, waited for ``ENGINE_CLOSE_S``: an engine busy
        sizing the model at an input size (a child process, seconds) frees itself when done, and
        a process exiting meanwhile exits without it."""
        self.stop_work()
        self.budget_profile.close()
        MODEL_NODES_IN_PROCESS.discard(self)
        assert self._stopped_at is not None
        self._worker.join(timeout=max(0.0, self._stopped_at + WORKER_STOP_S - time.monotonic()))
        if self._worker.is_alive():
            return
        self._closer = threading.Thread(target=self._close_core, name=f"{self.get_name()}-close", daemon=True)
        self._closer.start()
        self._closer.join(timeout=max(0.0, self._stopped_at + WORKER_STOP_S + ENGINE_CLOSE_S - time.monotonic()))

    def _close_core(self) -> None:
        with self._engine_lock:
            if self._mapped is not None:
                self._mapped.close()
            self.core.close()

    def unfinished_work(self) -> list[str]:
        """Threads ``close`` could not stop or wait out (run_node exits the process without them)."""
        return [thread.name for thread in (self._worker, self._closer) if thread is not None and thread.is_alive()]
