"""Depth export formats: metric depth, relative inverse depth (made metric with LiDAR), the zoo's RGB+LiDAR model.

Metric and relative models have the same signature (an image in, one dense map out), so
``auto`` cannot tell them apart and asks; only the zoo model is recognised by its input names.
"""
from __future__ import annotations

from collections.abc import Sequence

from dynnet_ros.perception.formats.base import (
    BY_NAME,
    Fit,
    dense_map_fit,
    no,
    required_image_input,
)
from dynnet_ros.perception.model_info import ModelInfo, TensorInfo
from dynnet_ros.perception.preprocess import IMAGENET_MEAN, IMAGENET_STD, PreprocessDefaults

#: Depth-Anything / MiDaS (DPT) preprocessing: ImageNet normalisation, sides multiples of 14,
#: frames fitted into 518 px
DENSE_DEPTH_DEFAULTS = PreprocessDefaults(mean=IMAGENET_MEAN, std=IMAGENET_STD, input_size=518, multiple=14,
                                          center=False, pad_value=None)
LIDAR_INPUT = "lidar_depth"


class DepthFormat:
    name = ""
    summary = ""
    relative = False      # output is relative inverse depth (needs the LiDAR fit)
    lidar_input = False   # the model takes the projected LiDAR as an input channel

    def image_input(self, info: ModelInfo) -> TensorInfo:
        return required_image_input(info)

    def defaults(self) -> PreprocessDefaults:
        return DENSE_DEPTH_DEFAULTS

    def output(self, info: ModelInfo) -> TensorInfo:
        return info.outputs[0]

    def fit(self, info: ModelInfo, names: Sequence[str] | None) -> Fit:
        return dense_map_fit(info, self.output(info), "one image input, dense output {out}")


class MetricDepth(DepthFormat):
    name = "metric"
    summary = "metric depth: image in, [1, 1, H, W] or [1, H, W] depth out (times depth_scale = metres)"


class RelativeInverseDepth(DepthFormat):
    name = "relative"
    summary = ("relative inverse depth (MiDaS / Depth-Anything): image in, [1, 1, H, W] or [1, H, W] out; "
               "made metric per frame by a robust scale-and-shift fit to the projected LiDAR points")
    relative = True


class ZooDepth(DepthFormat):
    name = "zoo"
    summary = ("dynnet_ros zoo depth model: inputs image and lidar_depth (the projected LiDAR, metres, 0 = no "
               "return, at the input's size), output depth [1, 1, H, W] in metres")
    lidar_input = True

    def fit(self, info: ModelInfo, names: Sequence[str] | None) -> Fit:
        if {t.name for t in info.inputs} != {"image", LIDAR_INPUT} or info.output("depth") is None:
            return no(f"needs inputs image, {LIDAR_INPUT} and output depth")
        return Fit(True, f"inputs image, {LIDAR_INPUT} and output depth (the zoo's depth signature)", BY_NAME)

    def image_input(self, info: ModelInfo) -> TensorInfo:
        spec = info.input("image")
        if spec is None:
            raise ValueError("the zoo depth format needs an input named 'image'")
        return spec

    def output(self, info: ModelInfo) -> TensorInfo:
        return info.output("depth") or info.outputs[0]

    def defaults(self) -> PreprocessDefaults:
        return PreprocessDefaults(input_size=640, multiple=32, scaleup=False, center=False, pad_value=0.0)


#: every depth format by name
DEPTH_FORMATS: dict[str, DepthFormat] = {f.name: f for f in (MetricDepth(), RelativeInverseDepth(), ZooDepth())}
