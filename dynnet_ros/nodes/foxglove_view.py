"""Live view node: the graph's camera, lane mask, depth image and pedestrian boxes on a Foxglove
WebSocket bound to 127.0.0.1, so Foxglove Studio shows them without a ROS install.

A thin adapter over ``dynnet_ros.view``: it subscribes (sensor-data QoS) to camera/image_raw,
camera/camera_info, lane/mask, lane/labels, depth/image and pedestrian/markers, converts each
message with ``view.convert`` and logs it under the message's header stamp (as the Foxglove
timestamp and the log time), frame_id kept. The Foxglove topics are the resolved ROS names,
except the boxes: ImageAnnotations in image pixels on ``pedestrian/annotations``. Nothing is
converted while no client is subscribed to a channel.

A port that cannot be bound is an ERROR (log line and /diagnostics) and retried every
BIND_RETRY_S while the node keeps running, so a busy port never stops the graph.
"""
from __future__ import annotations

import os
import sys
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import psutil
from diagnostic_msgs.msg import DiagnosticArray
from rcl_interfaces.msg import SetParametersResult
from rclpy.node import Node
from rclpy.qos import qos_profile_sensor_data
from sensor_msgs.msg import CameraInfo, Image
from visualization_msgs.msg import Marker, MarkerArray

from dynnet_ros.nodes import diagnostics as diag
from dynnet_ros.nodes.base import ParamSpec, declare, run_node, steady_timer
from dynnet_ros.nodes.convert import image_to_array
from dynnet_ros.sim.scene import camera_matrix
from dynnet_ros.view import DEFAULT_PORT
from dynnet_ros.view.cameras import CameraModels
from dynnet_ros.view.convert import (
    Stamp,
    box_annotations,
    camera_calibration,
    depth_image,
    mask_image,
    plane_boxes,
    raw_image,
)
from dynnet_ros.view.server import LOOPBACK_HOST, LiveView, ViewTopics

#: seconds between attempts to bind a port that was busy
BIND_RETRY_S = 2.0
# The node imports neither the engine nor the perception cores: it runs beside the model nodes and
# should cost little memory and start fast.

PARAMETERS = [
    ParamSpec("port", DEFAULT_PORT, f"TCP port of the Foxglove WebSocket on {LOOPBACK_HOST} (0 = any free port; "
              "the bound one is logged and in /diagnostics). Fixed once the node runs.", low=0, high=65535),
]


def _stamp(header) -> Stamp:
    return Stamp(int(header.stamp.sec), int(header.stamp.nanosec))


def marker_outlines(markers: MarkerArray) -> tuple[list[np.ndarray], list[str], Any]:
    """The pedestrian markers' box outlines on the z = 1 plane (x/z, y/z per point), their labels
    (the TEXT marker with the box's id) and the array's header (its first marker's)."""
    texts = {m.id: m.text for m in markers.markers if m.type == Marker.TEXT_VIEW_FACING}
    outlines, labels = [], []
    for m in markers.markers:
        if m.type == Marker.LINE_STRIP and m.points:
            outlines.append(np.array([[p.x / p.z, p.y / p.z] for p in m.points]))
            labels.append(texts.get(m.id, ""))
    return outlines, labels, markers.markers[0].header if markers.markers else None


