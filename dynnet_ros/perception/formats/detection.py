"""Detector export formats: which signature each has, its preprocessing, and how its outputs decode.

Every decoder returns boxes as x1,y1,x2,y2 in model-input pixels with one score and one class
id per box, and says whether NMS is still to be done (raw heads) or was done in the graph
(end-to-end exports, DETR-style set prediction, torchvision/SSD, the zoo).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from dynnet_ros.perception.formats.base import (
    BY_NAME,
    BY_SHAPE,
    Fit,
    batchless,
    no,
    required_image_input,
    single_image_input,
    unbatch,
)
from dynnet_ros.perception.letterbox import Letterbox
from dynnet_ros.perception.model_info import ModelInfo, TensorInfo, static
from dynnet_ros.perception.preprocess import IMAGENET_MEAN, IMAGENET_STD, PreprocessDefaults

#: YOLO heads' strides: P5 models (8, 16, 32); P6 models add 64
P5_STRIDES = (8, 16, 32)
P6_STRIDES = (8, 16, 32, 64)
#: Ultralytics-style preprocessing: RGB in [0, 1], letterbox centred with grey 114 padding
ULTRALYTICS = PreprocessDefaults()


@dataclass(frozen=True)
class RawDetections:
    """Decoded model output in model-input pixels, before thresholds, classes and NMS."""

    boxes: np.ndarray      # (N, 4) float32 x1, y1, x2, y2
    scores: np.ndarray     # (N,) float32
    class_ids: np.ndarray  # (N,) int64
    needs_nms: bool


def cxcywh_to_xyxy(boxes: np.ndarray) -> np.ndarray:
    cx, cy, w, h = boxes[:, 0], boxes[:, 1], boxes[:, 2] / 2, boxes[:, 3] / 2
    return np.stack([cx - w, cy - h, cx + w, cy + h], axis=1).astype(np.float32, copy=False)


def best_class(class_scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row: (highest class score, its class id)."""
    ids = np.argmax(class_scores, axis=1)
    return class_scores[np.arange(len(ids)), ids].astype(np.float32), ids.astype(np.int64)


