"""Camera frame (HxWx3 uint8 RGB) -> the tensor a model takes, from its signature, metadata and options.

What varies between exports: fixed or dynamic input size (letterbox to the fixed size, or fit
into a target and pad to a stride multiple), channel order, value scale, per-channel mean/std,
NCHW or NHWC, and float32/float16/uint8 element types. Each is decided once, at construction,
from (in order) the caller's option, the model's metadata, the format's default; an option the
model contradicts is a ValueError then, never a wrong tensor later.
"""
from __future__ import annotations

import ast
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dynnet_ros.perception.letterbox import Letterbox, plan_letterbox, resize_plane_into
from dynnet_ros.perception.model_info import TensorInfo, static

#: layout -> (rank, channel axis, height axis, width axis); CHW: unbatched (torchvision detectors)
LAYOUTS: dict[str, tuple[int, int, int, int]] = {"NCHW": (4, 1, 2, 3), "NHWC": (4, 3, 1, 2), "CHW": (3, 0, 1, 2)}
CHANNEL_ORDERS = ("RGB", "BGR")
RESIZE_MODES = ("letterbox", "stretch")
PAD_POSITIONS = ("center", "bottom-right")
DTYPES = (np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.uint8))
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class PreprocessDefaults:
    """A format's preprocessing when neither the caller nor the metadata says otherwise."""

    channel_order: str = "RGB"
    scale: float = 1.0                      # model value of a 255 pixel before mean/std
    mean: tuple[float, float, float] = (0.0, 0.0, 0.0)   # on the [0, 1] scale
    std: tuple[float, float, float] = (1.0, 1.0, 1.0)
    input_size: int | tuple[int, int] = 640   # dynamic inputs: box the frame is fitted into (0 = as is)
    multiple: int = 32                       # dynamic inputs: pad to multiples of this
    scaleup: bool = True                     # enlarge frames smaller than the target
    center: bool = True                      # split the padding (else bottom/right)
    resize: str = "letterbox"
    pad_value: float | None = 114.0          # pixel units; None = zero after normalisation


@dataclass(frozen=True)
class PreprocessOptions:
    """The caller's overrides; None = metadata, else the format's default."""

    channel_order: str | None = None
    scale: float | None = None
    mean: Sequence[float] | None = None
    std: Sequence[float] | None = None
    layout: str | None = None
    input_size: int | Sequence[int] | None = None
    input_multiple: int | None = None
    resize: str | None = None
    pad_value: float | None = None
    pad_position: str | None = None


