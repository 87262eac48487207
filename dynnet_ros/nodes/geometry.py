"""Image and LiDAR geometry for the model nodes — plain numpy, no ROS imports.

Why here and not in the nodes: letterboxing, mapping results back to camera pixels and LiDAR
projection are the parts of a node that can be wrong in subtle ways, so they live where unit
tests can reach them without a ROS graph.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

# --------------------------------------------------------------------------- resizing / letterbox

def _axis_weights(src: int, dst: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Half-pixel-centre bilinear sampling positions (same convention as ONNX Resize)."""
    pos = (np.arange(dst, dtype=np.float64) + 0.5) * (src / dst) - 0.5
    pos = np.clip(pos, 0.0, src - 1)
    lo = np.floor(pos).astype(np.intp)
    hi = np.minimum(lo + 1, src - 1)
    frac = (pos - lo).astype(np.float32)
    return lo, hi, frac


def resize_bilinear(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """Bilinear resize of an HxW or HxWxC array to height x width (float32 out)."""
    if image.ndim not in (2, 3):
        raise ValueError(f"resize expects an HxW or HxWxC array, got shape {list(image.shape)}")
    if height <= 0 or width <= 0:
        raise ValueError(f"resize target must be positive, got {height}x{width}")
    src = image.astype(np.float32, copy=False)
    if src.shape[0] == height and src.shape[1] == width:
        return src.copy()
    lo, hi, fy = _axis_weights(src.shape[0], height)
    rows = src[lo] * (1.0 - _expand(fy, src.ndim)) + src[hi] * _expand(fy, src.ndim)
    lo, hi, fx = _axis_weights(src.shape[1], width)
    fx = fx[None, :] if src.ndim == 2 else fx[None, :, None]
    return rows[:, lo] * (1.0 - fx) + rows[:, hi] * fx


def _expand(weights: np.ndarray, ndim: int) -> np.ndarray:
    return weights[:, None] if ndim == 2 else weights[:, None, None]


@dataclass(frozen=True)
class Letterbox:
    """How a camera image became a model input: scale by `scale`, then pad right/bottom.

    Padding only on the right and bottom keeps the mapping back to camera pixels a crop plus
    a division by `scale`, with no offsets to get wrong.
    """

    src_h: int
    src_w: int
    scale: float
    new_h: int  # size after scaling, before padding
    new_w: int
    pad_h: int  # model input size (multiple of `multiple`)
    pad_w: int

    @property
    def input_shape(self) -> tuple[int, int]:
        return self.pad_h, self.pad_w

    def apply(self, image: np.ndarray, pad_value: float = 0.0) -> np.ndarray:
        """HxW[xC] camera-resolution array -> pad_h x pad_w[xC] float32 model-resolution array."""
        if image.shape[:2] != (self.src_h, self.src_w):
            raise ValueError(f"letterbox planned for {self.src_w}x{self.src_h}, got "
                             f"{image.shape[1]}x{image.shape[0]}")
        scaled = resize_bilinear(image, self.new_h, self.new_w)
        out = np.full((self.pad_h, self.pad_w) + scaled.shape[2:], pad_value, dtype=np.float32)
        out[: self.new_h, : self.new_w] = scaled
        return out

    def to_source(self, model_map: np.ndarray) -> np.ndarray:
        """Model-resolution HxW[xC] map -> camera-resolution map (crop the padding, rescale)."""
        if model_map.shape[:2] != (self.pad_h, self.pad_w):
            raise ValueError(f"expected a {self.pad_w}x{self.pad_h} map, got "
                             f"{model_map.shape[1]}x{model_map.shape[0]}")
        return resize_bilinear(model_map[: self.new_h, : self.new_w], self.src_h, self.src_w)

    def boxes_to_source(self, boxes: np.ndarray) -> np.ndarray:
        """(N,4) x1,y1,x2,y2 in model-input pixels -> camera pixels, clipped to the image."""
        boxes = np.asarray(boxes, dtype=np.float32).reshape(-1, 4) / np.float32(self.scale)
        boxes[:, [0, 2]] = np.clip(boxes[:, [0, 2]], 0, self.src_w)
        boxes[:, [1, 3]] = np.clip(boxes[:, [1, 3]], 0, self.src_h)
        return boxes

    def scale_intrinsics(self, k: np.ndarray) -> np.ndarray:
        """Camera matrix of the scaled (model-input) image, half-pixel-centre convention."""
        k = np.array(k, dtype=np.float64).reshape(3, 3)
        sx, sy = self.new_w / self.src_w, self.new_h / self.src_h
        out = k.copy()
        out[0, 0] *= sx
        out[0, 1] *= sx
        out[0, 2] = (k[0, 2] + 0.5) * sx - 0.5
        out[1, 1] *= sy
        out[1, 2] = (k[1, 2] + 0.5) * sy - 0.5
        return out


def plan_letterbox(height: int, width: int, *, multiple: int = 32, max_side: int = 0) -> Letterbox:
    """Plan the input for a model that needs H, W multiples of `multiple`.

    `max_side` > 0 downscales images whose longer side exceeds it (latency stays bounded when
    the camera switches to 1280x720); 0 keeps the camera resolution and only pads.
    """
    if height <= 0 or width <= 0:
        raise ValueError(f"image size must be positive, got {width}x{height}")
    if multiple <= 0:
        raise ValueError(f"multiple must be positive, got {multiple}")
    scale = 1.0
    if max_side and max(height, width) > max_side:
        scale = max_side / max(height, width)
    new_h = max(1, int(round(height * scale)))
    new_w = max(1, int(round(width * scale)))
    pad_h = -(-new_h // multiple) * multiple
    pad_w = -(-new_w // multiple) * multiple
    return Letterbox(height, width, scale, new_h, new_w, pad_h, pad_w)


def to_nchw(image: np.ndarray) -> np.ndarray:
    """HxWxC (or HxW) float array -> 1xCxHxW contiguous float32."""
    if image.ndim == 2:
        image = image[:, :, None]
    return np.ascontiguousarray(image.transpose(2, 0, 1)[None], dtype=np.float32)


# --------------------------------------------------------------------------- rigid transforms

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


def validate_intrinsics(k: Sequence[float] | np.ndarray) -> np.ndarray:
    """3x3 camera matrix from CameraInfo.k (9 values) with a usable focal length."""
    k = np.asarray(k, dtype=np.float64)
    if k.size != 9:
        raise ValueError(f"camera matrix needs 9 values, got {k.size}")
    k = k.reshape(3, 3)
    if not np.all(np.isfinite(k)):
        raise ValueError("camera matrix contains NaN or infinite values")
    if k[0, 0] <= 0 or k[1, 1] <= 0:
        raise ValueError(f"camera matrix focal lengths must be positive, got fx={k[0, 0]}, fy={k[1, 1]}")
    return k


def project_depth(points_cam: np.ndarray, k: np.ndarray, height: int, width: int,
                  *, min_depth: float = 0.1, max_depth: float = 200.0) -> np.ndarray:
    """Sparse depth image (metres, 0 = no return) of camera-frame points, nearest return wins."""
    depth = np.full(height * width, np.inf, dtype=np.float32)
    pts = np.asarray(points_cam, dtype=np.float64).reshape(-1, 3)
    z = pts[:, 2]
    keep = np.isfinite(pts).all(axis=1) & (z > min_depth) & (z < max_depth)
    pts, z = pts[keep], z[keep]
    if len(pts):
        u = np.round(k[0, 0] * pts[:, 0] / z + k[0, 1] * pts[:, 1] / z + k[0, 2]).astype(np.int64)
        v = np.round(k[1, 1] * pts[:, 1] / z + k[1, 2]).astype(np.int64)
        inside = (u >= 0) & (u < width) & (v >= 0) & (v < height)
        np.minimum.at(depth, v[inside] * width + u[inside], z[inside].astype(np.float32))
    depth[~np.isfinite(depth)] = 0.0
    return depth.reshape(height, width)
