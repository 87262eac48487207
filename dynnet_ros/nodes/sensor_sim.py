"""Sensor simulator: cameras (changing resolution), their CameraInfo and a LiDAR from one synthetic scene.

Each frame builds the 3D scene (sim/frames: the scene at the time since start and the seed),
renders the camera image from it and ray-casts the LiDAR against it. With no ``cameras`` listed
there is one camera, ``camera/image_raw`` and ``camera/camera_info`` (frame_id
``camera_frame_id``), published with the LiDAR in one tick under one stamp. With ``cameras``
each NAME is a camera of its own: ``NAME/image_raw``, ``NAME/camera_info`` (frame_id
``NAME_optical_frame``), looking ``NAME.yaw_deg`` from forward, on a timer at ``NAME.rate_hz``;
all see the same scene (sim/rig.py, sim/scene.py). There is one LiDAR on ``lidar/points`` at
``rate_hz``, covering every camera's view; it is published in the tick of the first camera at
``rate_hz`` (same scene, same stamp), or on a timer of its own when no camera runs at that rate.
Every frame is rendered in bands (sim/scene.py), one camera at a time: the renderer's memory does
not grow with the number of cameras (their publishers' buffers do), the CPU time does (one render
per camera frame). The cameras cycle
through ``resolutions``, spending ``resolution_period_s`` on each. ``dynnet sim --record``
writes the single camera's frames into a bag.
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from typing import Any

from diagnostic_msgs.msg import DiagnosticArray
from rcl_interfaces.msg import SetParametersResult
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.node import Node
from rclpy.publisher import Publisher
from rclpy.qos import qos_profile_sensor_data
from rclpy.timer import Timer
from sensor_msgs.msg import CameraInfo, Image, PointCloud2
from std_msgs.msg import Header

from dynnet_ros.graph_transport import use_image_profile
from dynnet_ros.nodes import diagnostics as diag
from dynnet_ros.nodes.base import SENSOR_QOS_OVERRIDES, ParamSpec, declare, run_node, steady_timer
from dynnet_ros.nodes.convert import array_to_image, xyzi_to_cloud
from dynnet_ros.procmem import process_memory
from dynnet_ros.sim.frames import SimSettings, camera_info_fields, parse_resolution, render_image, scan_points
from dynnet_ros.sim.rig import SINGLE_CAMERA, check_camera_names, default_yaw
from dynnet_ros.sim.scene import make_scene

DEFAULTS = SimSettings()
RATE_RANGE = (0.2, 60.0)


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
    ParamSpec("rate_hz", DEFAULTS.rate_hz, "LiDAR frame rate, and each camera's unless its NAME.rate_hz says "
              "otherwise.", low=RATE_RANGE[0], high=RATE_RANGE[1]),
    ParamSpec("cameras", [], "Camera names, each publishing NAME/image_raw and NAME/camera_info (frame_id "
              "NAME_optical_frame), looking NAME.yaw_deg from forward at NAME.rate_hz; [] = one camera on "
              "camera/image_raw. Set at start.", kind="string_array", check=check_camera_names, read_only=True),
    ParamSpec("encoding", DEFAULTS.encoding, "Camera image encoding.", choices=("rgb8", "bgr8")),
    ParamSpec("resolutions", list(DEFAULTS.resolutions), "Camera resolution schedule (WIDTHxHEIGHT), "
              "cycled in order.", kind="string_array", check=_check_resolutions),
    ParamSpec("resolution_period_s", DEFAULTS.resolution_period_s, "Seconds spent at each resolution.",
              low=0.1, high=86400.0),
    ParamSpec("camera_frame_id", DEFAULTS.camera_frame_id, "frame_id of the image and CameraInfo (one camera; "
              "with cameras listed, NAME_optical_frame)."),
    ParamSpec("lidar_frame_id", DEFAULTS.lidar_frame_id, "frame_id of the point cloud."),
    ParamSpec("lidar_beams", DEFAULTS.lidar_beams, "LiDAR vertical beams.", low=1, high=128),
    ParamSpec("lidar_azimuth_steps", DEFAULTS.lidar_azimuth_steps,
              "Mean LiDAR horizontal samples per beam and camera (varies +-20% per frame).", low=8, high=8192),
    ParamSpec("pedestrians", DEFAULTS.pedestrians, "Number of pedestrians in the scene.", low=0, high=5),
    ParamSpec("seed", DEFAULTS.seed, "Scene seed: where the pedestrians are along their walk, and the LiDAR "
              "noise (dynnet sim --record --seed N writes the same scenes).", low=0, high=2**31 - 1),
    ParamSpec("enabled", True, "Publish frames."),
]


#: every parameter sensor_sim declares whatever its cameras (also what `dynnet up` and the launch
#: file check; ``declared_specs`` adds the per-camera ones)
PARAMETERS = SPECS


def camera_specs(cameras: list[str], rate_hz: float) -> list[ParamSpec]:
    """The parameters of each listed camera: where it looks and how often it publishes."""
    specs = []
    for index, name in enumerate(cameras):
        specs += [ParamSpec(f"{name}.yaw_deg", default_yaw(name, index, len(cameras)),
                            f"Where camera {name} looks: degrees counter-clockwise from forward (seen from above).",
                            low=-360.0, high=360.0),
                  ParamSpec(f"{name}.rate_hz", float(rate_hz), f"Camera {name}'s frame rate.",
                            low=RATE_RANGE[0], high=RATE_RANGE[1])]
    return specs


def declared_specs(parameters: dict[str, Any]) -> list[ParamSpec]:
    """Every parameter a sensor_sim started with ``parameters`` (a config's values) declares:
    ``SPECS`` and the per-camera ones of its ``cameras`` (none when that list is unusable: its
    own check reports it)."""
    cameras = parameters.get("cameras") or []
    rate = parameters.get("rate_hz", DEFAULTS.rate_hz)
    if not isinstance(cameras, list) or check_camera_names(cameras) or not isinstance(rate, (int, float)):
        return list(SPECS)
    return SPECS + camera_specs(cameras, rate)


@dataclass
class _Camera:
    """One simulated camera's publishers and what it last published."""

    name: str
    frame_id: str
    image_pub: Publisher
    info_pub: Publisher
    frames: int = 0
    resolution: tuple[int, int] | None = None


class SensorSim(Node):
    def __init__(self, **options: Any) -> None:
        super().__init__("sensor_sim", **options)
        self.params = declare(self, SPECS)
        listed = list(self.params["cameras"])
        self._listed = bool(listed)  # cameras named by the parameter (else the single camera)
        per_camera = camera_specs(listed, self.params["rate_hz"])
        self.params.update(declare(self, per_camera))
        self._specs = {s.name: s for s in SPECS + per_camera}
        self._cameras = [self._camera(name) for name in listed or [SINGLE_CAMERA]]
        self.cloud_pub = self.create_publisher(PointCloud2, "lidar/points", qos_profile_sensor_data,
                                               qos_overriding_options=SENSOR_QOS_OVERRIDES)
        self.diag_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self.add_on_set_parameters_callback(self._on_set)
        self._t0 = time.monotonic()
        self._scans = 0
        self._last_points = 0
        self._render_ms = 0.0
        self._timers: list[Timer] = []
        self._schedule()
        # own group (second executor thread): slow 1280x720 frames must not starve the 1 Hz status
        steady_timer(self, 1.0, self._publish_diagnostics, MutuallyExclusiveCallbackGroup())

    def _camera(self, name: str) -> _Camera:
        image_pub = self.create_publisher(Image, f"{name}/image_raw", qos_profile_sensor_data,
                                          qos_overriding_options=SENSOR_QOS_OVERRIDES)
        info_pub = self.create_publisher(CameraInfo, f"{name}/camera_info", qos_profile_sensor_data,
                                         qos_overriding_options=SENSOR_QOS_OVERRIDES)
        return _Camera(name, f"{name}_optical_frame" if self._listed else self.params["camera_frame_id"],
                       image_pub, info_pub)

    def _rate(self, camera: _Camera) -> float:
        return self.params[f"{camera.name}.rate_hz"] if self._listed else self.params["rate_hz"]

    def _yaw(self, camera: _Camera) -> float:
        return self.params[f"{camera.name}.yaw_deg"] if self._listed else 0.0

    def _schedule(self) -> None:
        """One timer per camera at its rate; the LiDAR rides with the first camera at ``rate_hz``
        (one scene, one stamp for both), or gets a timer of its own."""
        for timer in self._timers:
            timer.cancel()
            self.destroy_timer(timer)
        rate = self.params["rate_hz"]
        lidar_with = next((c for c in self._cameras if self._rate(c) == rate), None)
        self._timers = [self.create_timer(1.0 / self._rate(c), lambda c=c: self._tick(c, c is lidar_with))
                        for c in self._cameras]
        if lidar_with is None:
            self._timers.append(self.create_timer(1.0 / rate, lambda: self._tick(None, True)))

    def _on_set(self, parameters):
        updates: dict[str, Any] = {}
        for p in parameters:
            spec = self._specs.get(p.name)
            value = list(p.value) if spec is not None and isinstance(spec.default, list) else p.value
            reason = spec.validate(value) if spec else None
            if reason:
                return SetParametersResult(successful=False, reason=reason)
            updates[p.name] = value
        self.params.update(updates)
        if any(name == "rate_hz" or name.endswith(".rate_hz") for name in updates):
            self._schedule()
        return SetParametersResult(successful=True)

    def settings(self) -> SimSettings:
        """The frame-shaping parameters in force, as the ROS-free renderer takes them."""
        p = self.params
        return SimSettings(rate_hz=p["rate_hz"], encoding=p["encoding"], resolutions=tuple(p["resolutions"]),
                           resolution_period_s=p["resolution_period_s"], camera_frame_id=p["camera_frame_id"],
                           lidar_frame_id=p["lidar_frame_id"], lidar_beams=int(p["lidar_beams"]),
                           lidar_azimuth_steps=int(p["lidar_azimuth_steps"]), pedestrians=int(p["pedestrians"]),
                           seed=int(p["seed"]))

    def _tick(self, camera: _Camera | None, lidar: bool) -> None:
        try:
            self._publish_frame(camera, lidar)
        except Exception:  # a tick racing Ctrl-C finds the context gone
            if self.context.ok():
                raise

    def _publish_frame(self, camera: _Camera | None, lidar: bool) -> None:
        """One camera's frame (``camera``) and/or the LiDAR's (``lidar``), from one scene under one stamp."""
        if not self.params["enabled"]:
            return
        start = time.perf_counter()
        settings = self.settings()
        elapsed = time.monotonic() - self._t0
        world = make_scene(elapsed, count=settings.pedestrians, seed=settings.seed)
        stamp = self.get_clock().now().to_msg()
        if camera is not None:
            frame = render_image(settings, camera.frames, elapsed, self._yaw(camera), world)
            header = Header(stamp=stamp, frame_id=camera.frame_id)
            camera.info_pub.publish(CameraInfo(header=header, width=frame.width, height=frame.height,
                                               **camera_info_fields(frame.camera_matrix)))
            camera.image_pub.publish(array_to_image(frame.image, settings.encoding, header))
            camera.frames += 1
            camera.resolution = (frame.width, frame.height)
        if lidar:
            points = scan_points(settings, self._scans, elapsed, tuple(self._yaw(c) for c in self._cameras), world)
            self.cloud_pub.publish(xyzi_to_cloud(points, Header(stamp=stamp, frame_id=settings.lidar_frame_id)))
            self._scans += 1
            self._last_points = len(points)
        self._render_ms = (time.perf_counter() - start) * 1e3

    def _publish_diagnostics(self) -> None:
        first = self._cameras[0]
        values: dict[str, Any] = {
            "pid": os.getpid(),
            "frames_published": first.frames,
            "camera_resolution": f"{first.resolution[0]}x{first.resolution[1]}" if first.resolution else "",
            "encoding": self.params["encoding"],
            "lidar_points": self._last_points,
            "frame_time_ms": self._render_ms,
            "rss_mb": process_memory().rss_mb,
        }
        if self._listed:
            values["cameras"] = len(self._cameras)
            values["lidar_frames_published"] = self._scans
            for camera in self._cameras:
                values[f"camera.{camera.name}.frames_published"] = camera.frames
                values[f"camera.{camera.name}.yaw_deg"] = self._yaw(camera)
                values[f"camera.{camera.name}.rate_hz"] = self._rate(camera)
        level, message = (diag.OK, "publishing") if self.params["enabled"] else (diag.OK, "disabled")
        diag.publish(self, self.diag_pub, [diag.node_status(self, "sensor simulator", level, message, values)])


def main(args: list[str] | None = None) -> int:
    use_image_profile()  # it publishes images: the transport profile they need (graph_transport)
    return run_node(SensorSim, args)


if __name__ == "__main__":
    sys.exit(main())
