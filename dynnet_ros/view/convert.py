"""Arrays from the graph's messages -> Foxglove messages (foxglove.messages, protobuf on the wire).

Why these encodings: Foxglove's RawImage reads multi-byte pixels as little-endian, so arrays are
written in that order whatever the host's; depth goes out as 16UC1 millimetres (the REP 118
depth encoding) because Foxglove's Image panel maps 16-bit images through its colour-map range
settings, while a 32FC1 image is drawn as brightness on [0, 1] m. Boxes become ImageAnnotations
in image pixels with the image's own timestamp, so Foxglove draws them over the frame they
belong to.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from foxglove.messages import (
    CameraCalibration,
    Color,
    ImageAnnotations,
    Point2,
    PointsAnnotation,
    PointsAnnotationType,
    RawImage,
    TextAnnotation,
    Timestamp,
)

#: the largest depth a 16UC1 millimetre image holds; deeper pixels saturate to it
MAX_DEPTH_MM = 65535
BOX_COLOUR = Color(r=1.0, g=0.2, b=0.2, a=1.0)
TEXT_COLOUR = Color(r=1.0, g=1.0, b=1.0, a=1.0)
TEXT_BACKGROUND = Color(r=0.0, g=0.0, b=0.0, a=0.6)
BOX_THICKNESS_PX = 2.0
FONT_SIZE_PX = 14.0

# (numpy dtype kind+size, channels) each RawImage encoding carries
_LAYOUTS: dict[str, tuple[str, int]] = {
    "rgb8": ("u1", 3), "bgr8": ("u1", 3), "rgba8": ("u1", 4), "bgra8": ("u1", 4), "mono8": ("u1", 1),
    "8UC1": ("u1", 1), "8UC3": ("u1", 3), "mono16": ("u2", 1), "16UC1": ("u2", 1), "32FC1": ("f4", 1),
}


@dataclass(frozen=True)
class Stamp:
    """A message stamp (ROS header's sec/nanosec): the Foxglove timestamp and the log time."""

    sec: int
    nanosec: int

    @property
    def ns(self) -> int:
        return self.sec * 1_000_000_000 + self.nanosec

    def foxglove(self) -> Timestamp:
        return Timestamp(self.sec, self.nanosec)


def raw_image(array: np.ndarray, encoding: str, stamp: Stamp, frame_id: str) -> RawImage:
    """HxW or HxWxC array (host byte order) -> RawImage with contiguous little-endian rows.

    ValueError when the array does not fit the encoding (wrong element type or channel count).
    """
    if encoding not in _LAYOUTS:
        raise ValueError(f"unsupported image encoding {encoding!r}; supported: {sorted(_LAYOUTS)}")
    kind, channels = _LAYOUTS[encoding]
    if array.ndim not in (2, 3) or (array.shape[2] if array.ndim == 3 else 1) != channels:
        raise ValueError(f"{encoding} needs {channels} channel(s), got an array of shape {array.shape}")
    if f"{array.dtype.kind}{array.dtype.itemsize}" != kind:
        raise ValueError(f"{encoding} needs {np.dtype(kind)} pixels, got {array.dtype}")
    height, width = array.shape[:2]
    data = np.ascontiguousarray(array, dtype=np.dtype(kind).newbyteorder("<"))
    return RawImage(timestamp=stamp.foxglove(), frame_id=frame_id, width=width, height=height, encoding=encoding,
                    step=width * channels * data.dtype.itemsize, data=data.tobytes())


def depth_image(metres: np.ndarray, stamp: Stamp, frame_id: str) -> RawImage:
    """HxW depth in metres -> 16UC1 millimetres, rounded; no depth (NaN, inf, <= 0) is 0, depths
    beyond MAX_DEPTH_MM saturate."""
    depth = np.asarray(metres, dtype=np.float32)
    if depth.ndim != 2:
        raise ValueError(f"a depth image is HxW, got shape {depth.shape}")
    mm = np.rint(depth * np.float32(1000.0))
    mm = np.where(np.isfinite(mm) & (mm > 0), np.minimum(mm, MAX_DEPTH_MM), 0)
    return raw_image(mm.astype(np.uint16), "16UC1", stamp, frame_id)


def mask_image(mask: np.ndarray, stamp: Stamp, frame_id: str) -> RawImage:
    """HxW mask -> mono8, 255 where the mask is set (any non-zero value), else 0."""
    mask = np.asarray(mask)
    if mask.ndim != 2:
        raise ValueError(f"a mask is HxW, got shape {mask.shape}")
    return raw_image(np.where(mask != 0, np.uint8(255), np.uint8(0)), "mono8", stamp, frame_id)


def box_annotations(boxes_xyxy: np.ndarray, labels: Sequence[str], stamp: Stamp) -> ImageAnnotations:
    """Pixel boxes (N, 4: x1, y1, x2, y2) and their labels -> one closed outline and one text each.

    An empty set still makes a message: it clears the previous frame's boxes in Foxglove.
    """
    boxes = np.asarray(boxes_xyxy, dtype=np.float64).reshape(-1, 4)
    if len(labels) != len(boxes):
        raise ValueError(f"{len(boxes)} boxes but {len(labels)} labels")
    when = stamp.foxglove()
    outlines, texts = [], []
    for (x1, y1, x2, y2), text in zip(boxes.tolist(), labels):
        corners = [Point2(x=x1, y=y1), Point2(x=x2, y=y1), Point2(x=x2, y=y2), Point2(x=x1, y=y2)]
        outlines.append(PointsAnnotation(timestamp=when, type=PointsAnnotationType.LineLoop, points=corners,
                                         outline_color=BOX_COLOUR, thickness=BOX_THICKNESS_PX))
        texts.append(TextAnnotation(timestamp=when, position=Point2(x=x1, y=y1), text=text, font_size=FONT_SIZE_PX,
                                    text_color=TEXT_COLOUR, background_color=TEXT_BACKGROUND))
    return ImageAnnotations(timestamp=when, points=outlines, texts=texts)


def plane_boxes(outlines: Sequence[np.ndarray], k: np.ndarray) -> np.ndarray:
    """Box outlines drawn on the z = 1 plane in front of the camera (M, 2: x/z, y/z each) -> pixel
    boxes (N, 4) through the camera matrix ``k``: how the pedestrian markers go back to pixels."""
    boxes = np.zeros((len(outlines), 4))
    for i, xy in enumerate(outlines):
        xy = np.asarray(xy, dtype=np.float64).reshape(-1, 2)
        u = k[0, 0] * xy[:, 0] + k[0, 1] * xy[:, 1] + k[0, 2]
        v = k[1, 1] * xy[:, 1] + k[1, 2]
        boxes[i] = (u.min(), v.min(), u.max(), v.max())
    return boxes


def camera_calibration(width: int, height: int, k: Sequence[float], stamp: Stamp, frame_id: str, *,
                       distortion_model: str = "", d: Sequence[float] = (), r: Sequence[float] = (),
                       p: Sequence[float] = ()) -> CameraCalibration:
    """A CameraInfo's content as Foxglove's CameraCalibration (K, R row-major 3x3; P 3x4)."""
    return CameraCalibration(timestamp=stamp.foxglove(), frame_id=frame_id, width=int(width), height=int(height),
                             distortion_model=distortion_model, D=[float(v) for v in d], K=[float(v) for v in k],
                             R=[float(v) for v in r], P=[float(v) for v in p])
