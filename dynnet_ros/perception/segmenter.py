"""Segmenter: an exported segmentation model as a function frame -> Segmentation (source pixels)."""
from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from dynnet_ros.perception.core import PerceptionCore, as_sequence, check_frames, check_unit_interval
from dynnet_ros.perception.formats.base import unbatch
from dynnet_ros.perception.formats.segmentation import (
    SegmentationFormat,
    class_count,
    segmentation_formats,
    softmax,
    to_probability,
)
from dynnet_ros.perception.labels import resolve_classes
from dynnet_ros.perception.letterbox import Letterbox
from dynnet_ros.perception.preprocess import PreprocessOptions
from dynnet_ros.perception.results import Segmentation


class Segmenter(PerceptionCore[SegmentationFormat]):
    """Run a segmentation export on HxWx3 uint8 RGB frames.

    Multi-class models (``[1, C, H, W]``): the class map is the per-pixel argmax, ``mask`` the
    pixels whose class is in ``classes`` (names or ids; empty = every class but 0, the
    background), ``probability`` the softmax mass of those classes. One-channel models:
    ``probability`` is the map (through a sigmoid when it leaves [0, 1]) and ``mask`` where it
    is at least ``threshold``. ``output_name`` picks the output of a multi-output model.
    """

    task = "segmentation"

    def __init__(self, model_path: str | os.PathLike, model_format: str = "auto", classes: Sequence[int | str] = (),
                 mean: Sequence[float] | None = None, std: Sequence[float] | None = None,
                 output_name: str | None = None, *, threshold: float = 0.5, backend: str = "cpu",
                 memory_budget_mb: float | None = None, labels_file: str | os.PathLike | None = None,
                 channel_order: str | None = None, scale: float | None = None, layout: str | None = None,
                 input_size: int | Sequence[int] | None = None, input_multiple: int | None = None,
                 resize: str | None = None, pad_value: float | None = None, pad_position: str | None = None,
                 threads: int | None = None, swappable: bool = False, concurrent_runs: int = 1) -> None:
        if output_name is not None and (not isinstance(output_name, str) or not output_name):
            raise ValueError(f"output_name must be a non-empty string or None, got {output_name!r}")
        self.threshold = check_unit_interval(threshold, "threshold")
        wanted = as_sequence(classes, "classes")
        options = PreprocessOptions(channel_order=channel_order, scale=scale, mean=mean, std=std, layout=layout,
                                    input_size=input_size, input_multiple=input_multiple, resize=resize,
                                    pad_value=pad_value, pad_position=pad_position)
        super().__init__(model_path, model_format, segmentation_formats(output_name), preprocess=options,
                         labels_file=labels_file, backend=backend, memory_budget_mb=memory_budget_mb,
                         threads=threads, swappable=swappable, concurrent_runs=concurrent_runs)
        out = self.format.output(self.info)
        if isinstance(out, str):  # the format's fit checked it; kept for the type
            self.close()
            raise ValueError(out)
        self.output_name = out.name
        try:
            if self.format.multiclass:
                count = class_count(out) or 0
                ids = resolve_classes(wanted, self.names, count)
                self.class_filter = ids or frozenset(range(1, count))
            else:
                if wanted:
                    raise ValueError(f"classes {list(wanted)} given, but output {out.describe()} has one "
                                     "channel: there are no classes to select")
                self.class_filter = frozenset()
        except ValueError:
            self.close()
            raise

    def __call__(self, frame: np.ndarray) -> Segmentation:
        tensor, box = self._prepare(frame)
        value = self._run({self.preprocess.input_name: tensor})[self.output_name]
        return self._finish(value, box)

    def batch(self, frames: Sequence[np.ndarray]) -> list[Segmentation]:
        """``self(frame)`` for each frame, in one engine run per ``max_batch`` frames; frames of
        different sizes share the largest padded input size, maps come back at each frame's size."""
        frames = check_frames(frames)
        return self._in_runs(len(frames), lambda i: self(frames[i]),
                             lambda chunk: self._run_together([frames[i] for i in chunk]))

    def _run_together(self, frames: Sequence[np.ndarray]) -> list[Segmentation]:
        tensor, boxes = self._prepare_batch(frames)
        value = self._run({self.preprocess.input_name: tensor})[self.output_name]
        return [self._finish(value[i: i + 1], box) for i, box in enumerate(boxes)]

    def _finish(self, value: np.ndarray, box: Letterbox) -> Segmentation:
        """One frame's output (batch axis 1) as a Segmentation in the frame's pixels."""
        if self.format.multiclass:
            logits = unbatch(value, 3, f"output {self.output_name}").astype(np.float32, copy=False)
            probs = softmax(logits, axis=0)
            class_map = np.argmax(logits, axis=0).astype(np.int32)
            selected = sorted(self.class_filter)
            inside = probs[selected].sum(axis=0) if selected else np.zeros(class_map.shape, np.float32)
            probability = np.clip(box.to_source(inside.astype(np.float32)), 0.0, 1.0)
            class_src = box.labels_to_source(class_map)
            return Segmentation(np.isin(class_src, selected), probability, class_src)
        plane = np.asarray(value)
        plane = plane.reshape(plane.shape[-2:]) if plane.size == plane.shape[-1] * plane.shape[-2] else plane
        if plane.ndim != 2:
            raise ValueError(f"output {self.output_name} has shape {list(np.shape(value))}, expected [1, 1, H, W]")
        probability = box.to_source(to_probability(plane))
        return Segmentation(probability >= np.float32(self.threshold), probability, None)

    def describe(self) -> dict:
        return {**super().describe(), "output": self.output_name, "threshold": self.threshold,
                "class_filter": sorted(self.class_filter)}
