"""Choosing a model format: each format says whether a model's signature fits it, and why.

``auto`` takes the one format that fits best. Formats recognised by names or metadata (the
zoo's input names, Ultralytics' ``end2end`` flag) outrank formats recognised by shapes alone;
when several fit equally well the model is ambiguous and the error lists them, so the user
names one — a wrong guess would decode garbage silently.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from dynnet_ros.perception.model_info import Dim, ModelInfo, TensorInfo, static
from dynnet_ros.perception.preprocess import PreprocessDefaults

#: fit strength: recognised by shapes only / by names or metadata
BY_SHAPE = 1
BY_NAME = 2


@dataclass(frozen=True)
class Fit:
    """Whether a model fits a format, with the reason either way."""

    ok: bool
    reason: str
    strength: int = BY_SHAPE


def no(reason: str) -> Fit:
    return Fit(False, reason)


class Format(Protocol):
    name: str
    summary: str

    def fit(self, info: ModelInfo, names: Sequence[str] | None) -> Fit: ...

    def image_input(self, info: ModelInfo) -> TensorInfo: ...

    def defaults(self) -> PreprocessDefaults: ...


F = TypeVar("F", bound=Format)


@dataclass(frozen=True)
class Choice:
    """The decided format and the sentence that explains it (logged, shown in diagnostics)."""

    name: str
    reason: str


def choose(task: str, requested: str, formats: Mapping[str, F], info: ModelInfo,
           names: Sequence[str] | None) -> tuple[F, Choice]:
    """The format named by ``requested`` (checked against the model) or, for ``auto``, the one that
    fits best. ValueError: unknown name, a named format the model does not fit, no fit, a tie."""
    if not isinstance(requested, str):
        raise ValueError(f"model_format must be a string, got {requested!r}")
    choices = ", ".join(["auto", *formats])
    if requested != "auto":
        if requested not in formats:
            raise ValueError(f"unknown {task} model_format {requested!r}; choose one of {choices}")
        fit = formats[requested].fit(info, names)
        if not fit.ok:
            raise ValueError(f"model_format {requested!r} does not fit {info.path} ({info.describe()}): {fit.reason}")
        return formats[requested], Choice(requested, f"model_format {requested} (given): {fit.reason}")
    fits = {name: fmt.fit(info, names) for name, fmt in formats.items()}
    good = {name: fit for name, fit in fits.items() if fit.ok}
    if not good:
        why = "; ".join(f"{name}: {fit.reason}" for name, fit in fits.items())
        raise ValueError(f"no {task} format fits {info.path} ({info.describe()}) — {why}. "
                         f"Choose model_format from {choices}")
    best = max(fit.strength for fit in good.values())
    top = [name for name, fit in good.items() if fit.strength == best]
    if len(top) > 1:
        why = "; ".join(f"{name} ({good[name].reason})" for name in top)
        raise ValueError(f"ambiguous {task} model {info.path} ({info.describe()}): it fits {why}. "
                         f"Set model_format to one of {', '.join(top)}")
    return formats[top[0]], Choice(top[0], f"auto chose {top[0]}: {good[top[0]].reason}")


# ----------------------------------------------------------------- signature helpers

def image_inputs(info: ModelInfo) -> list[TensorInfo]:
    """Inputs that look like images: NCHW/NHWC (rank 4) or CHW (rank 3) with a 3-channel (or
    dynamic) channel axis."""
    def channels(t: TensorInfo, axis: int) -> bool:
        return static(t.dims[axis]) in (3, None)

    return [t for t in info.inputs if (t.rank == 4 and (channels(t, 1) or channels(t, 3)))
            or (t.rank == 3 and channels(t, 0))]


def single_image_input(info: ModelInfo) -> TensorInfo | str:
    """The model's one image input, or the reason there is not exactly one."""
    if len(info.inputs) != 1:
        return f"needs one image input, the model has {len(info.inputs)} inputs"
    images = image_inputs(info)
    if not images:
        return f"input {info.inputs[0].describe()} is not an NCHW, NHWC or CHW image"
    return images[0]


def image_and_output(info: ModelInfo, out: TensorInfo | str) -> TensorInfo | Fit:
    """``out`` (the output a format decodes, or why the model has none) when the model has one
    image input and that output, else the failed Fit saying which is missing."""
    image = single_image_input(info)
    if isinstance(image, str):
        return no(image)
    return no(out) if isinstance(out, str) else out


def dense_map_fit(info: ModelInfo, out: TensorInfo | str, reason: str) -> Fit:
    """The fit of a format with one image in and one dense map out (``out``, as for
    ``image_and_output``); ``reason`` says why it fits, ``{out}`` standing for the output."""
    found = image_and_output(info, out)
    if isinstance(found, Fit):
        return found
    why = dense_map(found)
    return no(why) if why else Fit(True, reason.format(out=found.describe()), BY_SHAPE)


def required_image_input(info: ModelInfo) -> TensorInfo:
    """The model's one image input; ValueError with the reason where there is not exactly one."""
    found = single_image_input(info)
    if isinstance(found, str):
        raise ValueError(found)
    return found


def batchless(dims: tuple[Dim, ...], rank: int) -> tuple[Dim, ...] | None:
    """``dims`` without a leading batch axis of 1 (or dynamic), when that leaves ``rank`` dims."""
    if len(dims) == rank:
        return dims
    if len(dims) == rank + 1 and (dims[0] in (1, None) or isinstance(dims[0], str)):
        return dims[1:]
    return None


def unbatch(array, rank: int, what: str):
    """An output array without its batch axis of 1 (ValueError for another batch size or rank)."""
    if array.ndim == rank + 1:
        if array.shape[0] != 1:
            raise ValueError(f"{what} has batch size {array.shape[0]}; one frame gives batch 1")
        return array[0]
    if array.ndim != rank:
        raise ValueError(f"{what} has shape {list(array.shape)}, expected rank {rank} "
                         f"(or {rank + 1} with a batch axis)")
    return array


#: a fixed spatial dim below this is a channel or class axis, not an image's height or width
MIN_MAP_SIDE = 32


def dense_map(out: TensorInfo) -> str | None:
    """None when ``out`` can be one dense map per pixel ([1, 1, H, W] or [1, H, W]), else why not."""
    dims = batchless(out.dims, 3) if out.rank == 4 else batchless(out.dims, 2) if out.rank == 3 else None
    if dims is None:
        return f"output {out.describe()} is not [1, 1, H, W] or [1, H, W]"
    if out.rank == 4 and static(dims[0]) not in (1, None):
        return f"output {out.describe()} has {dims[0]} channels, not one"
    return spatial_check(out)


def spatial_check(out: TensorInfo) -> str | None:
    """Why ``out``'s last two dims cannot be an image-sized map (None when they can)."""
    sides = [static(d) for d in out.dims[-2:]]
    small = [side for side in sides if side is not None and side < MIN_MAP_SIDE]
    return f"output {out.describe()} has a spatial side of {small[0]} px: not an image-sized map" if small else None