def grid_cells(height: int, width: int, strides: Sequence[int]) -> int:
    return sum(-(-height // s) * -(-width // s) for s in strides)


def _static_hw(spec: TensorInfo) -> tuple[int, int] | None:
    """The fixed H, W of an image input (None when dynamic): its last two dims unless NHWC."""
    nhwc = spec.rank == 4 and static(spec.dims[3]) == 3 and static(spec.dims[1]) != 3
    h, w = (static(spec.dims[1]), static(spec.dims[2])) if nhwc else (static(spec.dims[-2]), static(spec.dims[-1]))
    return (h, w) if h is not None and w is not None else None


class DetectionFormat(ABC):
    """Base: one image input, preprocessing defaults, no extra feeds."""

    name = ""
    summary = ""
    needs_nms = True

    @abstractmethod
    def fit(self, info: ModelInfo, names: Sequence[str] | None) -> Fit:
        """Whether this format fits the model, with the reason and how strong the evidence is."""

    def image_input(self, info: ModelInfo) -> TensorInfo:
        return required_image_input(info)

    def defaults(self) -> PreprocessDefaults:
        return ULTRALYTICS

    def num_classes(self, info: ModelInfo) -> int | None:
        return None

    def extra_feeds(self, score_threshold: float, nms_iou: float, max_detections: int) -> dict[str, np.ndarray]:
        return {}

    @abstractmethod
    def decode(self, outputs: Mapping[str, np.ndarray], box: Letterbox) -> RawDetections:
        """The model's outputs as boxes in model-input pixels, scores and class ids."""


def _one_output(info: ModelInfo) -> tuple[TensorInfo | None, str]:
    image = single_image_input(info)
    if isinstance(image, str):
        return None, image
    if len(info.outputs) != 1:
        return None, f"needs one output, the model has {len(info.outputs)}"
    return info.outputs[0], ""


def _class_count_check(channels: int, offset: int, names: Sequence[str] | None) -> str | None:
    if channels - offset < 1:
        return f"{channels} channels leave no class scores"
    if names and channels - offset != len(names):
        return f"{channels} channels would be {channels - offset} classes, the model names {len(names)}"
    return None


class YoloV8(DetectionFormat):
    name = "yolov8"
    summary = "Ultralytics YOLOv8/YOLO11 raw head: one output [1, 4+C, N] (cx, cy, w, h, class scores)"

    def fit(self, info: ModelInfo, names: Sequence[str] | None) -> Fit:
        out, why = _one_output(info)
        if out is None:
            return no(why)
        dims = batchless(out.dims, 2)
        channels = None if dims is None else static(dims[0])
        if dims is None or channels is None:
            return no(f"output {out.describe()} is not [1, 4+C, N] with C fixed")
        count = static(dims[1])
        if count is not None and count <= channels:
            return no(f"output {out.describe()} has fewer candidates than channels (not channels-first)")
        bad = _class_count_check(channels, 4, names)
        if bad:
            return no(bad)
        if _end2end(info):
            return no("metadata end2end=True: NMS is in the graph")
        return Fit(True, f"one output {out.describe()}: 4 box + {channels - 4} class channels first "
                         f"(no objectness)", BY_SHAPE)

    def num_classes(self, info: ModelInfo) -> int | None:
        dims = batchless(info.outputs[0].dims, 2)
        channels = None if dims is None else static(dims[0])
        return None if channels is None else channels - 4

    def decode(self, outputs: Mapping[str, np.ndarray], box: Letterbox) -> RawDetections:
        pred = unbatch(next(iter(outputs.values())), 2, "yolov8 output").T
        scores, ids = best_class(pred[:, 4:])
        return RawDetections(cxcywh_to_xyxy(pred[:, :4]), scores, ids, True)


class _RowsWithObjectness(DetectionFormat):
    """[1, N, 5+C]: box, objectness, class scores; score = objectness x class score."""

    anchors_per_cell = 3

    def _rows(self, info: ModelInfo, names: Sequence[str] | None) -> tuple[Fit | None, int, int | None]:
        out, why = _one_output(info)
        if out is None:
            return no(why), 0, None
        dims = batchless(out.dims, 2)
        channels = None if dims is None else static(dims[1])
        if dims is None or channels is None:
            return no(f"output {out.describe()} is not [1, N, 5+C] with C fixed"), 0, None
        count = static(dims[0])
        if count is not None and count <= channels:
            return no(f"output {out.describe()} has fewer candidates than channels (not [1, N, 5+C])"), 0, None
        bad = _class_count_check(channels, 5, names)
        if bad:
            return no(bad), 0, None
        if _end2end(info):
            return no("metadata end2end=True: NMS is in the graph"), 0, None
        return None, channels, count

    def _count_fit(self, info: ModelInfo, count: int | None) -> str | None:
        """None when the candidate count matches this format's grid, else why not."""
        hw = _static_hw(self.image_input(info))
        if count is None or hw is None:
            return None
        expected = [self.anchors_per_cell * grid_cells(*hw, strides) for strides in (P5_STRIDES, P6_STRIDES)]
        if count not in expected:
            return (f"{count} candidates, a {hw[0]}x{hw[1]} input gives {' or '.join(map(str, expected))} with "
                    f"{self.anchors_per_cell} anchor(s) per cell")
        return None

    def fit(self, info: ModelInfo, names: Sequence[str] | None) -> Fit:
        failed, channels, count = self._rows(info, names)
        if failed is not None:
            return failed
        bad = self._count_fit(info, count)
        if bad:
            return no(bad)
        checked = "" if count is not None and _static_hw(self.image_input(info)) else \
            " (candidate count not checked: dynamic size)"
        return Fit(True, f"one output {info.outputs[0].describe()}: box, objectness, {channels - 5} classes, "
                         f"{self.anchors_per_cell} anchor(s) per grid cell{checked}", BY_SHAPE)

    def num_classes(self, info: ModelInfo) -> int | None:
        dims = batchless(info.outputs[0].dims, 2)
        channels = None if dims is None else static(dims[1])
        return None if channels is None else channels - 5

    def _score(self, pred: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return best_class(pred[:, 5:] * pred[:, 4:5])


class YoloV5(_RowsWithObjectness):
    name = "yolov5"
    summary = "YOLOv5/YOLOv7: one output [1, N, 5+C] (cx, cy, w, h, objectness, class scores), 3 anchors per cell"

    def decode(self, outputs: Mapping[str, np.ndarray], box: Letterbox) -> RawDetections:
        pred = unbatch(next(iter(outputs.values())), 2, "yolov5 output")
        scores, ids = self._score(pred)
        return RawDetections(cxcywh_to_xyxy(pred[:, :4]), scores, ids, True)


class YoloX(_RowsWithObjectness):
    name = "yolox"
    summary = ("YOLOX (decode_in_inference=False): one output [1, N, 5+C] of grid-relative boxes, "
               "one anchor per cell at strides 8/16/32; BGR pixels 0-255, top-left padding")
    anchors_per_cell = 1

    def defaults(self) -> PreprocessDefaults:
        return PreprocessDefaults(channel_order="BGR", scale=255.0, center=False)

    def decode(self, outputs: Mapping[str, np.ndarray], box: Letterbox) -> RawDetections:
        pred = unbatch(next(iter(outputs.values())), 2, "yolox output").astype(np.float32)
        for strides in (P5_STRIDES, P6_STRIDES):
            if grid_cells(box.pad_h, box.pad_w, strides) == len(pred):
                break
        else:
            raise ValueError(f"yolox output has {len(pred)} rows; a {box.pad_h}x{box.pad_w} input has "
                             f"{grid_cells(box.pad_h, box.pad_w, P5_STRIDES)} grid cells at strides 8/16/32")
        grids, scale = [], []
        for s in strides:
            gy, gx = np.meshgrid(np.arange(-(-box.pad_h // s)), np.arange(-(-box.pad_w // s)), indexing="ij")
            grids.append(np.stack([gx.ravel(), gy.ravel()], axis=1))
            scale.append(np.full((gx.size, 1), s, dtype=np.float32))
        grid = np.concatenate(grids).astype(np.float32)
        stride = np.concatenate(scale)
        xy = (pred[:, :2] + grid) * stride
        wh = np.exp(pred[:, 2:4]) * stride
        scores, ids = self._score(pred)
        return RawDetections(cxcywh_to_xyxy(np.concatenate([xy, wh], axis=1)), scores, ids, True)


class EndToEnd(DetectionFormat):
    name = "yolo-end2end"
    summary = ("YOLOv10 / end-to-end exports (nms=True): one output [1, N, 6] of x1, y1, x2, y2, score, "
               "class id; NMS is in the graph")
    needs_nms = False

    def fit(self, info: ModelInfo, names: Sequence[str] | None) -> Fit:
        out, why = _one_output(info)
        if out is None:
            return no(why)
        dims = batchless(out.dims, 2)
        if dims is None or dims[1] != 6:
            return no(f"output {out.describe()} is not [1, N, 6]")
        if _end2end(info):
            return Fit(True, f"metadata end2end=True and one output {out.describe()}", BY_NAME)
        rows = static(dims[0])
        if rows is not None and rows > 1000:
            return no(f"{dims[0]} rows is a raw head's candidate count, not a final detection list")
        return Fit(True, f"one output {out.describe()}: x1, y1, x2, y2, score, class per row", BY_SHAPE)

    def decode(self, outputs: Mapping[str, np.ndarray], box: Letterbox) -> RawDetections:
        pred = unbatch(next(iter(outputs.values())), 2, "end-to-end output").astype(np.float32)
        return RawDetections(pred[:, :4].copy(), pred[:, 4].copy(), pred[:, 5].astype(np.int64), False)


def _end2end(info: ModelInfo) -> bool:
    """Ultralytics writes ``end2end`` into the metadata of exports with NMS in the graph."""
    return info.metadata.get("end2end", "").strip().lower() == "true"


def _named(info: ModelInfo, *words: str) -> TensorInfo | None:
    return next((t for t in info.outputs if any(w in t.name.lower() for w in words)), None)


class _SetPrediction(DetectionFormat):
    """DETR family: per query, normalised cx, cy, w, h and class logits; no NMS (set prediction)."""

    needs_nms = False
    background_class = False

    def _outputs(self, info: ModelInfo) -> tuple[TensorInfo, TensorInfo] | str:
        image = single_image_input(info)
        if isinstance(image, str):
            return image
        if len(info.outputs) != 2:
            return f"needs two outputs (boxes, logits), the model has {len(info.outputs)}"
        shapes = [batchless(t.dims, 2) for t in info.outputs]
        if any(s is None for s in shapes):
            return f"outputs {', '.join(t.describe() for t in info.outputs)} are not [1, Q, 4] and [1, Q, K]"
        box_like = [t for t, s in zip(info.outputs, shapes) if s and s[1] == 4]
        boxes = _named(info, "box") or (box_like[0] if len(box_like) == 1 else None)
        logits = next((t for t in info.outputs if t is not boxes), None)
        if boxes is None or logits is None or boxes not in box_like:
            return "no [1, Q, 4] box output"
        return boxes, logits

    def _classes(self, logits: TensorInfo) -> int | None:
        dims = batchless(logits.dims, 2)
        return None if dims is None else static(dims[1])

    def fit(self, info: ModelInfo, names: Sequence[str] | None) -> Fit:
        found = self._outputs(info)
        if isinstance(found, str):
            return no(found)
        boxes, logits = found
        classes = self._classes(logits)
        if classes is None:
            return no(f"logits {logits.describe()} has no fixed class count")
        extra = 1 if self.background_class else 0
        if names and classes - extra != len(names):
            return no(f"logits {logits.describe()} give {classes - extra} classes, the model names {len(names)}")
        strength = BY_NAME if names else BY_SHAPE
        return Fit(True, f"boxes {boxes.describe()} (normalised cx, cy, w, h) and logits {logits.describe()}"
                         + (f" = {len(names)} classes{' + no-object' if extra else ''}" if names else ""), strength)

    def num_classes(self, info: ModelInfo) -> int | None:
        found = self._outputs(info)
        if isinstance(found, str):
            return None
        classes = self._classes(found[1])
        return None if classes is None else classes - (1 if self.background_class else 0)

    @abstractmethod
    def _probabilities(self, logits: np.ndarray) -> np.ndarray:
        """Class probabilities from the model's logits (softmax or sigmoid, per format)."""

    def decode(self, outputs: Mapping[str, np.ndarray], box: Letterbox) -> RawDetections:
        names = list(outputs)
        boxes_name = next((n for n in names if "box" in n.lower()), None)
        if boxes_name is None:
            boxes_name = next(n for n in names if outputs[n].shape[-1] == 4)
        logits_name = next(n for n in names if n != boxes_name)
        boxes = unbatch(outputs[boxes_name], 2, "box output").astype(np.float32)
        logits = unbatch(outputs[logits_name], 2, "logits output").astype(np.float32)
        scores, ids = best_class(self._probabilities(logits))
        xyxy = cxcywh_to_xyxy(boxes) * np.array([box.pad_w, box.pad_h, box.pad_w, box.pad_h], dtype=np.float32)
        return RawDetections(xyxy, scores, ids, False)


class Detr(_SetPrediction):
    name = "detr"
    summary = ("DETR: outputs pred_boxes [1, Q, 4] (normalised cx, cy, w, h) and logits [1, Q, C+1] "
               "(softmax, last class = no object); ImageNet mean/std")
    background_class = True

    def defaults(self) -> PreprocessDefaults:
        return PreprocessDefaults(mean=IMAGENET_MEAN, std=IMAGENET_STD, center=False, pad_value=None,
                                  input_size=800)

    def _probabilities(self, logits: np.ndarray) -> np.ndarray:
        shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
        return (shifted / shifted.sum(axis=1, keepdims=True))[:, :-1]


class RtDetr(_SetPrediction):
    name = "rtdetr"
    summary = ("RT-DETR / DETR with sigmoid class scores: boxes [1, Q, 4] (normalised cx, cy, w, h) and "
               "logits [1, Q, C]; RGB in [0, 1], stretched to the fixed input")

    def defaults(self) -> PreprocessDefaults:
        return PreprocessDefaults(resize="stretch", center=False)

    def _probabilities(self, logits: np.ndarray) -> np.ndarray:
        return 1.0 / (1.0 + np.exp(-logits))


class TorchvisionSSD(DetectionFormat):
    name = "ssd"
    summary = ("SSD / torchvision-style: outputs boxes [N, 4] (x1, y1, x2, y2 input pixels), scores [N], "
               "labels [N]; NMS in the graph; input NCHW or unbatched CHW in [0, 1]")
    needs_nms = False

    def _outputs(self, info: ModelInfo) -> tuple[str, str, str] | str:
        image = single_image_input(info)
        if isinstance(image, str):
            return image
        boxes, scores = _named(info, "box"), _named(info, "score")
        labels = _named(info, "label", "class") or next(
            (t for t in info.outputs if np.issubdtype(t.dtype, np.integer)), None)
        if boxes is None or scores is None or labels is None:
            return "needs outputs named *box*, *score* and *label*/*class* (or an integer one)"
        if boxes.dims[-1:] != (4,):
            return f"box output {boxes.describe()} is not [N, 4]"
        return boxes.name, scores.name, labels.name

    def fit(self, info: ModelInfo, names: Sequence[str] | None) -> Fit:
        found = self._outputs(info)
        if isinstance(found, str):
            return no(found)
        return Fit(True, f"outputs {', '.join(found)}: boxes in input pixels, scores, labels", BY_NAME)

    def defaults(self) -> PreprocessDefaults:
        # torchvision detectors resize inside the graph: a dynamic input gets the frame as it is
        return PreprocessDefaults(input_size=0, multiple=1, center=False, pad_value=0.0)

    def decode(self, outputs: Mapping[str, np.ndarray], box: Letterbox) -> RawDetections:
        boxes_name, scores_name, labels_name = (
            next(n for n in outputs if "box" in n.lower()),
            next(n for n in outputs if "score" in n.lower()),
            next((n for n in outputs if "label" in n.lower() or "class" in n.lower()),
                 next((n for n in outputs if np.issubdtype(outputs[n].dtype, np.integer)), "")))
        boxes = np.asarray(outputs[boxes_name], dtype=np.float32).reshape(-1, 4)
        scores = np.asarray(outputs[scores_name], dtype=np.float32).reshape(-1)
        labels = np.asarray(outputs[labels_name]).reshape(-1).astype(np.int64)
        if not len(boxes) == len(scores) == len(labels):
            raise ValueError(f"ssd outputs disagree: {len(boxes)} boxes, {len(scores)} scores, {len(labels)} labels")
        return RawDetections(boxes, scores, labels, False)


class ZooPedestrian(DetectionFormat):
    name = "zoo"
    summary = ("dynnet_ros zoo pedestrian model: inputs image, score_threshold, iou_threshold, "
               "max_detections; outputs boxes [N, 4], scores [N] (NMS in the graph)")
    needs_nms = False
    inputs = {"image", "score_threshold", "iou_threshold", "max_detections"}

    def fit(self, info: ModelInfo, names: Sequence[str] | None) -> Fit:
        have = {t.name for t in info.inputs}
        outs = {t.name for t in info.outputs}
        if have != self.inputs or not {"boxes", "scores"} <= outs:
            return no(f"needs inputs {sorted(self.inputs)} and outputs boxes, scores")
        return Fit(True, "inputs image, score_threshold, iou_threshold, max_detections and outputs boxes, "
                         "scores (the zoo's pedestrian signature)", BY_NAME)

    def image_input(self, info: ModelInfo) -> TensorInfo:
        spec = info.input("image")
        if spec is None:
            raise ValueError("the zoo format needs an input named 'image'")
        return spec

    def defaults(self) -> PreprocessDefaults:
        return PreprocessDefaults(scale=1.0, input_size=640, multiple=32, scaleup=False, center=False,
                                  pad_value=127.5)

    def num_classes(self, info: ModelInfo) -> int | None:
        return 1

    def extra_feeds(self, score_threshold: float, nms_iou: float, max_detections: int) -> dict[str, np.ndarray]:
        return {"score_threshold": np.array([score_threshold], dtype=np.float32),
                "iou_threshold": np.array([nms_iou], dtype=np.float32),
                "max_detections": np.array([max_detections], dtype=np.int64)}

    def decode(self, outputs: Mapping[str, np.ndarray], box: Letterbox) -> RawDetections:
        boxes = np.asarray(outputs["boxes"], dtype=np.float32).reshape(-1, 4)
        scores = np.asarray(outputs["scores"], dtype=np.float32).reshape(-1)
        if len(scores) != len(boxes):
            raise ValueError(f"zoo pedestrian model returned {len(boxes)} boxes but {len(scores)} scores")
        return RawDetections(boxes, scores, np.zeros(len(scores), dtype=np.int64), False)


#: every detection format by name (docs/models.md describes each)
DETECTION_FORMATS: dict[str, DetectionFormat] = {f.name: f for f in (
    YoloV8(), YoloV5(), EndToEnd(), YoloX(), Detr(), RtDetr(), TorchvisionSSD(), ZooPedestrian())}
#: the zoo pedestrian model's one class
ZOO_NAMES = ("pedestrian",)