class FoxgloveView(Node):
    """Subscriptions in, Foxglove channels out; callbacks share the node's default (mutually
    exclusive) group, so the counters and the camera models see one callback at a time."""

    def __init__(self, **options: Any) -> None:
        super().__init__("foxglove_view", **options)
        self.params = declare(self, PARAMETERS)
        self.cameras = CameraModels(camera_matrix)
        self.view = LiveView(ViewTopics(
            camera=self.resolve_topic_name("camera/image_raw"),
            calibration=self.resolve_topic_name("camera/camera_info"),
            lane_mask=self.resolve_topic_name("lane/mask"),
            lane_labels=self.resolve_topic_name("lane/labels"),
            depth=self.resolve_topic_name("depth/image"),
            pedestrians=self.resolve_topic_name("pedestrian/annotations")))
        self.logged: Counter[str] = Counter()  # messages logged per Foxglove topic
        self.bad: Counter[str] = Counter()  # messages that could not be converted, per ROS topic
        self.last_error = ""
        self.bind_error: str | None = None
        self._retry = None
        qos = qos_profile_sensor_data
        self._show_camera = self._guarded("camera/image_raw", self._camera_image)
        self.create_subscription(Image, "camera/image_raw", self._on_camera, qos)
        self.create_subscription(CameraInfo, "camera/camera_info",
                                 self._guarded("camera/camera_info", self._on_camera_info), qos)
        self.create_subscription(Image, "lane/mask", self._guarded("lane/mask", self._on_mask), qos)
        self.create_subscription(Image, "lane/labels", self._guarded("lane/labels", self._on_labels), qos)
        self.create_subscription(Image, "depth/image", self._guarded("depth/image", self._on_depth), qos)
        self.create_subscription(MarkerArray, "pedestrian/markers",
                                 self._guarded("pedestrian/markers", self._on_markers), qos)
        self.diag_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self.add_on_set_parameters_callback(self._on_set)
        self._bind()
        if self.bind_error is not None:
            self._retry = steady_timer(self, BIND_RETRY_S, self._bind)
        steady_timer(self, 1.0, self._publish_diagnostics)

    # ------------------------------------------------------------------ server

    def _bind(self) -> None:
        port = int(self.params["port"])
        error = self.view.serve(port)
        if error is None:
            if self._retry is not None:
                self.destroy_timer(self._retry)
                self._retry = None
            self.bind_error = None
            self.get_logger().info(f"serving the live view on {self.view.url} (Foxglove: Open connection -> "
                                   "Foxglove WebSocket)")
        elif self.bind_error is None:  # said once; the retries stay quiet until one succeeds
            self.bind_error = error
            self.get_logger().error(f"cannot serve the live view on {LOOPBACK_HOST}:{port}: {error}; retrying "
                                    f"every {BIND_RETRY_S:g} s (the rest of the graph is unaffected)")

    def _on_set(self, parameters) -> SetParametersResult:
        for p in parameters:
            if p.name == "port" and p.value != self.params["port"]:
                return SetParametersResult(successful=False, reason="port is fixed once the node runs; "
                                                                    "restart the node to serve on another port")
        return SetParametersResult(successful=True)

    def close(self) -> None:
        self.view.close()

    # ------------------------------------------------------------------ messages

    def _guarded(self, topic: str, convert: Callable[[Any], None]) -> Callable[[Any], None]:
        """A callback that counts and reports a message it cannot convert instead of raising."""
        def callback(msg: Any) -> None:
            try:
                convert(msg)
            except ValueError as exc:
                self.bad[topic] += 1
                self.last_error = f"{topic}: {exc}"
                self.get_logger().warning(f"not shown: {self.last_error}", throttle_duration_sec=5.0)
        return callback

    def _log(self, channel, message, stamp: Stamp) -> None:
        channel.log(message, log_time=stamp.ns)
        self.logged[channel.topic()] += 1

    def _on_camera(self, msg: Image) -> None:
        # every frame's size is kept, shown or not: the boxes of its stamp are drawn with it
        self.cameras.frame(_stamp(msg.header).ns, int(msg.width), int(msg.height))
        if self.view.camera.has_sinks():
            self._show_camera(msg)

    def _camera_image(self, msg: Image) -> None:
        stamp = _stamp(msg.header)
        self._log(self.view.camera, raw_image(image_to_array(msg), msg.encoding, stamp, msg.header.frame_id), stamp)

    def _on_camera_info(self, msg: CameraInfo) -> None:
        self.cameras.intrinsics(int(msg.width), int(msg.height), msg.k)
        if self.view.calibration.has_sinks():
            stamp = _stamp(msg.header)
            self._log(self.view.calibration, camera_calibration(
                msg.width, msg.height, msg.k, stamp, msg.header.frame_id, distortion_model=msg.distortion_model,
                d=msg.d, r=msg.r, p=msg.p), stamp)

    def _on_mask(self, msg: Image) -> None:
        if self.view.lane_mask.has_sinks():
            stamp = _stamp(msg.header)
            self._log(self.view.lane_mask, mask_image(image_to_array(msg), stamp, msg.header.frame_id), stamp)

    def _on_labels(self, msg: Image) -> None:
        if self.view.lane_labels.has_sinks():
            stamp = _stamp(msg.header)
            self._log(self.view.lane_labels, raw_image(image_to_array(msg), msg.encoding, stamp, msg.header.frame_id),
                      stamp)

    def _on_depth(self, msg: Image) -> None:
        if not self.view.depth.has_sinks():
            return
        stamp = _stamp(msg.header)
        depth = image_to_array(msg)
        if msg.encoding == "32FC1":  # metres (depth_node) -> millimetres
            image = depth_image(depth, stamp, msg.header.frame_id)
        elif msg.encoding in ("16UC1", "mono16"):  # already millimetres (REP 118)
            image = raw_image(depth, "16UC1", stamp, msg.header.frame_id)
        else:
            raise ValueError(f"depth image encoding {msg.encoding!r} is neither 32FC1 (m) nor 16UC1 (mm)")
        self._log(self.view.depth, image, stamp)

    def _on_markers(self, msg: MarkerArray) -> None:
        if not self.view.pedestrians.has_sinks():
            return
        outlines, labels, header = marker_outlines(msg)
        if header is None:
            return
        stamp = _stamp(header)
        size = self.cameras.size_at(stamp.ns)
        if size is None and outlines:
            raise ValueError("boxes arrived before any camera frame: their pixel size is unknown")
        boxes = plane_boxes(outlines, self.cameras.k_for(*size)) if outlines and size else np.zeros((0, 4))
        self._log(self.view.pedestrians, box_annotations(boxes, labels, stamp), stamp)

    # ------------------------------------------------------------------ diagnostics

    def _publish_diagnostics(self) -> None:
        port = int(self.params["port"])
        if self.bind_error is None:
            level, message = diag.OK, f"serving {self.view.url}"
        else:
            level, message = diag.ERROR, f"cannot bind {LOOPBACK_HOST}:{port}: {self.bind_error}; retrying"
        values: dict[str, Any] = {"pid": os.getpid(), "host": LOOPBACK_HOST, "port": self.view.port or port,
                                  "url": self.view.url or "", "last_error": self.last_error,
                                  "rss_mb": psutil.Process().memory_info().rss / 2**20}
        values.update({f"logged.{topic}": count for topic, count in sorted(self.logged.items())})
        values.update({f"not_shown.{topic}": count for topic, count in sorted(self.bad.items())})
        diag.publish(self, self.diag_pub, [diag.node_status(self, "Foxglove live view", level, message, values)])


def main(args: list[str] | None = None) -> int:
    return run_node(FoxgloveView, args)


if __name__ == "__main__":
    sys.exit(main())
