"""Byte layouts of sensor_msgs Image and PointCloud2 as numpy — no ROS imports.

Why apart from ``nodes/convert.py``: the same bytes go into messages two ways, rclpy objects
published by the nodes and CDR written straight into a bag by ``bags/scenes.py`` without a ROS
graph. Both take the encoding table, the row step and the packed point records from here, so a
recorded frame and a published one are the same bytes.
"""
from __future__ import annotations

import sys

import numpy as np

# encoding -> (element dtype, channels)
IMAGE_ENCODINGS: dict[str, tuple[np.dtype, int]] = {
    "rgb8": (np.dtype(np.uint8), 3),
    "bgr8": (np.dtype(np.uint8), 3),
    "rgba8": (np.dtype(np.uint8), 4),
    "bgra8": (np.dtype(np.uint8), 4),
    "mono8": (np.dtype(np.uint8), 1),
    "mono16": (np.dtype(np.uint16), 1),
    "16UC1": (np.dtype(np.uint16), 1),
    "32FC1": (np.dtype(np.float32), 1),
}

HOST_BIG_ENDIAN = sys.byteorder == "big"

#: sensor_msgs/PointField.FLOAT32
POINT_FIELD_FLOAT32 = 7
XYZI_FIELDS = ("x", "y", "z", "intensity")
XYZI_DTYPE = np.dtype([(name, np.float32) for name in XYZI_FIELDS])


def pack_image(array: np.ndarray, encoding: str) -> tuple[np.ndarray, int]:
    """(HxWxC contiguous array in the encoding's dtype, row step in bytes) of an HxW / HxWxC array;
    host byte order, no row padding. ValueError for an unknown encoding, a wrong shape or an empty image."""
    if encoding not in IMAGE_ENCODINGS:
        raise ValueError(f"unsupported image encoding '{encoding}'; supported: {sorted(IMAGE_ENCODINGS)}")
    dtype, channels = IMAGE_ENCODINGS[encoding]
    array = np.asarray(array)
    if array.ndim == 2:
        array = array[:, :, None]
    if array.ndim != 3 or array.shape[2] != channels:
        raise ValueError(f"{encoding} needs an HxW{'' if channels == 1 else 'x' + str(channels)} array, "
                         f"got shape {list(array.shape)}")
    if array.shape[0] == 0 or array.shape[1] == 0:
        raise ValueError(f"cannot publish an empty image (shape {list(array.shape)})")
    array = np.ascontiguousarray(array, dtype=dtype)
    return array, int(array.shape[1]) * channels * dtype.itemsize


def pack_xyzi(points: np.ndarray) -> np.ndarray:
    """(N, 4) x, y, z, intensity -> N packed float32 records (XYZI_DTYPE), PointCloud2's data."""
    pts = np.asarray(points, dtype=np.float32)
    if pts.ndim != 2 or pts.shape[1] != 4:
        raise ValueError(f"points must be (N, 4) x, y, z, intensity, got shape {list(pts.shape)}")
    packed = np.empty(len(pts), dtype=XYZI_DTYPE)
    for i, name in enumerate(XYZI_FIELDS):
        packed[name] = pts[:, i]
    return packed


def xyzi_dense(packed: np.ndarray) -> bool:
    """PointCloud2's is_dense: no point has a NaN or infinite field."""
    return bool(all(np.isfinite(packed[name]).all() for name in XYZI_FIELDS))
