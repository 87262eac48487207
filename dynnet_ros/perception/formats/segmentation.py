"""Segmentation export formats: per-class logits, one-channel probabilities/logits, the zoo's lane model."""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import numpy as np

from dynnet_ros.perception.formats.base import (
    BY_NAME,
    BY_SHAPE,
    Fit,
    batchless,
    dense_map_fit,
    image_and_output,
    no,
    required_image_input,
    spatial_check,
)
from dynnet_ros.perception.model_info import ModelInfo, TensorInfo, static
from dynnet_ros.perception.preprocess import IMAGENET_MEAN, IMAGENET_STD, PreprocessDefaults

#: generic segmentation exports (torchvision, SegFormer, ...): ImageNet normalisation, padding
#: that normalises to zero, bottom/right padding
SEGMENTATION_DEFAULTS = PreprocessDefaults(mean=IMAGENET_MEAN, std=IMAGENET_STD, center=False, pad_value=None,
                                           input_size=640, multiple=32)


class SegmentationFormat(ABC):
    """Base: one image input; the output decoded is ``output_name`` (default: the model's first)."""

    name = ""
    summary = ""
    multiclass = False

    def __init__(self, output_name: str | None = None) -> None:
        self.output_name = output_name

    def output(self, info: ModelInfo) -> TensorInfo | str:
        if self.output_name is None:
            return info.outputs[0]
        found = info.output(self.output_name)
        if found is None:
            return f"no output named {self.output_name!r}; outputs: {', '.join(t.name for t in info.outputs)}"
        return found

    def image_input(self, info: ModelInfo) -> TensorInfo:
        return required_image_input(info)

    def defaults(self) -> PreprocessDefaults:
        return SEGMENTATION_DEFAULTS

    @abstractmethod
    def fit(self, info: ModelInfo, names: Sequence[str] | None) -> Fit:
        """Whether this format fits the model, with the reason and how strong the evidence is."""


def class_count(out: TensorInfo) -> int | None:
    """Fixed class-axis size of a [1, C, H, W] output, 1 for [1, H, W]; None otherwise."""
    if out.rank == 4 and batchless(out.dims, 3) is not None:
        return static(out.dims[1])
    if out.rank == 3 and batchless(out.dims, 2) is not None:
        return 1
    return None



class ClassLogits(SegmentationFormat):
    name = "logits"
    summary = "per-class scores [1, C, H, W], C >= 2 (softmax, argmax; class 0 = background by default)"
    multiclass = True

    def fit(self, info: ModelInfo, names: Sequence[str] | None) -> Fit:
        out = image_and_output(info, self.output(info))
        if isinstance(out, Fit):
            return out
        channels = class_count(out) if out.rank == 4 else None
        if channels is None or channels < 2:
            return no(f"output {out.describe()} is not [1, C, H, W] with a fixed C >= 2")
        why = spatial_check(out)
        if why:
            return no(why)
        if names and channels != len(names):
            return no(f"output {out.describe()} has {channels} classes, the model names {len(names)}")
        return Fit(True, f"output {out.describe()}: {channels} class channels", BY_SHAPE)


class BinaryMap(SegmentationFormat):
    name = "binary"
    summary = "one channel [1, 1, H, W] or [1, H, W] of probabilities, or logits (sigmoid when values leave [0, 1])"

    def fit(self, info: ModelInfo, names: Sequence[str] | None) -> Fit:
        return dense_map_fit(info, self.output(info), "output {out}: one channel")


class ZooLane(BinaryMap):
    name = "zoo"
    summary = "dynnet_ros zoo lane model: input image, output lane_prob [1, 1, H, W] probabilities"

    def __init__(self, output_name: str | None = None) -> None:
        super().__init__(output_name or "lane_prob")

    def fit(self, info: ModelInfo, names: Sequence[str] | None) -> Fit:
        if [t.name for t in info.inputs] != ["image"] or info.output("lane_prob") is None:
            return no("needs input image and output lane_prob")
        fit = super().fit(info, names)
        return Fit(True, "input image and output lane_prob (the zoo's lane signature)", BY_NAME) if fit.ok else fit

    def defaults(self) -> PreprocessDefaults:
        return PreprocessDefaults(input_size=640, multiple=32, scaleup=False, center=False, pad_value=0.0)


def segmentation_formats(output_name: str | None = None) -> dict[str, SegmentationFormat]:
    """Every segmentation format by name, decoding ``output_name`` (default: the first output)."""
    return {f.name: f for f in (ClassLogits(output_name), BinaryMap(output_name), ZooLane(output_name))}


def softmax(logits: np.ndarray, axis: int = 0) -> np.ndarray:
    shifted = np.exp(logits - logits.max(axis=axis, keepdims=True))
    return shifted / shifted.sum(axis=axis, keepdims=True)


def to_probability(values: np.ndarray) -> np.ndarray:
    """One-channel map -> probabilities: as is inside [0, 1], else through a sigmoid (logits)."""
    values = values.astype(np.float32, copy=False)
    if values.size and (float(values.min()) < 0.0 or float(values.max()) > 1.0):
        return (1.0 / (1.0 + np.exp(-values))).astype(np.float32)
    return values