@dataclass(frozen=True)
class Preprocess:
    """The decided preprocessing of one model input (see the module docstring)."""

    input_name: str
    layout: str
    channel_order: str
    scale: float
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    dtype: np.dtype
    target: tuple[int, int] | None   # fixed input size, or the box a dynamic input fits frames into
    fixed: bool
    multiple: int
    scaleup: bool
    center: bool
    stretch: bool
    pad_value: float | None

    def plan(self, height: int, width: int) -> Letterbox:
        return plan_letterbox(height, width, target=self.target, fixed=self.fixed, multiple=self.multiple,
                              scaleup=self.scaleup, center=self.center, stretch=self.stretch)

    def describe(self) -> str:
        size = f"fixed {self.target[0]}x{self.target[1]}" if self.fixed and self.target else \
            f"dynamic, fit into {self.target[0]}x{self.target[1]}" if self.target else "dynamic, frame size"
        norm = "" if self.mean == (0.0, 0.0, 0.0) and self.std == (1.0, 1.0, 1.0) else \
            f", mean {list(self.mean)} std {list(self.std)}"
        return (f"{self.input_name}: {self.layout} {self.dtype.name} {self.channel_order}, {size}"
                f"{'' if self.fixed else f' (multiple of {self.multiple})'}, "
                f"{'stretch' if self.stretch else 'letterbox'}, scale {self.scale:g}{norm}")

    def tensor_shape(self, box: Letterbox, batch: int = 1) -> tuple[int, ...]:
        """The input tensor's shape for ``batch`` frames placed as ``box`` (CHW inputs: batch 1)."""
        rank, channel_axis, h_axis, w_axis = LAYOUTS[self.layout]
        if rank == 3 and batch != 1:
            raise ValueError(f"input {self.input_name} is unbatched ({self.layout}): one frame per run, "
                             f"not {batch}")
        shape = [1] * rank
        shape[channel_axis], shape[h_axis], shape[w_axis] = 3, box.pad_h, box.pad_w
        if rank == 4:
            shape[0] = batch
        return tuple(shape)

    def _plane(self, out: np.ndarray, channel: int) -> np.ndarray:
        """The HxW view of one channel in a one-frame tensor of this layout."""
        if self.layout == "NCHW":
            return out[0, channel]
        if self.layout == "NHWC":
            return out[0, :, :, channel]
        return out[channel]

    def _affine(self) -> tuple[np.ndarray, np.ndarray]:
        """Per model channel: value = pixel / divisor - offset (the normalisation as one affine map)."""
        std = np.asarray(self.std, dtype=np.float64)
        divisor = 255.0 * std / self.scale
        offset = np.asarray(self.mean, dtype=np.float64) * self.scale / std
        if self.channel_order == "BGR":
            divisor, offset = divisor[::-1], offset[::-1]
        return divisor.astype(np.float32), offset.astype(np.float32)

    def __call__(self, frame: np.ndarray, out: np.ndarray | None = None) -> tuple[np.ndarray, Letterbox]:
        """The model-input tensor of ``frame`` and how it was placed. ``out``: a float32 buffer of
        the tensor's shape to reuse (ignored when the shape differs)."""
        check_frame(frame)
        box = self.plan(frame.shape[0], frame.shape[1])
        shape = self.tensor_shape(box)
        if out is None or out.shape != shape or out.dtype != np.float32:
            out = np.empty(shape, dtype=np.float32)
        self.fill(frame, box, out)
        return self.cast(out), box

    def fill(self, frame: np.ndarray, box: Letterbox, out: np.ndarray) -> None:
        """Write ``frame`` placed as ``box`` into ``out``, a float32 one-frame tensor of this layout
        (for a batch: its ``[i:i + 1]`` slice), padding included."""
        divisor, offset = self._affine()
        sources = (0, 1, 2) if self.channel_order == "RGB" else (2, 1, 0)
        for c, src_c in enumerate(sources):
            plane = self._plane(out, c)
            d, o = divisor[c], offset[c]

            def convert(rows: np.ndarray, d: np.float32 = d, o: np.float32 = o) -> np.ndarray:
                return np.subtract(np.divide(rows, d, dtype=np.float32), o, dtype=np.float32)

            inner = plane[box.top: box.top + box.new_h, box.left: box.left + box.new_w]
            source = frame[:, :, src_c]
            if source.shape == inner.shape:   # no resize: normalised straight into the tensor, no temporaries
                np.divide(source, d, out=inner, dtype=np.float32)
                np.subtract(inner, o, out=inner, dtype=np.float32)
            else:
                resize_plane_into(source, inner, convert=convert)
            fill = np.float32(0.0 if self.pad_value is None else np.float32(self.pad_value) / d - o)
            plane[: box.top] = fill
            plane[box.top + box.new_h:] = fill
            plane[box.top: box.top + box.new_h, : box.left] = fill
            plane[box.top: box.top + box.new_h, box.left + box.new_w:] = fill

    def cast(self, tensor: np.ndarray) -> np.ndarray:
        """A filled float32 tensor in the input's element type (itself when that is float32)."""
        if self.dtype == np.uint8:
            return np.clip(np.rint(tensor), 0, 255).astype(np.uint8)
        if self.dtype != np.float32:
            return tensor.astype(self.dtype)
        return tensor


def check_frame(frame: np.ndarray) -> None:
    if not isinstance(frame, np.ndarray) or frame.ndim != 3 or frame.shape[2] != 3 or frame.dtype != np.uint8:
        got = f"{frame.dtype} array of shape {list(frame.shape)}" if isinstance(frame, np.ndarray) \
            else type(frame).__name__
        raise ValueError(f"a frame must be an HxWx3 uint8 RGB array, got {got}")
    if frame.shape[0] == 0 or frame.shape[1] == 0:
        raise ValueError(f"a frame must not be empty, got shape {list(frame.shape)}")


def _literal(metadata: dict[str, str], key: str) -> object | None:
    if key not in metadata:
        return None
    try:
        return ast.literal_eval(metadata[key].strip())
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        raise ValueError(f"model metadata '{key}' is not a literal: {metadata[key][:60]!r}") from None


def _triple(value: object, what: str) -> tuple[float, float, float]:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = (value,) * 3
    try:
        out = [float(v) for v in value]  # type: ignore[attr-defined]  # any iterable; errors below
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be 3 numbers (one per channel), got {value!r}") from None
    if len(out) != 3 or not all(np.isfinite(out)):
        raise ValueError(f"{what} must be 3 finite numbers (one per channel), got {value!r}")
    return out[0], out[1], out[2]


def _size(value: object, what: str) -> tuple[int, int] | None:
    """An int (square box; 0 = keep the frame size) or (H, W) -> (H, W) or None."""
    if isinstance(value, bool):
        raise ValueError(f"{what} must be an int or (height, width), got {value!r}")
    if isinstance(value, (int, np.integer)):
        if value < 0:
            raise ValueError(f"{what} must be >= 0, got {value}")
        return None if value == 0 else (int(value), int(value))
    try:
        pair = [int(v) for v in value]  # type: ignore[attr-defined]  # any iterable; errors below
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be an int or (height, width), got {value!r}") from None
    if len(pair) != 2 or min(pair) <= 0:
        raise ValueError(f"{what} must be (height, width) with positive sizes, got {value!r}")
    return pair[0], pair[1]


