"""The shared base of the lane, pedestrian and depth nodes: ROS adapters over a serving core.

The serving core (``perception.serving``) does the work: the frame mailbox and its worker, the
budget split between frame buffers and the engine, the mapped stages and their ``mapping: auto``
re-picks, the size-class announcements, the camera intrinsics, the counters and status. This
node declares the parameters (typed descriptors, validation, one ``set_parameters`` request
applied at once), subscribes to the camera, parks each message in the core's mailbox, decodes it
on the core's worker, publishes the task's results (header copied) and the core's status on
/diagnostics, and takes part in the budget protocol (docs/budget.md).

With ``cameras`` (``camera_inputs``) one node serves several cameras with its one core: a
subscription pair per camera (image and CameraInfo, under the camera's namespace), outputs per
camera under the same namespace, each result with its own frame's header, and one diagnostic
status per camera beside the node's own.

Threading model: the subscription callback only parks the newest message (an older unprocessed
one is dropped and counted) and one worker runs the model on whatever is newest, so latency stays
bounded by one inference, never by a queue. An rgb8 frame reaches the core as a view over the
message data, so the message being processed is one of the buffers charged to the node's budget
(docs/budget.md, "node memory").
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Generic

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray
from rcl_interfaces.msg import SetParametersResult
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.node import Node
from rclpy.qos import QoSHistoryPolicy, QoSProfile, qos_profile_sensor_data
from sensor_msgs.msg import CameraInfo, CompressedImage, Image
from std_msgs.msg import String

from dynnet_ros.budget.protocol import BUDGET_PARAM, BUDGETS_TOPIC, OWNER_PARAM, unit_budget
from dynnet_ros.compressed import compressed_topic
from dynnet_ros.engine.engine import Engine
from dynnet_ros.nodes import diagnostics as diag
from dynnet_ros.nodes.base import SENSOR_QOS_OVERRIDES, AtomicParameterService, ParamSpec, declare, steady_timer
from dynnet_ros.nodes.budget_profile import ProfilePublisher, prewarm_runtime
from dynnet_ros.nodes.camera_inputs import CameraInput, camera_inputs, per_camera
from dynnet_ros.nodes.convert import camera_to_rgb8
from dynnet_ros.nodes.frame_report import FrameReporter
from dynnet_ros.nodes.model_params import common_specs
from dynnet_ros.perception.budget_split import FrameCosts
from dynnet_ros.perception.core import PerceptionCore
from dynnet_ros.perception.frame_stats import FrameStats
from dynnet_ros.perception.mailbox import Arrival
from dynnet_ros.perception.serving import CAMERA, CoreT, Decoded, FrameInfo, Publish, ServingCore, ServingTask

# Outputs: reliable (so RViz / `ros2 topic echo` defaults receive them, and best-effort
# subscribers too), keep-last 2 so a slow subscriber never builds a queue.
OUTPUT_QOS = QoSProfile(depth=2)
# Camera input: the sensor-data profile (best effort, volatile: matches any camera driver) with a
# history of one. The node only ever processes the newest frame, and each frame the DDS reader
# keeps is a message-sized buffer charged to the node's budget.
IMAGE_QOS = QoSProfile(history=QoSHistoryPolicy.KEEP_LAST, depth=1, reliability=qos_profile_sensor_data.reliability,
                       durability=qos_profile_sensor_data.durability)
#: the core's status levels as diagnostic levels
LEVELS = {"ok": diag.OK, "warn": diag.WARN, "error": diag.ERROR}


def stamp_ns(header: Any) -> int:
    return int(header.stamp.sec) * 1_000_000_000 + int(header.stamp.nanosec)


def decode(msg: Image | CompressedImage) -> Decoded:
    """A camera message as the core serves it: a view over msg.data for unpadded rgb8, JPEG/PNG decoded."""
    return Decoded(camera_to_rgb8(msg), msg.header, getattr(msg, "encoding", "rgb8"), len(msg.data))


def publish_all(messages: list[tuple[Any, Any]]) -> Publish:
    """What publishes ``messages`` ((publisher, message) pairs) in order, when called."""
    def publish() -> None:
        for publisher, message in messages:
            publisher.publish(message)
    return publish


class ModelNode(Node, ABC, Generic[CoreT]):
    """Camera frames in, one model run per newest frame, task-specific outputs out."""

    task = "model"
    #: the zoo models' stride: what the first frame's memory is estimated with before the core loads
    input_multiple = 32
    #: task parameters whose change builds a new core (besides ``serving.ENGINE_PARAMS``)
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
        params = declare(self, self._specs.values())
        self.cameras: list[CameraInput] = camera_inputs(params["cameras"])
        named = per_camera(params["cameras"])
        if named:
            specs = [spec for camera in self.cameras for spec in self.camera_specs(camera, params)]
            self._specs.update({spec.name: spec for spec in specs})
            params.update(declare(self, specs))
        #: each camera's outputs (``create_outputs``), by camera name
        self.outputs: dict[str, Any] = {camera.name: self.create_outputs(camera) for camera in self.cameras}
        # Model-independent library state (the engine's modules) is in before the
        # core's budget baseline, like rclpy: it is the same for every model and stays when a model
        # is unloaded.
        prewarm_runtime()
        costs = FrameCosts(self.extra_input_channels, self.output_bytes_per_pixel, self.output_const_bytes,
                           self.input_multiple)
        defaults = {name: spec.default for name, spec in self._specs.items()}
        task: ServingTask[CoreT] = ServingTask(self.task, self.build_core, decode, self.infer,
                                               self.validate_task_params, self.core_params, defaults, costs)
        self.serving = ServingCore(task, params, self.get_logger(), name=node_name, outcome=self._report_frame,
                                   status_changed=self.publish_diagnostics, alive=self.context.ok,
                                   sources=[camera.name for camera in self.cameras] if named else None)
        self.diag_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        # sensor callbacks and the diagnostics timer run beside the parameter services (see run_node)
        self.io_group = MutuallyExclusiveCallbackGroup()
        self.image_subscriptions: dict[str, Any] = {}
        self.create_sensor_inputs()
        self.frames = FrameReporter(self, {name: sub.topic_name for name, sub in self.image_subscriptions.items()})
        self.create_subscription(String, BUDGETS_TOPIC, self._on_budgets, 10, callback_group=self.io_group)
        self.add_on_set_parameters_callback(self._on_set_parameters)
        steady_timer(self, 1.0, self.publish_diagnostics, self.io_group)
        # latency-vs-budget profile for the budget manager (docs/budget.md)
        serving = self.serving
        self.budget_profile = ProfilePublisher(self, lambda: serving.engine,
                                               lambda: serving.params[BUDGET_PARAM] or None, serving.baseline,
                                               frame_mb=lambda: serving.frame_mb, size=serving.size_class,
                                               units=serving.mapped.claimed_units,
                                               held=serving.held_beside_neighbours)
        serving.start(self.budget_profile)

    # ------------------------------------------------------------------ the core's state, for the tasks
    @property
    def params(self) -> dict[str, Any]:
        return self.serving.params

    @property
    def core(self) -> PerceptionCore:
        return self.serving.core

    @property
    def engine(self) -> Engine:
        """The core's Engine: what budgets, size-class minimums and calibration act on."""
        return self.serving.engine

    @property
    def stats(self) -> FrameStats:
        return self.serving.stats

    def intrinsics_for(self, frame: FrameInfo) -> np.ndarray | None:
        """K for the frame's camera and image size: an exact CameraInfo match, else the latest
        one rescaled."""
        return self.serving.intrinsics[frame.source].for_size(frame.width, frame.height)

    def own_memory_mb(self) -> float:
        return self.serving.own_memory_mb()

    def held_beside_neighbours(self) -> tuple[float, float] | None:
        return self.serving.held_beside_neighbours()

    # ------------------------------------------------------------------ subclass hooks
    def create_sensor_inputs(self) -> None:
        """Subscribe to each camera and its CameraInfo (a node with more sensors adds its own here,
        so every sensor input exists once the node shows up in the graph)."""
        compressed = self.params["image_transport"] == "compressed"
        for camera in self.cameras:
            name = camera.name
            self.image_subscriptions[name] = self.create_subscription(
                CompressedImage if compressed else Image,
                compressed_topic(self.resolve_topic_name(camera.image_topic)) if compressed else camera.image_topic,
                lambda msg, name=name: self._on_image(msg, name), IMAGE_QOS, callback_group=self.io_group,
                qos_overriding_options=SENSOR_QOS_OVERRIDES)
            self.create_subscription(CameraInfo, camera.info_topic,
                                     lambda msg, name=name: self._on_camera_info(msg, name), qos_profile_sensor_data,
                                     callback_group=self.io_group, qos_overriding_options=SENSOR_QOS_OVERRIDES)

    @abstractmethod
    def create_outputs(self, camera: CameraInput) -> Any:
        """Create ``camera``'s output publishers (``camera.output(topic)`` names each) and return
        them; ``infer`` finds them in ``self.outputs[frame.source]``. Runs before the model loads
        and before any subscription: a frame can never find its publisher missing, and
        subscribers have matched the outputs (discovery runs during the load) by the time the
        first frame is answered."""

    def camera_specs(self, camera: CameraInput, params: dict[str, Any]) -> list[ParamSpec]:
        """Parameters declared once per named camera, named ``<camera name>.<parameter>``
        (``params``: the node's own, for their defaults)."""
        return []

    @abstractmethod
    def build_core(self, path: str, params: dict[str, Any], memory_budget_mb: float | None) -> CoreT:
        """The task's perception core for ``path`` and the node's parameters (ValueError with the
        reason when the model fits no format, the named format, or the options)."""

    @abstractmethod
    def infer(self, frames: list[FrameInfo], rgbs: list[np.ndarray], core: CoreT) -> Publish:
        """Run the core on a batch of HxWx3 uint8 RGB frames (one per camera at most) and build
        each frame's output messages, its header copied from its ``FrameInfo``; return what
        publishes them on each frame's camera outputs (``publish_all``), which the serving core
        runs in the order batches were taken (another batch may be in the engine meanwhile)."""

    def validate_task_params(self, merged: dict[str, Any], updates: dict[str, Any]) -> None:
        """Cross-parameter checks of subclasses; raise ValueError with the reason."""

    def extra_diagnostics(self) -> dict[str, Any]:
        return {}

    # ------------------------------------------------------------------ callbacks
    def _on_image(self, msg: Image | CompressedImage, camera: str = CAMERA) -> None:
        self.serving.offer(camera, stamp_ns(msg.header), msg.header.frame_id, msg)

    def _report_frame(self, arrival: Arrival, outcome: str) -> None:
        self.frames.report(arrival.source, arrival.stamp_ns, outcome)

    def _on_camera_info(self, msg: CameraInfo, camera: str = CAMERA) -> None:
        try:
            self.serving.intrinsics[camera].update(int(msg.width), int(msg.height), msg.k)
        except ValueError as exc:
            of = "" if camera == CAMERA else f" of {camera}"
            self.get_logger().warning(f"ignoring CameraInfo{of}: {exc}", throttle_duration_sec=5.0)

    def _on_budgets(self, msg: String) -> None:
        """A budget report: per-unit memory for this node (``mapping: auto`` re-picks beside the frame loop)."""
        try:
            limits = unit_budget(msg.data, self.get_fully_qualified_name()) or {}
        except ValueError as exc:
            self.get_logger().warning(f"ignoring budget report: {exc}", throttle_duration_sec=10.0)
            return
        self.serving.set_unit_limits(limits)

    def _on_set_parameters(self, parameters) -> SetParametersResult:
        updates: dict[str, Any] = {}
        for param in parameters:
            spec = self._specs.get(param.name)
            value = param.value
            if spec is not None and spec.type_key in ("double_array", "string_array"):
                value = list(value)
            reason = spec.validate(value) if spec is not None else None
            if reason:
                return SetParametersResult(successful=False, reason=reason)
            updates[param.name] = value
        refusal = self._budget_refusal(updates)
        if refusal is not None:
            return SetParametersResult(successful=False, reason=refusal)
        try:
            self.serving.apply(updates)
        except ValueError as exc:
            return SetParametersResult(successful=False, reason=str(exc))
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
        if not owner or not any(f"{namespace.rstrip('/')}/{name}" == owner
                                for name, namespace in self.get_node_names_and_namespaces()):
            return None
        return (f"{BUDGET_PARAM} is assigned by the budget manager {owner} ({OWNER_PARAM}); set this node's "
                f"share there: node_max_mb (a cap) or node_min_mb for '{self.get_name()}' in its node_names, or "
                f"its total_budget_mb; or run it with allocate false and set {BUDGET_PARAM} here")

    # ------------------------------------------------------------------ diagnostics and shutdown
    def report_error(self, message: str) -> None:
        """ERROR diagnostic now (logged once per episode); the next good frame clears it."""
        self.serving.report_error(message)

    def publish_diagnostics(self) -> None:
        """The node's status, then one per named camera (``<node>: <task> camera <name>``)."""
        status = self.serving.status(self.extra_diagnostics())
        messages = [diag.node_status(self, f"{self.task} model", LEVELS[status.level], status.message,
                                     status.values)]
        if self.serving.per_camera:
            for camera in self.cameras:
                own = self.serving.camera_status(camera.name)
                messages.append(diag.node_status(self, f"{self.task} camera {camera.name}", LEVELS[own.level],
                                                 own.message, {**own.values, "topic": camera.image_topic}))
        try:
            self.diag_pub.publish(diag.make_array(self.get_clock().now().to_msg(), messages))
        except Exception:  # context already shut down during exit
            if self.context.ok() and not self.serving.worker.stopped:
                raise

    def stop_work(self) -> None:
        """Tell the worker and the profile publisher to stop, without waiting: a container asks all
        its nodes first, so their frames end together and its shutdown waits for the slowest
        one, not for each in turn."""
        self.budget_profile.stop()
        self.serving.stop()

    def close(self) -> None:
        """Stop the worker, then free the engine (``ServingCore.close``: a frame that does not end
        within ``WORKER_STOP_S`` keeps it, and the process exits without the worker)."""
        self.stop_work()
        self.budget_profile.close()
        self.serving.close()

    def unfinished_work(self) -> list[str]:
        """Threads ``close`` could not stop or wait out (run_node exits the process without them)."""
        return self.serving.unfinished_work()
