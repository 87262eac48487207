"""Detector: an exported object detector as a function frame -> Detections (source pixels)."""
from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from dynnet_ros.perception.core import (
    PerceptionCore,
    as_sequence,
    check_frames,
    check_positive_int,
    check_unit_interval,
    frame_of,
)
from dynnet_ros.perception.formats.detection import DETECTION_FORMATS, ZOO_NAMES, DetectionFormat, RawDetections
from dynnet_ros.perception.labels import class_name, resolve_classes
from dynnet_ros.perception.letterbox import Letterbox
from dynnet_ros.perception.nms import nms
from dynnet_ros.perception.preprocess import PreprocessOptions
from dynnet_ros.perception.results import Detections


class Detector(PerceptionCore[DetectionFormat]):
    """Run a detector export (any format in ``DETECTION_FORMATS``) on HxWx3 uint8 RGB frames.

    ``classes``: class names or ids to keep (empty = every class). Scores below
    ``score_threshold`` are dropped, then (raw heads only) class-aware NMS at ``nms_iou``, then
    at most ``max_detections`` boxes, highest score first (``agnostic_nms``: boxes of different
    classes suppress each other too). ``labels_file`` overrides the class
    names in the model's metadata. The remaining keywords override preprocessing
    (docs/models.md); ``swappable``/``threads``/``concurrent_runs`` go to the Engine.
    """

    task = "detection"

    def __init__(self, model_path: str | os.PathLike, model_format: str = "auto",
                 classes: Sequence[int | str] = (), score_threshold: float = 0.25, nms_iou: float = 0.45,
                 max_detections: int = 100, backend: str = "cpu", memory_budget_mb: float | None = None, *,
                 labels_file: str | os.PathLike | None = None, agnostic_nms: bool = False,
                 mean: Sequence[float] | None = None, std: Sequence[float] | None = None,
                 channel_order: str | None = None, scale: float | None = None, layout: str | None = None,
                 input_size: int | Sequence[int] | None = None,
                 input_multiple: int | None = None, resize: str | None = None, pad_value: float | None = None,
                 pad_position: str | None = None, threads: int | None = None,
                 swappable: bool = False, concurrent_runs: int = 1) -> None:
        self.score_threshold = check_unit_interval(score_threshold, "score_threshold")
        self.nms_iou = check_unit_interval(nms_iou, "nms_iou")
        self.max_detections = check_positive_int(max_detections, "max_detections")
        if not isinstance(agnostic_nms, bool):
            raise ValueError(f"agnostic_nms must be true or false, got {agnostic_nms!r}")
        self.agnostic_nms = agnostic_nms
        wanted = as_sequence(classes, "classes")
        options = PreprocessOptions(channel_order=channel_order, scale=scale, mean=mean, std=std, layout=layout,
                                    input_size=input_size, input_multiple=input_multiple, resize=resize,
                                    pad_value=pad_value, pad_position=pad_position)
        super().__init__(model_path, model_format, DETECTION_FORMATS, preprocess=options, labels_file=labels_file,
                         backend=backend, memory_budget_mb=memory_budget_mb, threads=threads, swappable=swappable,
                         concurrent_runs=concurrent_runs)
        try:
            if self.names is None and self.choice.name == "zoo":
                self.names = list(ZOO_NAMES)
            count = self.format.num_classes(self.info)
            self.class_filter = resolve_classes(wanted, self.names, count)
        except ValueError:
            self.close()
            raise

    def __call__(self, frame: np.ndarray) -> Detections:
        tensor, box = self._prepare(frame)
        outputs = self._run(self._feeds(tensor))
        raw: RawDetections = self.format.decode(outputs, box)
        return self._finish(raw, box)

    def batch(self, frames: Sequence[np.ndarray]) -> list[Detections]:
        """``self(frame)`` for each frame, in one engine run per ``max_batch`` frames; frames of
        different sizes share the largest padded input size, boxes come back in each frame's pixels."""
        frames = check_frames(frames)
        return self._in_runs(len(frames), lambda i: self(frames[i]),
                             lambda chunk: self._run_together([frames[i] for i in chunk]))

    def _run_together(self, frames: Sequence[np.ndarray]) -> list[Detections]:
        tensor, boxes = self._prepare_batch(frames)
        outputs = self._run(self._feeds(tensor))
        raws = [self.format.decode(frame_of(outputs, i), box) for i, box in enumerate(boxes)]
        return [self._finish(raw, box) for raw, box in zip(raws, boxes)]

    def _feeds(self, tensor: np.ndarray) -> dict[str, np.ndarray]:
        return {self.preprocess.input_name: tensor,
                **self.format.extra_feeds(self.score_threshold, self.nms_iou, self.max_detections)}

    def _finish(self, raw: RawDetections, box: Letterbox) -> Detections:
        keep = self.select(raw)
        boxes = box.boxes_to_source(raw.boxes[keep])
        ids = raw.class_ids[keep]
        return Detections(boxes, raw.scores[keep].astype(np.float32), ids.astype(np.int64),
                          [class_name(self.names, int(i)) for i in ids])

    def select(self, raw: RawDetections) -> np.ndarray:
        """Indices kept: score threshold, class filter, NMS for raw heads, the cap; best first."""
        candidates = np.flatnonzero(np.isfinite(raw.scores) & (raw.scores >= self.score_threshold)
                                    & np.isfinite(raw.boxes).all(axis=1))
        if self.class_filter:
            candidates = candidates[np.isin(raw.class_ids[candidates], list(self.class_filter))]
        if raw.needs_nms:
            groups = np.zeros(len(candidates), np.int64) if self.agnostic_nms else raw.class_ids[candidates]
            kept = nms(raw.boxes[candidates], raw.scores[candidates], groups, self.nms_iou, self.max_detections)
            return candidates[kept]
        order = np.argsort(-raw.scores[candidates], kind="stable")[: self.max_detections]
        return candidates[order]

    def describe(self) -> dict:
        return {**super().describe(), "score_threshold": self.score_threshold, "nms_iou": self.nms_iou,
                "max_detections": self.max_detections, "class_filter": sorted(self.class_filter)}
