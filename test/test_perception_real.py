"""Real pretrained models on real photographs: the cores agree with the publishers' own pipelines.

Each reference below follows the model publisher's documented pre- and post-processing (their
package's source, quoted per step), runs the model with onnxruntime directly, and is written
here in numpy — nothing from dynnet_ros.perception. The cores run the same models through the
Engine with options that name the same pipeline; results must agree on the photographs
scikit-image ships (test/_corpus.py). Resizing follows OpenCV's INTER_LINEAR (half-pixel
centres, edge clamp), which both publishers call.
"""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from _corpus import by_name, photos, text_page

from dynnet_ros.perception import Detector, Segmenter

DETECTOR = by_name("yolov8n-detector")
TEXT = by_name("ppocr-text-detector")
PHOTOS = photos()
needs_photos = pytest.mark.skipif(not PHOTOS, reason="scikit-image is not installed (real-model corpus)")


def cv2_linear(img: np.ndarray, height: int, width: int) -> np.ndarray:
    """cv2.resize(img, (width, height), interpolation=INTER_LINEAR) for float HxWxC images."""
    def axis(src: int, dst: int):
        pos = np.clip((np.arange(dst) + 0.5) * src / dst - 0.5, 0, src - 1)
        lo = np.floor(pos).astype(int)
        return lo, np.minimum(lo + 1, src - 1), (pos - lo)

    y0, y1, fy = axis(img.shape[0], height)
    x0, x1, fx = axis(img.shape[1], width)
    rows = img[y0] * (1 - fy)[:, None, None] + img[y1] * fy[:, None, None]
    return rows[:, x0] * (1 - fx)[None, :, None] + rows[:, x1] * fx[None, :, None]


def iou(a, b) -> float:
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


# ------------------------------------------------------------------ NudeNet (Ultralytics YOLOv8n export)

def nudenet_reference(session: ort.InferenceSession, rgb: np.ndarray, threshold: float) -> list:
    """nudenet/nudenet.py, `_read_image` + `_postprocess`, with the score threshold as a parameter."""
    height, width = rgb.shape[:2]
    size = max(height, width)                      # copyMakeBorder(0, y_pad, 0, x_pad): black, bottom/right
    square = np.zeros((size, size, 3), np.float32)
    square[:height, :width] = rgb
    blob = cv2_linear(square, 320, 320) / 255.0    # blobFromImage(1/255, (320, 320), swapRB) -> RGB
    output = session.run(None, {"images": blob.transpose(2, 0, 1)[None].astype(np.float32)})[0]
    rows = output[0].T                             # np.transpose(np.squeeze(output[0]))
    boxes, scores, classes = [], [], []
    for row in rows:
        score = row[4:].max()
        if score >= threshold:
            x, y, w, h = row[:4]
            x, y = x - w / 2, y - h / 2
            factor = size / 320                    # (original + pad) / model size
            x, y, w, h = x * factor, y * factor, w * factor, h * factor
            x, y = min(max(x, 0), width), min(max(y, 0), height)
            w, h = min(w, width - x), min(h, height - y)
            boxes.append([x, y, x + w, y + h])
            scores.append(float(score))
            classes.append(int(row[4:].argmax()))
    kept: list[int] = []                           # cv2.dnn.NMSBoxes(boxes, scores, threshold, 0.45)
    for i in np.argsort(-np.array(scores), kind="stable"):
        if all(iou(boxes[i], boxes[k]) <= 0.45 for k in kept):
            kept.append(int(i))
    return [(boxes[i], scores[i], classes[i]) for i in kept]


