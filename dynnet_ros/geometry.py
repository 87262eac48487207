"""Rigid transforms for the model nodes and the simulator — plain numpy, no ROS imports.

Why here and not in the nodes: the LiDAR-to-camera extrinsic (six values or a 4x4, the tf
conventions) is easy to get subtly wrong, so it lives where unit tests reach it without a ROS
graph, and the simulator's scene (``sim/scene.py``, used by the bag writer too) states its
mount with it. Letterboxing and projection onto pixels belong to the perception cores
(``perception/letterbox.py``, ``perception/projection.py``).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def rpy_to_matrix(roll: float, pitch: float, yaw: float) -> np.ndarray:
    """Rotation R = Rz(yaw) @ Ry(pitch) @ Rx(roll), the ROS/tf fixed-axis RPY convention."""
    cr, sr = math.cos(roll), math.sin(roll)
    cp, sp = math.cos(pitch), math.sin(pitch)
    cy, sy = math.cos(yaw), math.sin(yaw)
    return np.array([
        [cy * cp, cy * sp * sr - sy * cr, cy * sp * cr + sy * sr],
        [sy * cp, sy * sp * sr + cy * cr, sy * sp * cr - cy * sr],
        [-sp, cp * sr, cp * cr],
    ])


def matrix_to_rpy(rotation: np.ndarray) -> tuple[float, float, float]:
    """Inverse of rpy_to_matrix (pitch in [-pi/2, pi/2])."""
    r = np.asarray(rotation, dtype=np.float64)
    pitch = math.asin(max(-1.0, min(1.0, -r[2, 0])))
    if abs(math.cos(pitch)) > 1e-9:
        roll = math.atan2(r[2, 1], r[2, 2])
        yaw = math.atan2(r[1, 0], r[0, 0])
    else:  # gimbal lock: put everything into yaw
        roll = 0.0
        yaw = math.atan2(-r[0, 1], r[1, 1])
    return roll, pitch, yaw


def extrinsic_matrix(values: Sequence[float]) -> np.ndarray:
    """4x4 transform from 6 values (x, y, z, roll, pitch, yaw) or 16 (row-major 4x4).

    The transform maps points from the LiDAR frame into the camera frame (p_cam = T @ p_lidar),
    i.e. what tf's lookup_transform(camera_frame, lidar_frame) returns.
    """
    vals = [float(v) for v in values]
    if not all(math.isfinite(v) for v in vals):
        raise ValueError("extrinsic contains NaN or infinite values")
    if len(vals) == 6:
        t = np.eye(4)
        t[:3, :3] = rpy_to_matrix(*vals[3:])
        t[:3, 3] = vals[:3]
        return t
    if len(vals) == 16:
        t = np.array(vals).reshape(4, 4)
        if not np.allclose(t[3], [0, 0, 0, 1], atol=1e-6):
            raise ValueError(f"extrinsic 4x4 last row must be [0, 0, 0, 1], got {t[3].tolist()}")
        r = t[:3, :3]
        if not np.allclose(r @ r.T, np.eye(3), atol=1e-4) or np.linalg.det(r) < 0:
            raise ValueError("extrinsic 4x4 rotation block is not a proper rotation (R R^T != I or det < 0)")
        return t
    raise ValueError(f"extrinsic needs 6 values (x y z roll pitch yaw) or 16 (4x4 row-major), got {len(vals)}")


def transform_points(transform: np.ndarray, xyz: np.ndarray) -> np.ndarray:
    xyz = np.asarray(xyz, dtype=np.float64).reshape(-1, 3)
    return xyz @ transform[:3, :3].T + transform[:3, 3]
