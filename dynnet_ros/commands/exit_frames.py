"""The user's frames for `dynnet map exits`: images from a directory or a bag, as model inputs.

Why here (not in the mapper): reading bags and deciding a model's preprocessing are the bags and
perception layers' jobs, which the mapper sits below; this module joins them for the command.
Frames go through the same format choice and preprocessing a perception node applies (a
dynamic-size model's frames fitted into ``--size``), so the exits learn what the node will feed.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib import image as mpimg

from dynnet_ros.bags.reader import Bag
from dynnet_ros.bags.writer import standard_typestore
from dynnet_ros.mapper.exit_heads import ExitTask
from dynnet_ros.nodes.convert import image_to_rgb8
from dynnet_ros.perception.formats.base import Format, choose, required_image_input
from dynnet_ros.perception.formats.detection import DETECTION_FORMATS, P5_STRIDES, P6_STRIDES, grid_cells
from dynnet_ros.perception.formats.segmentation import segmentation_formats
from dynnet_ros.perception.model_info import ModelInfo, TensorInfo, static
from dynnet_ros.perception.preprocess import Preprocess, PreprocessDefaults, PreprocessOptions, build_preprocess

#: image files a directory of frames may hold (PNG read by matplotlib itself, the others through Pillow)
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff")
IMAGE_TYPE = "sensor_msgs/msg/Image"


def _rgb8(image: np.ndarray) -> np.ndarray:
    if image.dtype != np.uint8:  # matplotlib reads PNGs as floats in 0..1
        image = np.round(np.clip(np.asarray(image, np.float64), 0.0, 1.0) * 255.0).astype(np.uint8)
    if image.ndim == 2:
        image = np.repeat(image[:, :, None], 3, axis=2)
    return np.ascontiguousarray(image[:, :, :3])


def read_frames(source: Path, topic: str | None = None, limit: int | None = None) -> list[np.ndarray]:
    """HxWx3 uint8 RGB frames: every image file of a directory (sorted by name) or every
    ``sensor_msgs/Image`` message of a bag's topic, at most ``limit`` spread evenly over them."""
    if source.is_dir() and not (source / "metadata.yaml").is_file():
        files = sorted(p for p in source.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        if not files:
            raise ValueError(f"{source}: no image files ({', '.join(IMAGE_SUFFIXES)}) in the directory")
        frames = []
        for path in _spread(files, limit):
            try:
                frames.append(_rgb8(mpimg.imread(path)))
            except (OSError, ValueError, SyntaxError) as exc:
                raise ValueError(f"{path}: not a readable image ({exc})") from None
        return frames
    with Bag(source) as bag:
        images = sorted(name for name, t in bag.topics.items() if t.msgtype == IMAGE_TYPE)
        if topic is None:
            if len(images) != 1:
                raise ValueError(f"bag {source}: {'no' if not images else 'several'} {IMAGE_TYPE} topics"
                                 f"{': ' + ', '.join(images) if images else ''}; name one with --topic")
            topic = images[0]
        if topic not in images:
            raise ValueError(f"bag {source}: no {IMAGE_TYPE} topic {topic}; it has {', '.join(images) or 'none'}")
        typestore = standard_typestore()
        messages = list(bag.messages(bag.plan([topic])))
        return [np.array(image_to_rgb8(typestore.deserialize_cdr(m.data, m.msgtype)))
                for m in _spread(messages, limit)]


def _spread(items: list, limit: int | None) -> list:
    if limit is None or len(items) <= limit:
        return items
    return [items[i] for i in np.linspace(0, len(items) - 1, limit).round().astype(int)]


@dataclass(frozen=True)
class ExitInputs:
    """How a model's frames become its inputs, and what its exit heads imitate."""

    task: ExitTask
    preprocess: Preprocess
    reason: str

    def feed(self, frame: np.ndarray) -> dict[str, np.ndarray]:
        tensor, _ = self.preprocess(frame)
        return {self.preprocess.input_name: np.array(tensor)}


def _try(task: str, formats: dict, info: ModelInfo) -> tuple[Format, str] | str:
    try:
        fmt, choice = choose(task, "auto", formats, info, None)
    except ValueError as exc:
        return str(exc)
    return fmt, choice.reason


def exit_inputs(info: ModelInfo, requested: str, size: tuple[int, int], score_threshold: float) -> ExitInputs:
    """The task (by the perception formats the nodes use) and preprocessing of ``info``'s model."""
    why: list[str] = []
    fmt: Format | None = None
    task: ExitTask | None = None
    reason = ""
    if requested in ("auto", "detector"):
        found = _try("detection", dict(DETECTION_FORMATS), info)
        if isinstance(found, str):
            why.append(found)
        elif found[0].name != "yolov8":
            why.append(f"detector format {found[0].name}: exit heads learn raw YOLOv8-style heads only")
        else:
            fmt, reason = found
            out = info.outputs[0]
            strides = _strides(out, size)
            task = ExitTask("presence", out.name, fmt.image_input(info).name, score_threshold, strides)
    if task is None and requested in ("auto", "segmenter"):
        found = _try("segmentation", dict(segmentation_formats()), info)
        if isinstance(found, str):
            why.append(found)
        elif getattr(found[0], "multiclass", False):
            why.append("segmenter with per-class scores: exit heads learn one-channel maps only")
        else:
            fmt, reason = found
            task = ExitTask("mask", info.outputs[0].name, fmt.image_input(info).name)
    if task is None and requested in ("auto", "classifier"):
        out = info.outputs[0]
        if len(out.dims) == 2 and (static(out.dims[1]) or 0) > 1:
            image = required_image_input(info)
            task = ExitTask("scores", out.name, image.name)
            reason = f"output {out.describe()}: class scores"
        else:
            why.append(f"classifier: output {out.describe()} is not [N, K] class scores")
    if task is None:
        raise ValueError(f"{info.path}: no exit head fits it as a {requested} model — " + "; ".join(why))
    image = fmt.image_input(info) if fmt is not None else required_image_input(info)
    defaults = fmt.defaults() if fmt is not None else PreprocessDefaults()
    fixed = all(static(d) is not None for d in image.dims[-2:])
    options = PreprocessOptions(input_size=None if fixed else size, resize="stretch")
    return ExitInputs(task, build_preprocess(image, info.metadata, defaults, options), reason)


def _strides(out: TensorInfo, size: tuple[int, int]) -> tuple[int, ...]:
    """The YOLO head's strides: P6 when its declared anchor count says so, else P5."""
    anchors = static(out.dims[-1])
    if anchors is not None and anchors == grid_cells(*size, P6_STRIDES):
        return P6_STRIDES
    return P5_STRIDES