def _layout(spec: TensorInfo, option: str | None) -> str:
    """The layout of image input ``spec``: the option when the input allows it, else the one
    layout whose channel axis is a fixed 3 (NCHW when the channel axis is dynamic)."""
    if option is not None and option not in LAYOUTS:
        raise ValueError(f"layout must be one of {list(LAYOUTS)}, got {option!r}")
    fits = [name for name, (rank, axis, _, _) in LAYOUTS.items()
            if spec.rank == rank and static(spec.dims[axis]) in (3, None)]
    static_fits = [name for name in fits if static(spec.dims[LAYOUTS[name][1]]) == 3]
    if option is not None:
        if option not in fits:
            raise ValueError(f"layout {option} contradicts the model's input {spec.describe()}")
        return option
    if len(static_fits) == 1:
        return static_fits[0]
    if not fits:
        raise ValueError(f"image input {spec.describe()} is not NCHW, NHWC or CHW with 3 channels")
    return fits[0]


def build_preprocess(spec: TensorInfo, metadata: dict[str, str], defaults: PreprocessDefaults,
                     options: PreprocessOptions) -> Preprocess:
    """Decide the preprocessing for image input ``spec``; ValueError for contradictions."""
    layout = _layout(spec, options.layout)
    if spec.dtype not in DTYPES:
        raise ValueError(f"image input {spec.describe()} has element type {spec.dtype}; supported: "
                         f"{', '.join(d.name for d in DTYPES)}")
    order = options.channel_order or _literal_str(metadata, "channel_order") or defaults.channel_order
    order = order.upper()
    if order not in CHANNEL_ORDERS:
        raise ValueError(f"channel_order must be one of {list(CHANNEL_ORDERS)}, got {order!r}")
    scale = options.scale if options.scale is not None else _literal(metadata, "scale")
    scale = defaults.scale if scale is None else scale
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not np.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale must be a positive number, got {scale!r}")
    mean_value = options.mean if options.mean is not None else _literal(metadata, "mean")
    std_value = options.std if options.std is not None else _literal(metadata, "std")
    mean = defaults.mean if mean_value is None else _triple(mean_value, "mean")
    std = defaults.std if std_value is None else _triple(std_value, "std")
    if min(std) <= 0:
        raise ValueError(f"std must be positive per channel, got {list(std)}")
    if spec.dtype == np.uint8:  # raw pixels: nothing to scale or normalise
        if (options.scale not in (None, 255, 255.0) or options.mean is not None or options.std is not None):
            raise ValueError(f"image input {spec.describe()} takes uint8 pixels: scale must be 255 and "
                             "mean/std unset")
        scale, mean, std = 255.0, (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)
    resize = options.resize or defaults.resize
    if resize not in RESIZE_MODES:
        raise ValueError(f"resize must be one of {list(RESIZE_MODES)}, got {resize!r}")
    _, _, h_axis, w_axis = LAYOUTS[layout]
    height, width = static(spec.dims[h_axis]), static(spec.dims[w_axis])
    fixed = height is not None and width is not None
    requested = None if options.input_size is None else _size(options.input_size, "input_size")
    multiple = options.input_multiple
    if multiple is not None and (isinstance(multiple, bool) or not isinstance(multiple, int) or multiple < 1):
        raise ValueError(f"input_multiple must be an int >= 1, got {multiple!r}")
    if height is not None and width is not None:
        target: tuple[int, int] | None = (height, width)
        if options.input_size is not None and requested != target:
            raise ValueError(f"input_size {options.input_size!r} contradicts the model's fixed input "
                             f"{spec.describe()}")
        if multiple is not None:
            raise ValueError(f"input_multiple applies to dynamic inputs; {spec.describe()} is fixed")
    else:
        if options.input_size is not None:
            target = requested
        else:
            meta_size = _literal(metadata, "imgsz")
            target = _size(meta_size if meta_size is not None else defaults.input_size, "input size")
        if multiple is None:
            stride = _literal(metadata, "stride")
            multiple = int(stride) if isinstance(stride, int) and stride > 0 else defaults.multiple
    if resize == "stretch" and target is None:
        raise ValueError(f"resize 'stretch' needs a size to stretch to; give input_size for {spec.describe()}")
    pad_value = options.pad_value if options.pad_value is not None else defaults.pad_value
    if pad_value is not None and (isinstance(pad_value, bool) or not isinstance(pad_value, (int, float))
                                  or not 0.0 <= pad_value <= 255.0):
        raise ValueError(f"pad_value must be a pixel value in [0, 255], got {pad_value!r}")
    if options.pad_position is not None and options.pad_position not in PAD_POSITIONS:
        raise ValueError(f"pad_position must be one of {list(PAD_POSITIONS)}, got {options.pad_position!r}")
    center = defaults.center if options.pad_position is None else options.pad_position == "center"
    return Preprocess(input_name=spec.name, layout=layout, channel_order=order, scale=float(scale), mean=mean,
                      std=std, dtype=spec.dtype, target=target, fixed=fixed, multiple=int(multiple or 1),
                      scaleup=defaults.scaleup, center=center, stretch=resize == "stretch",
                      pad_value=pad_value)


def _literal_str(metadata: dict[str, str], key: str) -> str | None:
    value = metadata.get(key)
    return value.strip().strip("'\"") if value else None


__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "Preprocess", "PreprocessDefaults", "PreprocessOptions",
           "build_preprocess", "check_frame"]
