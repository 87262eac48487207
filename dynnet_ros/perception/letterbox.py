"""Fit a camera frame into a model input and map the model's results back to camera pixels.

Why one module: the mapping source -> input (scale, pad) and its inverse (boxes, dense maps,
camera intrinsics) must agree exactly, or boxes drift by the padding and depth lands on the
wrong pixels. Plain numpy; bilinear sampling uses half-pixel centres, the convention of ONNX
Resize and OpenCV's INTER_LINEAR that the model publishers' own preprocessing uses.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

#: Output rows per chunk when a plane is resized: bounds the temporaries to a few rows.
CHUNK_ROWS = 32


def axis_weights(src: int, dst: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Half-pixel-centre bilinear sampling positions along one axis: (low, high, fraction)."""
    pos = (np.arange(dst, dtype=np.float64) + 0.5) * (src / dst) - 0.5
    pos = np.clip(pos, 0.0, src - 1)
    lo = np.floor(pos).astype(np.intp)
    hi = np.minimum(lo + 1, src - 1)
    frac = (pos - lo).astype(np.float32)
    return lo, hi, frac


def resize_plane_into(src: np.ndarray, out: np.ndarray,
                      convert: Callable[[np.ndarray], np.ndarray] | None = None,
                      chunk_rows: int = CHUNK_ROWS) -> None:
    """Bilinear resize of a 2-D plane into ``out`` (float), in row chunks.

    ``convert`` maps gathered source rows to float32 first (an affine normalisation commutes
    with bilinear interpolation, so normalising rows before blending equals normalising after).
    """
    def to_float(rows: np.ndarray) -> np.ndarray:
        return rows.astype(np.float32, copy=False)

    convert = convert or to_float
    height, width = out.shape
    if src.shape == out.shape:
        out[...] = convert(src)
        return
    if src.shape == (2 * height, 2 * width):
        _halve_into(src, out, convert, chunk_rows)
        return
    lo_y, hi_y, fy = axis_weights(src.shape[0], height)
    lo_x, hi_x, fx = axis_weights(src.shape[1], width)
    one_fx = 1.0 - fx[None, :]
    fx = fx[None, :]
    for r0 in range(0, height, chunk_rows):
        r1 = min(height, r0 + chunk_rows)
        wy = fy[r0:r1, None]
        rows = convert(src[lo_y[r0:r1]]) * (1.0 - wy) + convert(src[hi_y[r0:r1]]) * wy
        out[r0:r1] = rows[:, lo_x] * one_fx + rows[:, hi_x] * fx


def _halve_into(src: np.ndarray, out: np.ndarray, convert: Callable[[np.ndarray], np.ndarray],
                chunk_rows: int) -> None:
    """``resize_plane_into`` for a source exactly twice ``out``'s size on both axes: with
    half-pixel centres every output pixel samples the middle of a 2x2 block, so bilinear is the
    block's mean. Four strided adds instead of gathers and blends (a 640x480 camera into a
    320-side model input, or 1280x720 into 640)."""
    height = out.shape[0]
    for r0 in range(0, height, chunk_rows):
        r1 = min(height, r0 + chunk_rows)
        top, bottom = src[2 * r0: 2 * r1: 2], src[2 * r0 + 1: 2 * r1: 2]
        block = np.add(top[:, 0::2], top[:, 1::2], dtype=np.float32)
        block += bottom[:, 0::2]
        block += bottom[:, 1::2]
        block *= np.float32(0.25)
        out[r0:r1] = convert(block)