@needs_photos
@pytest.mark.skipif(not DETECTOR.available(), reason=DETECTOR.skip_reason)
def test_yolov8_detector_agrees_with_nudenets_pipeline():
    path = str(DETECTOR.path())
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    threshold = 0.05   # below NudeNet's 0.25 so that every photo has detections to compare
    det = Detector(path, score_threshold=threshold, nms_iou=0.45, agnostic_nms=True, input_size=320,
                   input_multiple=320, pad_position="bottom-right", pad_value=0.0)
    assert det.format_name == "yolov8" and det.names is not None and det.names[1] == "FACE_FEMALE"
    compared = 0
    for name, rgb in PHOTOS:
        want = nudenet_reference(session, rgb.astype(np.float32), threshold)
        got = det(rgb)
        # a box whose score sits on the threshold may fall either side: compare the clear ones
        clear = [w for w in want if w[1] > threshold + 0.02]
        for box, score, cls in clear:
            match = [i for i in range(len(got)) if got.class_ids[i] == cls and iou(got.boxes_xyxy[i], box) > 0.9]
            assert match, f"{name}: {det.names[cls]} {score:.2f} at {np.round(box)} not found in {got.to_json()}"
            assert got.scores[match[0]] == pytest.approx(score, abs=0.02)
            compared += 1
        assert len(got) <= len(want) + sum(1 for w in want if abs(w[1] - threshold) <= 0.02) + 1
    assert compared >= 3   # the photographs do give detections to compare


@needs_photos
@pytest.mark.skipif(not DETECTOR.available(), reason=DETECTOR.skip_reason)
def test_yolov8_default_preprocessing_is_ultralytics_letterbox():
    """With no options the core letterboxes as Ultralytics' predictor does for a dynamic export:
    fit into metadata imgsz (320), pad to the stride (32) with grey 114, centred."""
    det = Detector(str(DETECTOR.path()))
    name, rgb = PHOTOS[1]   # coffee, 400x600
    tensor, box = det.preprocess(rgb)
    gain = min(320 / 400, 320 / 600)
    new_h, new_w = round(400 * gain), round(600 * gain)
    pad_h = -(-new_h // 32) * 32
    top = round((pad_h - new_h) / 2 - 0.1)
    assert tensor.shape == (1, 3, pad_h, 320) and (box.top, box.new_h, box.new_w) == (top, new_h, new_w)
    np.testing.assert_allclose(tensor[0, :, 0, 0], 114 / 255, atol=1e-6)
    want = cv2_linear(rgb.astype(np.float32), new_h, new_w) / 255.0
    np.testing.assert_allclose(tensor[0, :, top: top + new_h, :].transpose(1, 2, 0), want, atol=1e-5)


# ------------------------------------------------------------------ PP-OCRv4 text detector (RapidOCR)

def rapidocr_size(height: int, width: int, limit: int = 736) -> tuple[int, int]:
    """rapidocr_onnxruntime/ch_ppocr_det/utils.py DetPreProcess.resize, limit_type 'min'."""
    ratio = limit / min(height, width) if min(height, width) < limit else 1.0
    resize_h, resize_w = int(height * ratio), int(width * ratio)
    return int(round(resize_h / 32) * 32), int(round(resize_w / 32) * 32)


def rapidocr_probability(session: ort.InferenceSession, rgb: np.ndarray) -> np.ndarray:
    """DetPreProcess (BGR as cv2 reads it, (x/255 - 0.5)/0.5, CHW) -> the model's probability map,
    brought back to the image size (DBPostProcess scales its boxes by src/dest)."""
    height, width = rgb.shape[:2]
    rh, rw = rapidocr_size(height, width)
    bgr = rgb[:, :, ::-1].astype(np.float32)
    x = (cv2_linear(bgr, rh, rw) / 255.0 - 0.5) / 0.5
    prob = session.run(None, {"x": x.transpose(2, 0, 1)[None].astype(np.float32)})[0][0, 0]
    return cv2_linear(prob[:, :, None], height, width)[:, :, 0]


@pytest.mark.slow
@pytest.mark.skipif(not TEXT.available(), reason=TEXT.skip_reason)
@pytest.mark.skipif(text_page() is None, reason="scikit-image is not installed (real-model corpus)")
def test_text_segmenter_agrees_with_rapidocrs_pipeline():
    path = str(TEXT.path())
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    images = [("page", text_page()), *PHOTOS[:1]]
    for name, rgb in images:
        height, width = rgb.shape[:2]
        size = rapidocr_size(height, width)
        seg = Segmenter(path, "binary", mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5), channel_order="BGR",
                        resize="stretch", input_size=size, input_multiple=32, threshold=0.3)
        box = seg.preprocess.plan(height, width)
        assert (box.pad_h, box.pad_w) == size == (box.new_h, box.new_w), name
        want = rapidocr_probability(session, rgb)
        got = seg(rgb)
        assert got.probability.shape == (height, width)
        assert np.abs(got.probability - want).max() < 0.02, name
        bitmap = want > 0.3                        # DBPostProcess: segmentation = pred > thresh
        agree = np.mean(got.mask == bitmap)
        assert agree > 0.999, (name, agree)
        if name == "page":
            assert 0.05 < bitmap.mean() < 0.6      # the page's text lines are found
        seg.close()


