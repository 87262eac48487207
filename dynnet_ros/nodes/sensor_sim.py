"""Sensor simulator: camera (changing resolution), CameraInfo and LiDAR from one synthetic scene.

Each frame builds the 3D scene once (sim/frames.render_frame: the scene at the time since start
and the seed), renders the camera image from it and ray-casts the LiDAR against it, and publishes
all three with the same stamp. The camera cycles through `resolutions`, spending
`resolution_period_s` on each. `dynnet sim --record` writes the same frames into a bag.
"""
from __future__ import annotations

import os
import sys
import time
from typing import Any

from diagnostic_msgs.msg import DiagnosticArray
from rcl_interfaces.msg import SetParametersResult
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.node import Node
from rclpy.qos import qos_profile_sensor_data
from sensor_msgs.msg import CameraInfo, Image, PointCloud2
from std_msgs.msg import Header

from dynnet_ros.nodes import diagnostics as diag
from dynnet_ros.nodes.base import SENSOR_QOS_OVERRIDES, ParamSpec, declare, run_node, steady_timer
from dynnet_ros.nodes.convert import array_to_image, xyzi_to_cloud
from dynnet_ros.procmem import process_memory
from dynnet_ros.sim.frames import SimSettings, camera_info_fields, parse_resolution, render_frame

DEFAULTS = SimSettings()


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
    ParamSpec("rate_hz", DEFAULTS.rate_hz, "Camera/LiDAR frame rate.", low=0.2, high=60.0),
    ParamSpec("encoding", DEFAULTS.encoding, "Camera image encoding.", choices=("rgb8", "bgr8")),
    ParamSpec("resolutions", list(DEFAULTS.resolutions), "Camera resolution schedule (WIDTHxHEIGHT), "
              "cycled in order.", kind="string_array", check=_check_resolutions),
    ParamSpec("resolution_period_s", DEFAULTS.resolution_period_s, "Seconds spent at each resolution.",
              low=0.1, high=86400.0),
    ParamSpec("camera_frame_id", DEFAULTS.camera_frame_id, "frame_id of the image and CameraInfo."),
    ParamSpec("lidar_frame_id", DEFAULTS.lidar_frame_id, "frame_id of the point cloud."),
    ParamSpec("lidar_beams", DEFAULTS.lidar_beams, "LiDAR vertical beams.", low=1, high=128),
    ParamSpec("lidar_azimuth_steps", DEFAULTS.lidar_azimuth_steps,
              "Mean LiDAR horizontal samples per beam (varies +-20% per frame).", low=8, high=8192),
    ParamSpec("pedestrians", DEFAULTS.pedestrians, "Number of pedestrians in the scene.", low=0, high=5),
    ParamSpec("seed", DEFAULTS.seed, "Scene seed: where the pedestrians are along their walk, and the LiDAR "
              "noise (dynnet sim --record --seed N writes the same scenes).", low=0, high=2**31 - 1),
    ParamSpec("enabled", True, "Publish frames."),
]


#: every parameter sensor_sim declares (also what `dynnet up` and the launch file check)
PARAMETERS = SPECS


class SensorSim(Node):
    def __init__(self, **options: Any) -> None:
        super().__init__("sensor_sim", **options)
        self.params = declare(self, SPECS)
        self._specs = {s.name: s for s in SPECS}
        self.image_pub = self.create_publisher(Image, "camera/image_raw", qos_profile_sensor_data,
                                               qos_overriding_options=SENSOR_QOS_OVERRIDES)
        self.info_pub = self.create_publisher(CameraInfo, "camera/camera_info", qos_profile_sensor_data,
                                               qos_overriding_options=SENSOR_QOS_OVERRIDES)
        self.cloud_pub = self.create_publisher(PointCloud2, "lidar/points", qos_profile_sensor_data,
                                               qos_overriding_options=SENSOR_QOS_OVERRIDES)
        self.diag_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self.add_on_set_parameters_callback(self._on_set)
        self._t0 = time.monotonic()
        self._frame = 0
        self._last_points = 0
        self._render_ms = 0.0
        self._timer = self.create_timer(1.0 / self.params["rate_hz"], self._tick)
        # own group (second executor thread): slow 1280x720 frames must not starve the 1 Hz status
        steady_timer(self, 1.0, self._publish_diagnostics, MutuallyExclusiveCallbackGroup())

    def _on_set(self, parameters):
        updates: dict[str, Any] = {}
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

    def settings(self) -> SimSettings:
        """The frame-shaping parameters in force, as the ROS-free renderer takes them."""
        p = self.params
        return SimSettings(rate_hz=p["rate_hz"], encoding=p["encoding"], resolutions=tuple(p["resolutions"]),
                           resolution_period_s=p["resolution_period_s"], camera_frame_id=p["camera_frame_id"],
                           lidar_frame_id=p["lidar_frame_id"], lidar_beams=int(p["lidar_beams"]),
                           lidar_azimuth_steps=int(p["lidar_azimuth_steps"]), pedestrians=int(p["pedestrians"]),
                           seed=int(p["seed"]))

    def _tick(self) -> None:
        try:
            self._publish_frame()
        except Exception:  # a tick racing Ctrl-C finds the context gone
            if self.context.ok():
                raise

    def _publish_frame(self) -> None:
        if not self.params["enabled"]:
            return
        start = time.perf_counter()
        settings = self.settings()
        frame = render_frame(settings, self._frame, time.monotonic() - self._t0)
        stamp = self.get_clock().now().to_msg()
        cam_header = Header(stamp=stamp, frame_id=settings.camera_frame_id)
        info = CameraInfo(header=cam_header, width=frame.width, height=frame.height,
                          **camera_info_fields(frame.camera_matrix))
        self.info_pub.publish(info)
        self.image_pub.publish(array_to_image(frame.image, settings.encoding, cam_header))
        self.cloud_pub.publish(xyzi_to_cloud(frame.points, Header(stamp=stamp, frame_id=settings.lidar_frame_id)))
        self._frame += 1
        self._last_points = len(frame.points)
        self._resolution = (frame.width, frame.height)
        self._render_ms = (time.perf_counter() - start) * 1e3

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
        diag.publish(self, self.diag_pub, [diag.node_status(self, "sensor simulator", level, message, values)])


def main(args: list[str] | None = None) -> int:
    return run_node(SensorSim, args)


if __name__ == "__main__":
    sys.exit(main())
