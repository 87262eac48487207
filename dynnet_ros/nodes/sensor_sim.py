"""Sensor simulator: camera (changing resolution), CameraInfo and LiDAR from one synthetic scene.

Each frame builds the 3D scene once (scene.make_scene), renders the camera image from it and
ray-casts the LiDAR against it, and publishes all three with the same stamp. The camera cycles
through `resolutions`, spending `resolution_period_s` on each.
"""
from __future__ import annotations

import os
import re
import sys
import time

from diagnostic_msgs.msg import DiagnosticArray
from rcl_interfaces.msg import SetParametersResult
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.node import Node
from rclpy.qos import qos_profile_sensor_data
from sensor_msgs.msg import CameraInfo, Image, PointCloud2
from std_msgs.msg import Header

from dynnet_ros.engine.procmem import process_memory
from dynnet_ros.nodes import diagnostics as diag
from dynnet_ros.nodes import scene
from dynnet_ros.nodes.base import ParamSpec, declare, run_node
from dynnet_ros.nodes.convert import array_to_image, xyzi_to_cloud

_RES = re.compile(r"^\s*(\d+)\s*x\s*(\d+)\s*$")


def parse_resolution(text: str) -> tuple[int, int]:
    """'640x480' -> (640, 480); sizes between 16 and 8192."""
    match = _RES.match(str(text))
    if not match:
        raise ValueError(f"resolution must look like 640x480, got {text!r}")
    width, height = int(match.group(1)), int(match.group(2))
    if not (16 <= width <= 8192 and 16 <= height <= 8192):
        raise ValueError(f"resolution {width}x{height} outside 16..8192")
    return width, height


def _check_resolutions(values: list[str]) -> str | None:
    if not values:
        return "resolutions must list at least one WIDTHxHEIGHT"
    try:
        for text in values:
            parse_resolution(text)
    except ValueError as exc:
        return str(exc)
    return None


SPECS = [
    ParamSpec("rate_hz", 10.0, "Camera/LiDAR frame rate.", low=0.2, high=60.0),
    ParamSpec("encoding", "rgb8", "Camera image encoding.", choices=("rgb8", "bgr8")),
    ParamSpec("resolutions", ["320x240", "640x480", "1280x720"], "Camera resolution schedule (WIDTHxHEIGHT), "
              "cycled in order.", kind="string_array", check=_check_resolutions),
    ParamSpec("resolution_period_s", 5.0, "Seconds spent at each resolution.", low=0.1, high=86400.0),
    ParamSpec("camera_frame_id", "camera_optical_frame", "frame_id of the image and CameraInfo."),
    ParamSpec("lidar_frame_id", "lidar", "frame_id of the point cloud."),
    ParamSpec("lidar_beams", 16, "LiDAR vertical beams.", low=1, high=128),
    ParamSpec("lidar_azimuth_steps", 512, "Mean LiDAR horizontal samples per beam (varies +-20% per frame).",
              low=8, high=8192),
    ParamSpec("pedestrians", 4, "Number of pedestrians in the scene.", low=0, high=5),
    ParamSpec("enabled", True, "Publish frames."),
]


#: every parameter sensor_sim declares (also what `dynnet up` and the launch file check)
PARAMETERS = SPECS