@needs_photos
@pytest.mark.skipif(not DETECTOR.available(), reason=DETECTOR.skip_reason)
def test_budgeted_detector_streams_weights_and_detects_the_same():
    """The core runs through the Engine: under a budget that leaves room for a quarter of the
    weights beside the engine's minimum, the weights stream and the detections do not change."""
    path = str(DETECTOR.path())
    name, rgb = PHOTOS[0]
    free = Detector(path, score_threshold=0.05)(rgb)
    det = Detector(path, score_threshold=0.05, swappable=True)
    det(rgb)
    weights_mb = det.engine.weight_bytes / 2**20
    det.engine.set_memory_budget(det.engine.min_budget_mb() + 0.25 * weights_mb)
    budgeted = det(rgb)
    stats = det.engine.stats()
    assert stats["executor"] == "swap" and stats["resident_weight_bytes"] < 0.5 * det.engine.weight_bytes
    assert len(free) == len(budgeted) > 0
    np.testing.assert_array_equal(budgeted.class_ids, free.class_ids)
    np.testing.assert_allclose(budgeted.boxes_xyxy, free.boxes_xyxy, atol=1e-3)
    np.testing.assert_allclose(budgeted.scores, free.scores, atol=1e-5)
    det.close()


@needs_photos
@pytest.mark.skipif(not DETECTOR.available(), reason=DETECTOR.skip_reason)
def test_real_exports_batch_their_frames():
    """The Ultralytics export names its batch axis ``batch`` in and out: photographs of one size
    in one run give each photograph's own detections."""
    with Detector(str(DETECTOR.path()), score_threshold=0.05) as det:
        assert det.max_batch > 1
        size = PHOTOS[0][1].shape
        same = [rgb for _, rgb in PHOTOS if rgb.shape == size][:3] or [PHOTOS[0][1]]
        batch = [*same, same[0][::-1].copy()]
        runs = det.engine.engine_stats().runs
        together = det.batch(batch)
        assert det.engine.engine_stats().runs == runs + 1
        for rgb, batched in zip(batch, together):
            alone = det(rgb)
            np.testing.assert_array_equal(batched.class_ids, alone.class_ids)
            np.testing.assert_allclose(batched.boxes_xyxy, alone.boxes_xyxy, atol=1e-2)
            np.testing.assert_allclose(batched.scores, alone.scores, atol=1e-4)


@pytest.mark.skipif(not TEXT.available(), reason=TEXT.skip_reason)
def test_renamed_output_batch_axis_is_proven_the_input_s():
    """paddle2onnx names the output's batch axis apart from the input's (``p2o.DynamicDimension.3``
    vs ``.0``): RDP proves them equal, so the text detector batches."""
    with Segmenter(str(TEXT.path()), "binary") as seg:
        out, image = seg.info.outputs[0].dims[0], seg.info.inputs[0].dims[0]
        assert isinstance(out, str) and isinstance(image, str) and out != image
        assert seg.max_batch > 1
