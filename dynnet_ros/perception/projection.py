"""Camera-frame points onto image pixels: the LiDAR side of depth estimation, plain numpy.

Points are in the camera's optical frame (x right, y down, z forward, metres); the caller moves
them there (the nodes apply the LiDAR-to-camera extrinsic). The intrinsics are those of the
image the points are projected onto.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def validate_intrinsics(k: Sequence[float] | np.ndarray) -> np.ndarray:
    """3x3 camera matrix from 9 values (CameraInfo.k) with positive focal lengths."""
    k = np.asarray(k, dtype=np.float64)
    if k.size != 9:
        raise ValueError(f"camera matrix needs 9 values, got {k.size}")
    k = k.reshape(3, 3)
    if not np.all(np.isfinite(k)):
        raise ValueError("camera matrix contains NaN or infinite values")
    if k[0, 0] <= 0 or k[1, 1] <= 0:
        raise ValueError(f"camera matrix focal lengths must be positive, got fx={k[0, 0]}, fy={k[1, 1]}")
    return k


def check_points(points: np.ndarray) -> np.ndarray:
    """(N, 3+) array of camera-frame points -> (N, 3) float64 (extra columns, e.g. intensity, dropped)."""
    pts = np.asarray(points)
    if pts.ndim != 2 or pts.shape[1] < 3 or not np.issubdtype(pts.dtype, np.number):
        raise ValueError(f"lidar_points must be an (N, 3) array of x, y, z in the camera frame, got shape "
                         f"{list(pts.shape)}")
    return pts[:, :3].astype(np.float64, copy=False)


def project_points(points_cam: np.ndarray, k: np.ndarray, height: int, width: int, *, min_depth: float = 0.1,
                   max_depth: float = 200.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pixel columns, rows and depths (metres) of the points that land on a height x width image."""
    pts = check_points(points_cam)
    z = pts[:, 2]
    keep = np.isfinite(pts).all(axis=1) & (z > min_depth) & (z < max_depth)
    pts, z = pts[keep], z[keep]
    u = np.round(k[0, 0] * pts[:, 0] / z + k[0, 1] * pts[:, 1] / z + k[0, 2]).astype(np.int64)
    v = np.round(k[1, 1] * pts[:, 1] / z + k[1, 2]).astype(np.int64)
    inside = (u >= 0) & (u < width) & (v >= 0) & (v < height)
    return u[inside], v[inside], z[inside]


def project_depth(points_cam: np.ndarray, k: np.ndarray, height: int, width: int, *, min_depth: float = 0.1,
                  max_depth: float = 200.0) -> np.ndarray:
    """Sparse depth image (metres, 0 = no return) of camera-frame points; the nearest return wins."""
    u, v, z = project_points(points_cam, k, height, width, min_depth=min_depth, max_depth=max_depth)
    depth = np.full(height * width, np.inf, dtype=np.float32)
    np.minimum.at(depth, v * width + u, z.astype(np.float32))
    depth[~np.isfinite(depth)] = 0.0
    return depth.reshape(height, width)
