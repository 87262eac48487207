"""One simulator frame from its settings, index and time — plain numpy, no ROS imports.

Why a module of its own: the live ``sensor_sim`` node and ``dynnet sim --record`` (which writes
frames into a bag without a ROS graph) must publish the same thing for the same frame: the
resolution schedule, the per-frame LiDAR resolution, the seeded scene, the camera intrinsics.
Both call ``render_frame``; only how the result becomes a message differs.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from dynnet_ros.sim import scene

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


@dataclass(frozen=True)
class SimSettings:
    """What a simulated frame depends on (the sensor_sim node's parameters, same defaults)."""

    rate_hz: float = 10.0
    encoding: str = "rgb8"
    resolutions: tuple[str, ...] = ("320x240", "640x480", "1280x720")
    resolution_period_s: float = 5.0
    camera_frame_id: str = "camera_optical_frame"
    lidar_frame_id: str = "lidar"
    lidar_beams: int = 16
    lidar_azimuth_steps: int = 512
    pedestrians: int = 4
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.resolutions:
            raise ValueError("resolutions must list at least one WIDTHxHEIGHT")
        for text in self.resolutions:
            parse_resolution(text)
        if self.encoding not in ("rgb8", "bgr8"):
            raise ValueError(f"encoding must be rgb8 or bgr8, got {self.encoding!r}")
        if not 0.2 <= self.rate_hz <= 60.0:
            raise ValueError(f"rate_hz must be in 0.2..60, got {self.rate_hz}")
        if self.resolution_period_s <= 0:
            raise ValueError(f"resolution_period_s must be positive, got {self.resolution_period_s}")
        if not 0 <= self.pedestrians <= 5:
            raise ValueError(f"pedestrians must be in 0..5, got {self.pedestrians}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")


@dataclass(frozen=True)
class SimFrame:
    """One frame: the camera image (in the settings' encoding) and the LiDAR cloud of one scene."""

    index: int
    elapsed: float             # seconds since the simulator started: where the scene is
    width: int
    height: int
    image: np.ndarray          # HxWx3 uint8, channel order of the encoding
    points: np.ndarray         # (N, 4) float32 x, y, z, intensity in the LiDAR frame
    camera_matrix: np.ndarray  # 3x3 K


def resolution_at(settings: SimSettings, elapsed: float) -> tuple[int, int]:
    """The camera size at ``elapsed`` seconds: the schedule cycled, resolution_period_s each."""
    index = int(elapsed // settings.resolution_period_s) % len(settings.resolutions)
    return parse_resolution(settings.resolutions[index])


def lidar_steps(base_steps: int, index: int) -> int:
    """Horizontal samples per beam of frame ``index``: +-20 % around the base, so the point count changes."""
    return max(8, int(base_steps * (0.8 + 0.4 * ((index * 37) % 11) / 10.0)))


def render_frame(settings: SimSettings, index: int, elapsed: float) -> SimFrame:
    """Frame ``index`` at ``elapsed`` seconds: one scene, rendered by the camera and scanned by the LiDAR."""
    world = scene.make_scene(elapsed, count=settings.pedestrians, seed=settings.seed)
    camera = render_image(settings, index, elapsed, world=world)
    points = scan_points(settings, index, elapsed, world=world)
    return SimFrame(index, elapsed, camera.width, camera.height, camera.image, points, camera.camera_matrix)


@dataclass(frozen=True)
class CameraImage:
    """One camera's image of a frame (in the settings' encoding)."""

    index: int
    elapsed: float
    width: int
    height: int
    image: np.ndarray          # HxWx3 uint8
    camera_matrix: np.ndarray  # 3x3 K


def render_image(settings: SimSettings, index: int, elapsed: float, yaw_deg: float = 0.0,
                 world: scene.Scene | None = None) -> CameraImage:
    """The image of frame ``index`` at ``elapsed`` seconds from the camera yawed by ``yaw_deg``
    (``world``: the scene at that time, when the caller has it already)."""
    width, height = resolution_at(settings, elapsed)
    world = world or scene.make_scene(elapsed, count=settings.pedestrians, seed=settings.seed)
    rgb, _ = scene.render_camera(world, width, height, frame=index, yaw_deg=yaw_deg)
    image = rgb if settings.encoding == "rgb8" else rgb[:, :, ::-1]
    return CameraImage(index, elapsed, width, height, image, scene.camera_matrix(width, height))


def scan_points(settings: SimSettings, index: int, elapsed: float, yaws_deg: tuple[float, ...] = (0.0,),
                world: scene.Scene | None = None) -> np.ndarray:
    """The LiDAR cloud of frame ``index`` at ``elapsed`` seconds, covering the cameras yawed by
    ``yaws_deg``: (N, 4) float32 x, y, z, intensity in the LiDAR frame."""
    world = world or scene.make_scene(elapsed, count=settings.pedestrians, seed=settings.seed)
    return scene.scan_lidar(world, beams=settings.lidar_beams,
                            azimuth_steps=lidar_steps(settings.lidar_azimuth_steps, index),
                            seed=(settings.seed, index), yaws_deg=yaws_deg)


def camera_info_fields(k: np.ndarray) -> dict[str, Any]:
    """CameraInfo's calibration fields for intrinsics ``k`` (no distortion, identity rectification)."""
    return {
        "distortion_model": "plumb_bob",
        "d": [0.0] * 5,
        "k": [float(v) for v in k.ravel()],
        "r": [1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0],
        "p": [float(k[0, 0]), 0.0, float(k[0, 2]), 0.0, 0.0, float(k[1, 1]), float(k[1, 2]), 0.0,
              0.0, 0.0, 1.0, 0.0],
    }
