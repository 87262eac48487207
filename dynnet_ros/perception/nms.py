"""Class-aware non-maximum suppression in numpy, for detector exports without NMS in the graph.

The rule is the one torchvision's ``batched_nms`` and Ultralytics apply: boxes of different
classes never suppress each other; within a class, a box is dropped when its IoU with a
higher-scoring kept box is above ``iou_threshold``; ties in score keep the earlier box.
"""
from __future__ import annotations

import numpy as np

#: Most candidates entering NMS (highest scores first): bounds the quadratic worst case on a
#: frame where a raw head puts thousands of boxes above the score threshold.
MAX_CANDIDATES = 30000


def box_iou(box: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """IoU of one x1,y1,x2,y2 box with each of ``boxes`` (N,4)."""
    ix1 = np.maximum(box[0], boxes[:, 0])
    iy1 = np.maximum(box[1], boxes[:, 1])
    ix2 = np.minimum(box[2], boxes[:, 2])
    iy2 = np.minimum(box[3], boxes[:, 3])
    inter = np.clip(ix2 - ix1, 0, None) * np.clip(iy2 - iy1, 0, None)
    area = (box[2] - box[0]) * (box[3] - box[1])
    areas = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    union = area + areas - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)


def nms(boxes: np.ndarray, scores: np.ndarray, class_ids: np.ndarray, iou_threshold: float,
        max_detections: int) -> np.ndarray:
    """Indices of the kept boxes, highest score first, at most ``max_detections``."""
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    class_ids = np.asarray(class_ids).reshape(-1)
    if not len(boxes) == len(scores) == len(class_ids):
        raise ValueError(f"nms needs as many boxes ({len(boxes)}), scores ({len(scores)}) and class ids "
                         f"({len(class_ids)})")
    order = np.argsort(-scores, kind="stable")[:MAX_CANDIDATES]
    if not len(order):
        return order
    # Offset each class into its own coordinate range: one pass, no cross-class overlaps.
    span = float(np.abs(boxes[order]).max()) + 1.0
    shifted = boxes + (class_ids.astype(np.float64) * 2.0 * span)[:, None]
    keep: list[int] = []
    remaining = order
    while len(remaining) and len(keep) < max_detections:
        best = remaining[0]
        keep.append(int(best))
        rest = remaining[1:]
        if not len(rest):
            break
        remaining = rest[box_iou(shifted[best], shifted[rest]) <= iou_threshold]
    return np.asarray(keep, dtype=np.intp)
