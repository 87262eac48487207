"""The simulator's camera rig: which cameras it has and where each one looks — no ROS imports.

Why a module of its own: the ``sensor_sim`` node (its ``cameras`` parameter), ``dynnet demo
--cameras N`` and the multi-camera configs must agree on camera names, their default yaws and the
LiDAR-to-camera extrinsic each model node is given (``sim.scene.lidar_to_camera_xyzrpy``).
All cameras share one mount point and differ by yaw (degrees, counter-clockwise seen from
above, 0 = forward).
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

#: the camera of a simulator with no ``cameras`` listed (topics camera/image_raw, camera/camera_info)
SINGLE_CAMERA = "camera"
#: the usual camera names and where they look
NAMED_YAWS: dict[str, float] = {
    "front": 0.0, "left": 90.0, "rear": 180.0, "right": -90.0,
    "front_left": 45.0, "front_right": -45.0, "rear_left": 135.0, "rear_right": -135.0,
}
#: the cameras ``dynnet demo --cameras N`` simulates: the first N of these
DEMO_CAMERAS = ("front", "left", "right", "rear", "front_left", "front_right", "rear_left", "rear_right")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def check_camera_names(names: Sequence[str]) -> str | None:
    """Why ``names`` cannot name the simulator's cameras, or None: each a ROS name segment
    (it becomes the topic namespace NAME/ and the parameter prefix NAME.), none twice."""
    for name in names:
        if not isinstance(name, str) or not _NAME.match(name):
            return f"cameras: {name!r} is not a camera name (letters, digits and _, not starting with a digit)"
    seen: set[str] = set()
    for name in names:
        if name in seen:
            return f"cameras: {name!r} is listed twice"
        seen.add(name)
    return None


def default_yaw(name: str, index: int, count: int) -> float:
    """Where camera ``name`` (number ``index`` of ``count``) looks unless its ``NAME.yaw_deg`` says
    otherwise: the usual names by ``NAMED_YAWS``, other cameras spread evenly around the vehicle
    by their place in the list (degrees in (-180, 180])."""
    if name in NAMED_YAWS:
        return NAMED_YAWS[name]
    yaw = 360.0 * index / count
    return yaw - 360.0 if yaw > 180.0 else yaw


def demo_cameras(count: int) -> list[str]:
    """The names of the first ``count`` demo cameras (1..8); ValueError otherwise."""
    if not 1 <= count <= len(DEMO_CAMERAS):
        raise ValueError(f"the demo simulates 1 to {len(DEMO_CAMERAS)} cameras, got {count}")
    return list(DEMO_CAMERAS[:count])


@dataclass(frozen=True)
class SimCamera:
    """One simulated camera: its name (topics NAME/image_raw, NAME/camera_info; frame_id
    NAME_optical_frame) and where it looks."""

    name: str
    yaw_deg: float

    @property
    def frame_id(self) -> str:
        return f"{self.name}_optical_frame"


def rig_cameras(names: Sequence[str]) -> list[SimCamera]:
    """The cameras ``names`` at their default yaws; ValueError for names the simulator refuses."""
    problem = check_camera_names(names)
    if problem:
        raise ValueError(problem)
    return [SimCamera(name, default_yaw(name, index, len(names))) for index, name in enumerate(names)]
