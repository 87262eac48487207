"""A model node's own per-frame memory: lean preprocessing, and what the node charges its budget.

Why: a node's budget bounds its RSS growth since before the model loaded, and the engine is not
the only thing growing — the camera messages in flight, the model-input tensors the node fills
and the post-processing arrays are the node's. Measured under ``dynnet up`` at 640x480 they were
7-8 MB per frame before this module (float HxWx3 copy, letterboxed copy, NCHW copy, each a new
allocation), so a node serving at its engine's peak overshot its budget by that much.

Two parts, plain numpy (no ROS imports, unit-tested):

* :class:`InputBuffer` writes the letterboxed, normalised image straight from the message's
  ``uint8``/``uint16``/``float32`` view into one reused ``1x3xHxW`` float32 tensor, channel by
  channel (a downscale runs in row chunks). Values are bit-identical to
  ``to_nchw(letterbox.apply(image_to_rgb_float(msg)))``, without its four full-size temporaries.
* :func:`frame_bytes` is what the node holds for one frame outside its engine; the node hands
  its engine ``budget - frame_bytes`` (see docs/budget.md, "node memory").
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dynnet_ros.nodes.convert import IMAGE_ENCODINGS
from dynnet_ros.nodes.geometry import Letterbox, _axis_weights
from dynnet_ros.units import to_mb

#: Output rows per chunk when a frame is downscaled: bounds the resize temporaries to a few
#: rows (~10 x CHUNK_ROWS x width x 4 bytes) instead of several full images.
CHUNK_ROWS = 32
#: Camera messages alive at once in the worst case: the DDS reader's history (keep-last 1), the
#: C message and its Python copy while rclpy converts the next frame, and the one-slot mailbox.
#: The frame being processed is released before the engine runs.
MESSAGE_COPIES = 4
#: Resize temporaries per chunk, in float32 rows of the wider of source and target width.
SCRATCH_ROWS_FACTOR = 10

_DIVISORS = {"rgb8": 255.0, "bgr8": 255.0, "rgba8": 255.0, "bgra8": 255.0, "mono8": 255.0,
             "mono16": 65535.0, "16UC1": 65535.0}


def channel_views(array: np.ndarray, encoding: str) -> list[np.ndarray]:
    """The R, G, B source planes of an ``image_to_array`` result (views, no copies)."""
    if encoding in ("rgb8", "rgba8"):
        return [array[:, :, 0], array[:, :, 1], array[:, :, 2]]
    if encoding in ("bgr8", "bgra8"):
        return [array[:, :, 2], array[:, :, 1], array[:, :, 0]]
    if encoding in IMAGE_ENCODINGS:  # one channel, repeated as R, G and B
        return [array, array, array]
    raise ValueError(f"unsupported image encoding '{encoding}'")


def _normalise(src: np.ndarray, encoding: str, out: np.ndarray | None = None) -> np.ndarray:
    """Camera values -> float32 in [0, 1], exactly as ``image_to_rgb_float`` computes them."""
    if encoding == "32FC1":
        return np.clip(src, 0.0, 1.0, out=out) if out is not None else np.clip(src, 0.0, 1.0)
    divisor = np.float32(_DIVISORS[encoding])
    if out is None:
        return np.divide(src, divisor, dtype=np.float32)
    return np.divide(src, divisor, out=out, dtype=np.float32)


def check_float_image(array: np.ndarray, encoding: str) -> None:
    """32FC1 frames must be finite (the integer encodings always are)."""
    if encoding == "32FC1" and not np.all(np.isfinite(array)):
        bad = int(np.count_nonzero(~np.isfinite(array)))
        raise ValueError(f"32FC1 image has {bad} NaN/inf pixel(s) of {array.size}")


def resize_plane_into(src: np.ndarray, out: np.ndarray, convert=None, chunk_rows: int = CHUNK_ROWS) -> None:
    """Bilinear resize of a 2-D plane into ``out`` (float32), in row chunks.

    Same arithmetic as ``geometry.resize_bilinear`` (half-pixel centres, float32), so results
    are bit-identical; ``convert`` maps gathered source rows to float32 first (normalisation).
    """
    convert = convert or (lambda rows: rows.astype(np.float32, copy=False))
    height, width = out.shape
    if src.shape == out.shape:
        out[...] = convert(src)
        return
    lo_y, hi_y, fy = _axis_weights(src.shape[0], height)
    lo_x, hi_x, fx = _axis_weights(src.shape[1], width)
    one_fx = 1.0 - fx[None, :]
    fx = fx[None, :]
    for r0 in range(0, height, chunk_rows):
        r1 = min(height, r0 + chunk_rows)
        wy = fy[r0:r1, None]
        rows = convert(src[lo_y[r0:r1]]) * (1.0 - wy) + convert(src[hi_y[r0:r1]]) * wy
        out[r0:r1] = rows[:, lo_x] * one_fx + rows[:, hi_x] * fx


def to_source_lean(letterbox: Letterbox, model_map: np.ndarray) -> np.ndarray:
    """``letterbox.to_source`` without a copy when the frame was not rescaled (a crop view), and
    with chunked temporaries when it was; same values."""
    if model_map.shape[:2] != (letterbox.pad_h, letterbox.pad_w):
        raise ValueError(f"expected a {letterbox.pad_w}x{letterbox.pad_h} map, got "
                         f"{model_map.shape[1]}x{model_map.shape[0]}")
    crop = model_map[: letterbox.new_h, : letterbox.new_w]
    if crop.shape == (letterbox.src_h, letterbox.src_w):
        return crop
    out = np.empty((letterbox.src_h, letterbox.src_w), dtype=np.float32)
    resize_plane_into(crop, out)
    return out


class InputBuffer:
    """One reused ``1 x C x H x W`` float32 tensor per model input (reallocated on a new size)."""

    def __init__(self, channels: int) -> None:
        self.channels = channels
        self.array: np.ndarray | None = None

    def get(self, height: int, width: int) -> np.ndarray:
        shape = (1, self.channels, height, width)
        if self.array is None or self.array.shape != shape:
            self.array = None  # drop the old size before allocating the new one
            self.array = np.empty(shape, dtype=np.float32)
        return self.array

    @property
    def nbytes(self) -> int:
        return 0 if self.array is None else self.array.nbytes

    def fill_image(self, array: np.ndarray, encoding: str, letterbox: Letterbox, pad_value: float) -> np.ndarray:
        """Letterboxed, normalised RGB of ``array`` (an ``image_to_array`` view) in the buffer."""
        if array.shape[:2] != (letterbox.src_h, letterbox.src_w):
            raise ValueError(f"letterbox planned for {letterbox.src_w}x{letterbox.src_h}, got "
                             f"{array.shape[1]}x{array.shape[0]}")
        check_float_image(array, encoding)
        out = self.get(letterbox.pad_h, letterbox.pad_w)
        h, w = letterbox.new_h, letterbox.new_w
        for c, plane in enumerate(channel_views(array, encoding)):
            dst = out[0, c]
            if (h, w) == plane.shape:
                _normalise(plane, encoding, out=dst[:h, :w])
            else:
                resize_plane_into(plane, dst[:h, :w], convert=lambda rows: _normalise(rows, encoding))
            dst[h:, :] = pad_value
            dst[:h, w:] = pad_value
        return out


@dataclass(frozen=True)
class FrameBytes:
    """What a model node holds for one frame outside its engine, in bytes (see module doc)."""

    messages: int   # MESSAGE_COPIES camera messages
    inputs: int     # the reused model-input tensors the node fills
    scratch: int    # downscale temporaries (preprocessing only)
    outputs: int    # post-processing arrays and the output message (after the engine ran)

    @property
    def total(self) -> int:
        # scratch and outputs are never alive together, nor while the engine runs
        return self.messages + self.inputs + max(self.scratch, self.outputs)

    @property
    def total_mb(self) -> float:
        return to_mb(self.total)


def frame_bytes(message_bytes: int, letterbox: Letterbox, *, input_channels: int = 3,
                output_bytes_per_pixel: float = 0.0, output_const_bytes: int = 0,
                scaled_output_bytes_per_pixel: float = 0.0) -> FrameBytes:
    """The node's own frame memory for a camera message of ``message_bytes`` letterboxed as
    ``letterbox``; ``output_bytes_per_pixel`` is per camera pixel (the task's post-processing),
    ``scaled_output_bytes_per_pixel`` what mapping a downscaled result back adds."""
    scaled = (letterbox.new_h, letterbox.new_w) != (letterbox.src_h, letterbox.src_w)
    pixels = letterbox.src_h * letterbox.src_w
    scratch = 0
    outputs = int(output_bytes_per_pixel * pixels) + output_const_bytes
    if scaled:
        scratch = SCRATCH_ROWS_FACTOR * CHUNK_ROWS * max(letterbox.src_w, letterbox.new_w) * 4
        if scaled_output_bytes_per_pixel:
            outputs += int(scaled_output_bytes_per_pixel * pixels) + scratch
    return FrameBytes(messages=MESSAGE_COPIES * int(message_bytes),
                      inputs=input_channels * letterbox.pad_h * letterbox.pad_w * 4,
                      scratch=scratch, outputs=outputs)


__all__ = ["CHUNK_ROWS", "MESSAGE_COPIES", "FrameBytes", "InputBuffer", "channel_views", "check_float_image",
           "frame_bytes", "resize_plane_into", "to_source_lean"]