def resize_bilinear(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """Bilinear resize of an HxW or HxWxC array to height x width (float32 out)."""
    if image.ndim not in (2, 3):
        raise ValueError(f"resize expects an HxW or HxWxC array, got shape {list(image.shape)}")
    if height <= 0 or width <= 0:
        raise ValueError(f"resize target must be positive, got {height}x{width}")
    if image.ndim == 2:
        out: np.ndarray = np.empty((height, width), dtype=np.float32)
        resize_plane_into(image, out)
        return out
    out = np.empty((height, width, image.shape[2]), dtype=np.float32)
    for c in range(image.shape[2]):
        plane = np.empty((height, width), dtype=np.float32)
        resize_plane_into(image[:, :, c], plane)
        out[:, :, c] = plane
    return out


def resize_nearest(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """Nearest-neighbour resize (class maps: labels must not be blended)."""
    rows = np.minimum(((np.arange(height) + 0.5) * image.shape[0] / height).astype(np.intp), image.shape[0] - 1)
    cols = np.minimum(((np.arange(width) + 0.5) * image.shape[1] / width).astype(np.intp), image.shape[1] - 1)
    return image[rows[:, None], cols[None, :]]


@dataclass(frozen=True)
class Letterbox:
    """How a camera frame became a model input: resize to new_h x new_w, place at (top, left), pad
    to pad_h x pad_w. Coordinates map exactly as the resize samples: x_input = x * scale_x + left
    (continuous pixel coordinates, pixel i spanning [i, i + 1])."""

    src_h: int
    src_w: int
    new_h: int   # size after scaling, before padding
    new_w: int
    top: int     # padding above / left of the scaled frame
    left: int
    pad_h: int   # model input size
    pad_w: int

    @property
    def input_shape(self) -> tuple[int, int]:
        return self.pad_h, self.pad_w

    @property
    def scale_x(self) -> float:
        return self.new_w / self.src_w

    @property
    def scale_y(self) -> float:
        return self.new_h / self.src_h

    @property
    def scale(self) -> float:
        """The larger of the two axis scales (they differ only by rounding unless stretched)."""
        return max(self.scale_x, self.scale_y)

    def boxes_to_source(self, boxes: np.ndarray) -> np.ndarray:
        """(N,4) x1,y1,x2,y2 in model-input pixels -> source pixels, clipped to the frame."""
        out = np.array(boxes, dtype=np.float32).reshape(-1, 4)
        out[:, [0, 2]] = (out[:, [0, 2]] - np.float32(self.left)) / np.float32(self.scale_x)
        out[:, [1, 3]] = (out[:, [1, 3]] - np.float32(self.top)) / np.float32(self.scale_y)
        out[:, [0, 2]] = np.clip(out[:, [0, 2]], 0, self.src_w)
        out[:, [1, 3]] = np.clip(out[:, [1, 3]], 0, self.src_h)
        return out

    def content(self, map_h: int, map_w: int) -> tuple[slice, slice]:
        """Rows and columns of a ``map_h x map_w`` model output that cover the frame (outputs at a
        fraction of the input resolution, e.g. stride 4, are cropped proportionally)."""
        fy, fx = map_h / self.pad_h, map_w / self.pad_w
        r0, c0 = int(round(self.top * fy)), int(round(self.left * fx))
        r1 = max(r0 + 1, int(round((self.top + self.new_h) * fy)))
        c1 = max(c0 + 1, int(round((self.left + self.new_w) * fx)))
        return slice(r0, min(r1, map_h)), slice(c0, min(c1, map_w))

    def to_source(self, model_map: np.ndarray) -> np.ndarray:
        """Model-output HxW map -> source-size float32 map (crop the padding, bilinear rescale).

        Returns a view of ``model_map`` when no rescale is needed (no copy)."""
        if model_map.ndim != 2:
            raise ValueError(f"expected an HxW map, got shape {list(model_map.shape)}")
        rows, cols = self.content(*model_map.shape)
        crop = model_map[rows, cols]
        if crop.shape == (self.src_h, self.src_w) and crop.dtype == np.float32:
            return crop
        out = np.empty((self.src_h, self.src_w), dtype=np.float32)
        resize_plane_into(crop, out)
        return out

    def labels_to_source(self, label_map: np.ndarray) -> np.ndarray:
        """Model-output HxW class map -> source size, nearest neighbour."""
        rows, cols = self.content(*label_map.shape)
        return resize_nearest(label_map[rows, cols], self.src_h, self.src_w)

    def padded_to(self, pad_h: int, pad_w: int, center: bool) -> Letterbox:
        """The same scaled frame in a larger ``pad_h x pad_w`` input (a batch's shared size):
        the extra padding is split as ``plan_letterbox`` splits it (``center``), else goes to the
        bottom/right, so the frame's pixels keep their scale."""
        if pad_h < self.pad_h or pad_w < self.pad_w:
            raise ValueError(f"a {self.pad_h}x{self.pad_w} input cannot be padded to {pad_h}x{pad_w}")
        top, left = self.top, self.left
        if center:
            top = int(round((pad_h - self.new_h) / 2 - 0.1))
            left = int(round((pad_w - self.new_w) / 2 - 0.1))
        return Letterbox(self.src_h, self.src_w, self.new_h, self.new_w, top, left, pad_h, pad_w)

    def scale_intrinsics(self, k: np.ndarray) -> np.ndarray:
        """Camera matrix of the model input (scaled frame plus its offset), half-pixel centres."""
        k = np.array(k, dtype=np.float64).reshape(3, 3)
        sx, sy = self.new_w / self.src_w, self.new_h / self.src_h
        out = k.copy()
        out[0, 0] *= sx
        out[0, 1] *= sx
        out[0, 2] = (k[0, 2] + 0.5) * sx - 0.5 + self.left
        out[1, 1] *= sy
        out[1, 2] = (k[1, 2] + 0.5) * sy - 0.5 + self.top
        return out


def plan_letterbox(height: int, width: int, *, target: tuple[int, int] | None, fixed: bool = False,
                   multiple: int = 1, scaleup: bool = True, center: bool = False,
                   stretch: bool = False) -> Letterbox:
    """Plan how a ``height x width`` frame becomes a model input.

    ``target``: the (H, W) box the frame is fitted into keeping its aspect ratio (None: keep the
    frame's size). ``fixed``: the input is exactly ``target`` (padding fills the rest); otherwise
    the scaled frame is padded up to multiples of ``multiple`` (dynamic-input models).
    ``scaleup``: frames smaller than ``target`` are enlarged (else only shrunk). ``center``:
    split the padding evenly (Ultralytics) instead of all at the bottom/right. ``stretch``:
    resize to ``target`` exactly, ignoring the aspect ratio (fixed inputs), or scale as above and
    round each side to the nearest multiple, with no padding (dynamic inputs).
    """
    if height <= 0 or width <= 0:
        raise ValueError(f"image size must be positive, got {width}x{height}")
    if multiple <= 0:
        raise ValueError(f"multiple must be positive, got {multiple}")
    if target is not None and (target[0] <= 0 or target[1] <= 0):
        raise ValueError(f"target size must be positive, got {target}")
    if fixed and target is None:
        raise ValueError("a fixed input needs a target size")
    if stretch and target is None:
        raise ValueError("stretching needs a target size")
    if stretch and fixed and target is not None:
        th, tw = target
        return Letterbox(height, width, th, tw, 0, 0, th, tw)
    scale = 1.0
    if target is not None:
        scale = min(target[0] / height, target[1] / width)
        if not scaleup:
            scale = min(scale, 1.0)
    if stretch:  # dynamic input (PaddleOCR, DPT): keep the aspect, round each side to the multiple
        th = max(multiple, int(round(height * scale / multiple)) * multiple)
        tw = max(multiple, int(round(width * scale / multiple)) * multiple)
        return Letterbox(height, width, th, tw, 0, 0, th, tw)
    new_h = max(1, int(round(height * scale)))
    new_w = max(1, int(round(width * scale)))
    if fixed and target is not None:
        pad_h, pad_w = target
    else:
        pad_h = -(-new_h // multiple) * multiple
        pad_w = -(-new_w // multiple) * multiple
    top = left = 0
    if center:  # Ultralytics' rounding: the odd pixel goes to the bottom/right
        top = int(round((pad_h - new_h) / 2 - 0.1))
        left = int(round((pad_w - new_w) / 2 - 0.1))
    return Letterbox(height, width, new_h, new_w, top, left, pad_h, pad_w)
