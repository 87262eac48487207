"""Detector formats on hand-placed boxes: decoding, thresholds, class filter and NMS against a numpy
reference written from each format's definition; format choice (``auto``) and its errors."""
from __future__ import annotations

import math

import numpy as np
import pytest
from _perception_models import constant_outputs
from onnx import TensorProto

from dynnet_ros.perception import Detector

SIZE = 64                       # the fixtures' fixed input
FRAME_H, FRAME_W = 37, 53       # odd camera size: a letterbox with uneven padding
CLASSES = ("cat", "dog", "bird")
NAMES = "{0: 'cat', 1: 'dog', 2: 'bird'}"   # how Ultralytics writes names into the metadata

# hand-placed candidates in model-input pixels: (x1, y1, x2, y2), class, score
CANDIDATES = [
    ((10, 12, 30, 40), 0, 0.90),
    ((12, 13, 31, 42), 0, 0.80),   # overlaps the first, same class: suppressed
    ((12, 13, 31, 42), 1, 0.70),   # same place, other class: kept (class-aware NMS)
    ((40, 30, 60, 58), 2, 0.60),
    ((5, 40, 20, 60), 0, 0.20),    # below the 0.25 threshold
    ((40, 14, 55, 26), 1, 0.50),
    ((41, 15, 56, 27), 1, 0.30),   # IoU with the one above ~0.75: suppressed
]


def frame() -> np.ndarray:
    return np.random.default_rng(1).integers(0, 256, (FRAME_H, FRAME_W, 3), dtype=np.uint8)


# ---------------------------------------------------------------- the reference (format definitions)

def iou(a, b) -> float:
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def reference(candidates, *, threshold=0.25, iou_threshold=0.45, nms=True, classes=None, limit=100):
    """Greedy per-class NMS over the candidates above the threshold, best first (torchvision's rule)."""
    kept = []
    for box, cls, score in sorted(candidates, key=lambda c: -c[2]):
        if score < threshold or (classes is not None and cls not in classes):
            continue
        if nms and any(k[1] == cls and iou(k[0], box) > iou_threshold for k in kept):
            continue
        kept.append((box, cls, score))
    return kept[:limit]


def to_source(box, height=FRAME_H, width=FRAME_W, size=SIZE, center=True):
    """Model-input box -> frame pixels for a letterbox into size x size: Ultralytics' placement
    (gain, rounding, padding split), unscaled by each axis' actual resize ratio."""
    gain = min(size / height, size / width)
    new_h, new_w = round(height * gain), round(width * gain)
    top = round((size - new_h) / 2 - 0.1) if center else 0
    left = round((size - new_w) / 2 - 0.1) if center else 0
    sy, sx = new_h / height, new_w / width
    x1, y1, x2, y2 = box
    out = [(x1 - left) / sx, (y1 - top) / sy, (x2 - left) / sx, (y2 - top) / sy]
    return [min(max(out[0], 0), width), min(max(out[1], 0), height), min(max(out[2], 0), width),
            min(max(out[3], 0), height)]


def check(result, expected, **kw):
    assert len(result) == len(expected), (result.to_json(), expected)
    for i, (box, cls, score) in enumerate(expected):
        np.testing.assert_allclose(result.boxes_xyxy[i], to_source(box, **kw), atol=1e-3)
        assert result.class_ids[i] == cls and result.class_names[i] == CLASSES[cls]
        assert result.scores[i] == pytest.approx(score, abs=1e-5)