class SensorSim(Node):
    def __init__(self) -> None:
        super().__init__("sensor_sim")
        self.params = declare(self, SPECS)
        self._specs = {s.name: s for s in SPECS}
        self.image_pub = self.create_publisher(Image, "camera/image_raw", qos_profile_sensor_data)
        self.info_pub = self.create_publisher(CameraInfo, "camera/camera_info", qos_profile_sensor_data)
        self.cloud_pub = self.create_publisher(PointCloud2, "lidar/points", qos_profile_sensor_data)
        self.diag_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self.add_on_set_parameters_callback(self._on_set)
        self._t0 = time.monotonic()
        self._frame = 0
        self._last_points = 0
        self._render_ms = 0.0
        self._timer = self.create_timer(1.0 / self.params["rate_hz"], self._tick)
        # own group (second executor thread): slow 1280x720 frames must not starve the 1 Hz status
        self.create_timer(1.0, self._publish_diagnostics, callback_group=MutuallyExclusiveCallbackGroup())

    def _on_set(self, parameters):
        updates = {}
        for p in parameters:
            value = list(p.value) if p.name == "resolutions" else p.value
            spec = self._specs.get(p.name)
            reason = spec.validate(value) if spec else None
            if reason:
                return SetParametersResult(successful=False, reason=reason)
            updates[p.name] = value
        self.params.update(updates)
        if "rate_hz" in updates:
            self._timer.cancel()
            self.destroy_timer(self._timer)
            self._timer = self.create_timer(1.0 / updates["rate_hz"], self._tick)
        return SetParametersResult(successful=True)

    def current_resolution(self, elapsed: float) -> tuple[int, int]:
        schedule = self.params["resolutions"]
        index = int(elapsed // self.params["resolution_period_s"]) % len(schedule)
        return parse_resolution(schedule[index])

    def _tick(self) -> None:
        try:
            self._publish_frame()
        except Exception:  # noqa: BLE001 — a tick racing Ctrl-C finds the context gone
            if self.context.ok():
                raise

    def _publish_frame(self) -> None:
        if not self.params["enabled"]:
            return
        start = time.perf_counter()
        elapsed = time.monotonic() - self._t0
        width, height = self.current_resolution(elapsed)
        world = scene.make_scene(elapsed, count=int(self.params["pedestrians"]))
        rgb, _ = scene.render_camera(world, width, height, frame=self._frame)
        base_steps = int(self.params["lidar_azimuth_steps"])
        steps = max(8, int(base_steps * (0.8 + 0.4 * ((self._frame * 37) % 11) / 10.0)))
        points = scene.scan_lidar(world, beams=int(self.params["lidar_beams"]), azimuth_steps=steps,
                                  seed=self._frame)
        stamp = self.get_clock().now().to_msg()
        cam_header = Header(stamp=stamp, frame_id=self.params["camera_frame_id"])
        encoding = self.params["encoding"]
        image = rgb if encoding == "rgb8" else rgb[:, :, ::-1]
        self.info_pub.publish(self._camera_info(cam_header, width, height))
        self.image_pub.publish(array_to_image(image, encoding, cam_header))
        self.cloud_pub.publish(xyzi_to_cloud(points, Header(stamp=stamp, frame_id=self.params["lidar_frame_id"])))
        self._frame += 1
        self._last_points = len(points)
        self._resolution = (width, height)
        self._render_ms = (time.perf_counter() - start) * 1e3

    @staticmethod
    def _camera_info(header: Header, width: int, height: int) -> CameraInfo:
        k = scene.camera_matrix(width, height)
        info = CameraInfo(header=header, width=width, height=height, distortion_model="plumb_bob")
        info.d = [0.0] * 5
        info.k = [float(v) for v in k.ravel()]
        info.r = [1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0]
        info.p = [float(k[0, 0]), 0.0, float(k[0, 2]), 0.0, 0.0, float(k[1, 1]), float(k[1, 2]), 0.0,
                  0.0, 0.0, 1.0, 0.0]
        return info

    def _publish_diagnostics(self) -> None:
        res = getattr(self, "_resolution", None)
        values = {
            "pid": os.getpid(),
            "frames_published": self._frame,
            "camera_resolution": f"{res[0]}x{res[1]}" if res else "",
            "encoding": self.params["encoding"],
            "lidar_points": self._last_points,
            "frame_time_ms": self._render_ms,
            "rss_mb": process_memory().rss_mb,
        }
        level, message = (diag.OK, "publishing") if self.params["enabled"] else (diag.OK, "disabled")
        status = diag.make_status(f"{self.get_name()}: sensor simulator", self.get_fully_qualified_name(),
                                  level, message, values)
        try:
            self.diag_pub.publish(diag.make_array(self.get_clock().now().to_msg(), [status]))
        except Exception:  # noqa: BLE001 — racing Ctrl-C
            if self.context.ok():
                raise


def main(args: list[str] | None = None) -> int:
    return run_node(SensorSim, args)


if __name__ == "__main__":
    sys.exit(main())