def cxcywh(box):
    x1, y1, x2, y2 = box
    return [(x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1]


# ---------------------------------------------------------------- fixtures per format

def yolov8_model(tmp_path, *, dynamic=False, metadata=True, rows=12):
    table = np.zeros((4 + len(CLASSES), rows), np.float32)
    for i, (box, cls, score) in enumerate(CANDIDATES):
        table[:4, i] = cxcywh(box)
        table[4:, i] = 0.01
        table[4 + cls, i] = score
    dims = {"output0": [1, 7, "anchors"]} if dynamic else None
    input_dims = (1, 3, "height", "width") if dynamic else (1, 3, SIZE, SIZE)
    return constant_outputs(tmp_path / "yolov8.onnx", {"output0": table[None]}, input_dims=input_dims,
                            output_dims=dims, metadata={"names": NAMES, "imgsz": f"[{SIZE}, {SIZE}]"}
                            if metadata else None)


def yolov5_rows(rows: int) -> np.ndarray:
    table = np.zeros((rows, 5 + len(CLASSES)), np.float32)
    for i, (box, cls, score) in enumerate(CANDIDATES):
        table[i, :4] = cxcywh(box)
        table[i, 4] = math.sqrt(score)            # objectness x class = score
        table[i, 5:] = 0.01
        table[i, 5 + cls] = math.sqrt(score)
    return table


def test_yolov8_raw_head_decodes_with_class_aware_nms(tmp_path):
    det = Detector(yolov8_model(tmp_path))
    assert det.format_name == "yolov8" and "4 box + 3 class" in det.format_reason
    check(det(frame()), reference(CANDIDATES))


def test_yolov8_dynamic_export_uses_imgsz_from_metadata(tmp_path):
    det = Detector(yolov8_model(tmp_path, dynamic=True))
    assert det.preprocess.target == (SIZE, SIZE) and not det.preprocess.fixed
    box = det.preprocess.plan(FRAME_H, FRAME_W)
    assert (box.pad_h, box.pad_w) == (64, 64)   # 46x64 padded to the stride (32)
    result = det(frame())
    # the padded input is 64 x 64 here, so the reference letterbox is the same
    check(result, reference(CANDIDATES))


def test_class_filter_by_name_and_id(tmp_path):
    path = yolov8_model(tmp_path)
    check(Detector(path, classes=["dog"])(frame()), reference(CANDIDATES, classes={1}))
    check(Detector(path, classes=[0, "bird"])(frame()), reference(CANDIDATES, classes={0, 2}))
    with pytest.raises(ValueError, match="unknown class name 'horse'.*cat, dog, bird"):
        Detector(path, classes=["horse"])
    with pytest.raises(ValueError, match="class id 3 is out of range"):
        Detector(path, classes=[3])
    with pytest.raises(ValueError, match="list of class names"):
        Detector(path, classes="cat")


def test_thresholds_limit_and_agnostic_nms(tmp_path):
    path = yolov8_model(tmp_path)
    check(Detector(path, score_threshold=0.55)(frame()), reference(CANDIDATES, threshold=0.55))
    check(Detector(path, nms_iou=0.9)(frame()), reference(CANDIDATES, iou_threshold=0.9))
    check(Detector(path, max_detections=2)(frame()), reference(CANDIDATES, limit=2))
    agnostic = Detector(path, agnostic_nms=True)(frame())
    merged = [(b, 0, s) for b, _, s in CANDIDATES]
    kept = reference(merged)
    assert len(agnostic) == len(kept)   # the class-1 box on top of the class-0 one is gone
    assert 2 not in [CANDIDATES.index(c) for c in CANDIDATES if any(c[0] == k[0] and c[2] == k[2] for k in kept)]


def test_labels_file_overrides_metadata(tmp_path):
    labels = tmp_path / "labels.txt"
    labels.write_text("person\ncar\n\ntruck\n")
    result = Detector(yolov8_model(tmp_path), labels_file=labels)(frame())
    assert result.class_names[:2] == ["person", "car"]
    yaml_labels = tmp_path / "data.yaml"
    yaml_labels.write_text("names:\n  0: a\n  1: b\n  2: c\n")
    assert Detector(yolov8_model(tmp_path), labels_file=yaml_labels)(frame()).class_names[0] == "a"


def test_metadata_names_are_literals_only(tmp_path):
    path = constant_outputs(tmp_path / "evil.onnx", {"output0": np.zeros((1, 7, 12), np.float32)},
                            metadata={"names": "__import__('os').system('touch pwned')"})
    with pytest.raises(ValueError, match="not a list or dict literal"):
        Detector(path)
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize("flavour", ["yolov5", "yolov7"])
def test_yolov5_objectness_times_class(tmp_path, flavour):
    rows = 3 * (8 * 8 + 4 * 4 + 2 * 2)   # 3 anchors per cell at strides 8/16/32 of a 64x64 input
    path = constant_outputs(tmp_path / f"{flavour}.onnx", {"output": yolov5_rows(rows)[None]},
                            metadata={"names": NAMES})
    det = Detector(path)
    assert det.format_name == "yolov5" and "3 anchor(s) per grid cell" in det.format_reason
    check(det(frame()), reference(CANDIDATES))


def test_yolox_grid_relative_decode(tmp_path):
    cells = [(s, gy, gx) for s in (8, 16, 32) for gy in range(SIZE // s) for gx in range(SIZE // s)]
    table = np.zeros((len(cells), 5 + len(CLASSES)), np.float32)
    expected_candidates = []
    for i, (box, cls, score) in enumerate(CANDIDATES):
        row = 3 * i + 5   # spread over stride-8 cells
        stride, gy, gx = cells[row]
        cx, cy, w, h = cxcywh(box)
        table[row, :4] = [cx / stride - gx, cy / stride - gy, math.log(w / stride), math.log(h / stride)]
        table[row, 4] = math.sqrt(score)
        table[row, 5:] = 0.01
        table[row, 5 + cls] = math.sqrt(score)
        expected_candidates.append((box, cls, score))
    path = constant_outputs(tmp_path / "yolox.onnx", {"output": table[None]}, metadata={"names": NAMES})
    det = Detector(path)
    assert det.format_name == "yolox"
    assert det.preprocess.channel_order == "BGR" and det.preprocess.scale == 255.0
    check(det(frame()), reference(expected_candidates), center=False)


def test_end_to_end_export_keeps_its_own_nms(tmp_path):
    table = np.zeros((300, 6), np.float32)
    for i, (box, cls, score) in enumerate(CANDIDATES):
        table[i] = [*box, score, cls]
    path = constant_outputs(tmp_path / "v10.onnx", {"output0": table[None]}, metadata={"names": NAMES})
    det = Detector(path)
    assert det.format_name == "yolo-end2end"
    check(det(frame()), reference(CANDIDATES, nms=False))


def test_detr_softmax_with_no_object_class(tmp_path):
    queries = len(CANDIDATES) + 3
    logits = np.full((queries, len(CLASSES) + 1), -4.0, np.float32)
    logits[:, -1] = 3.0                       # unused queries: "no object"
    boxes = np.full((queries, 4), 0.5, np.float32)
    expected = []
    for i, (box, cls, score) in enumerate(CANDIDATES):
        logits[i] = -20.0
        logits[i, cls] = math.log(score)
        logits[i, -1] = math.log(1 - score)   # softmax over [class, no-object] -> score
        boxes[i] = np.array(cxcywh(box), np.float32) / SIZE
        expected.append((box, cls, score))
    path = constant_outputs(tmp_path / "detr.onnx", {"pred_boxes": boxes[None], "logits": logits[None]},
                            input_name="pixel_values", metadata={"names": NAMES})
    det = Detector(path, input_size=(SIZE, SIZE))
    assert det.format_name == "detr"
    result = det(frame())
    check(result, reference(expected, nms=False), center=False)


def test_rtdetr_sigmoid_scores_stretched_input(tmp_path):
    logits = np.full((len(CANDIDATES), len(CLASSES)), -9.0, np.float32)
    boxes = np.zeros((len(CANDIDATES), 4), np.float32)
    for i, (box, cls, score) in enumerate(CANDIDATES):
        logits[i, cls] = math.log(score / (1 - score))
        boxes[i] = np.array(cxcywh(box), np.float32) / SIZE
    path = constant_outputs(tmp_path / "rtdetr.onnx", {"logits": logits[None], "boxes": boxes[None]},
                            metadata={"names": "['cat', 'dog', 'bird']"})
    det = Detector(path)
    assert det.format_name == "rtdetr" and det.preprocess.stretch
    result = det(frame())
    kept = reference(CANDIDATES, nms=False)
    assert len(result) == len(kept)
    for i, (box, cls, score) in enumerate(kept):   # stretched: each axis scaled on its own
        x1, y1, x2, y2 = box
        want = [x1 * FRAME_W / SIZE, y1 * FRAME_H / SIZE, x2 * FRAME_W / SIZE, y2 * FRAME_H / SIZE]
        np.testing.assert_allclose(result.boxes_xyxy[i], np.minimum(want, [FRAME_W, FRAME_H] * 2), atol=1e-3)
        assert result.class_ids[i] == cls and result.scores[i] == pytest.approx(score, abs=1e-5)


def test_torchvision_ssd_outputs(tmp_path):
    boxes = np.array([c[0] for c in CANDIDATES], np.float32)
    scores = np.array([c[2] for c in CANDIDATES], np.float32)
    labels = np.array([c[1] for c in CANDIDATES], np.int64)
    path = constant_outputs(tmp_path / "ssd.onnx", {"boxes": boxes, "scores": scores, "labels": labels},
                            metadata={"names": NAMES})
    det = Detector(path, classes=["cat", "bird"])
    assert det.format_name == "ssd"
    check(det(frame()), reference(CANDIDATES, nms=False, classes={0, 2}), center=False)
    # torchvision's export: one unbatched CHW image of any size, resized inside the graph
    unbatched = constant_outputs(tmp_path / "tv.onnx", {"boxes": boxes, "scores": scores, "labels": labels},
                                 input_dims=(3, "height", "width"), metadata={"names": NAMES})
    det = Detector(unbatched)
    assert det.preprocess.layout == "CHW" and det.preprocess.target is None
    tensor, box = det.preprocess(frame())
    assert tensor.shape == (3, FRAME_H, FRAME_W)
    result = det(frame())   # boxes come back in frame pixels as given (clipped to the frame)
    kept = reference(CANDIDATES, nms=False)
    np.testing.assert_allclose(result.boxes_xyxy, [np.minimum(b, [FRAME_W, FRAME_H] * 2) for b, _, _ in kept])


def test_zoo_pedestrian_format_matches_direct_run():
    """The zoo model through the Detector equals running it directly (float RGB, 0.5 padding)."""
    import onnxruntime as ort

    from dynnet_ros.zoo import ensure_model

    path = str(ensure_model("pedestrian"))
    rng = np.random.default_rng(3)
    image = np.full((200, 300, 3), 90, np.uint8)
    image[60:150, 100:130] = (240, 30, 30)   # an upright blob the zoo model scores
    image = np.clip(image.astype(int) + rng.integers(-5, 6, image.shape), 0, 255).astype(np.uint8)
    det = Detector(path, score_threshold=0.05)
    assert det.format_name == "zoo" and det.names == ["pedestrian"]
    result = det(image)
    tensor = np.full((1, 3, 224, 320), 0.5, np.float32)
    tensor[0, :, :200, :300] = image.transpose(2, 0, 1) / np.float32(255.0)
    feeds = {"image": tensor, "score_threshold": np.array([0.05], np.float32),
             "iou_threshold": np.array([0.45], np.float32), "max_detections": np.array([100], np.int64)}
    boxes, scores = ort.InferenceSession(path).run(["boxes", "scores"], feeds)
    order = np.argsort(-scores, kind="stable")
    want = np.clip(boxes[order], 0, [300, 200, 300, 200])
    assert len(result) == len(scores) > 0
    np.testing.assert_allclose(result.boxes_xyxy, want, atol=1e-2)
    np.testing.assert_allclose(result.scores, scores[order], atol=1e-4)


# ---------------------------------------------------------------- format choice

def test_ambiguous_model_lists_the_formats(tmp_path):
    path = constant_outputs(tmp_path / "rows.onnx", {"output": yolov5_rows(40)[None]},
                            input_dims=(1, 3, "h", "w"), output_dims={"output": [1, "n", 8]})
    with pytest.raises(ValueError, match=r"ambiguous detection model.*yolov5.*yolox.*model_format to one of "
                                         r"yolov5, yolox"):
        Detector(path)
    assert Detector(path, model_format="yolov5").format_reason.startswith("model_format yolov5 (given)")


def test_detr_without_names_is_ambiguous(tmp_path):
    path = constant_outputs(tmp_path / "detr.onnx", {"pred_boxes": np.zeros((1, 5, 4), np.float32),
                                                     "logits": np.zeros((1, 5, 4), np.float32)})
    with pytest.raises(ValueError, match="detr.*rtdetr"):
        Detector(path)


def test_wrong_or_unknown_format_is_refused(tmp_path):
    path = yolov8_model(tmp_path)
    with pytest.raises(ValueError, match="model_format 'yolo-end2end' does not fit .*not \\[1, N, 6\\]"):
        Detector(path, model_format="yolo-end2end")
    with pytest.raises(ValueError, match="unknown detection model_format 'yolo9000'; choose one of auto, yolov8"):
        Detector(path, model_format="yolo9000")


def test_no_format_fits(tmp_path):
    path = constant_outputs(tmp_path / "vector.onnx", {"embedding": np.zeros((1, 128), np.float32)})
    with pytest.raises(ValueError, match="no detection format fits .*Choose model_format"):
        Detector(path)


@pytest.mark.parametrize("kwargs,message", [
    ({"score_threshold": 1.5}, "score_threshold"), ({"nms_iou": -0.1}, "nms_iou"),
    ({"max_detections": 0}, "max_detections"), ({"agnostic_nms": "yes"}, "agnostic_nms"),
    ({"input_size": 320}, "contradicts the model's fixed input"), ({"layout": "NHWC"}, "contradicts"),
    ({"channel_order": "RGBA"}, "channel_order"), ({"std": (0.2, 0.0, 0.2)}, "std must be positive"),
    ({"mean": (0.5, 0.5)}, "mean must be 3"), ({"input_multiple": 32}, "applies to dynamic inputs"),
    ({"pad_position": "left"}, "pad_position"), ({"resize": "crop"}, "resize must be one of"),
])
def test_bad_options_raise_at_construction(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        Detector(yolov8_model(tmp_path), **kwargs)


def test_bad_frames_are_refused(tmp_path):
    det = Detector(yolov8_model(tmp_path))
    for bad in (np.zeros((10, 10), np.uint8), np.zeros((10, 10, 3), np.float32), np.zeros((0, 5, 3), np.uint8),
                np.zeros((10, 10, 4), np.uint8)):
        with pytest.raises(ValueError, match="HxWx3 uint8|empty"):
            det(bad)


def test_uint8_nhwc_input(tmp_path):
    """A TF-style export: NHWC uint8 pixels, no normalisation."""
    table = np.zeros((1, 7, 12), np.float32)
    path = constant_outputs(tmp_path / "nhwc.onnx", {"output0": table}, input_dims=(1, SIZE, SIZE, 3),
                            input_type=TensorProto.UINT8)
    det = Detector(path, model_format="yolov8")
    assert det.preprocess.layout == "NHWC" and det.preprocess.dtype == np.uint8
    assert len(det(frame())) == 0
    with pytest.raises(ValueError, match="uint8 pixels"):
        Detector(path, model_format="yolov8", mean=(0.5, 0.5, 0.5))
