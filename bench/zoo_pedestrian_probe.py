"""Probe the pedestrian model's hand-designed channel on the simulator's scenes.

Prints, per resolution, frame time and score_threshold: N boxes, how many overlap a ground-truth
pedestrian, and how many pedestrians got a box. Run: .venv/bin/python bench/zoo_pedestrian_probe.py
"""
from __future__ import annotations

import numpy as np
import onnxruntime as ort

from dynnet_ros.sim import scene
from dynnet_ros.zoo import build_model

RESOLUTIONS = ((640, 480), (1280, 736), (320, 256))
TIMES_S = (0.0, 1.0, 3.0, 7.0)
THRESHOLDS = (0.2, 0.5, 0.8)

Box = tuple[float, float, float, float]  # x1, y1, x2, y2 in pixels


def ground_truth(scn: scene.Scene, width: int, height: int) -> list[Box]:
    """Image-plane boxes of the scene's pedestrians (pinhole projection of their extents)."""
    k = scene.camera_matrix(width, height)
    fx, cx, fy, cy = k[0, 0], k[0, 2], k[1, 1], k[1, 2]
    return [(fx * (-(p.y + p.width / 2) / p.x) + cx, fy * (scene.CAMERA_HEIGHT - p.height) / p.x + cy,
             fx * (-(p.y - p.width / 2) / p.x) + cx, fy * scene.CAMERA_HEIGHT / p.x + cy)
            for p in scn.pedestrians]


def _overlap(a, b) -> bool:
    return bool(a[0] < b[2] and a[2] > b[0] and a[1] < b[3] and a[3] > b[1])


def probe(session: ort.InferenceSession, width: int, height: int, t: float) -> str:
    scn = scene.make_scene(t)
    img, _ = scene.render_camera(scn, width, height)
    gt = ground_truth(scn, width, height)
    visible = [g for g in gt if g[0] < width and g[2] > 0]
    x = (img.astype(np.float32) / 255).transpose(2, 0, 1)[None]
    parts = []
    for thr in THRESHOLDS:
        boxes, _scores = session.run(None, {"image": x, "score_threshold": np.array([thr], np.float32),
                                            "iou_threshold": np.array([0.45], np.float32),
                                            "max_detections": np.array([100], np.int64)})
        on = sum(any(_overlap(b, g) for g in gt) for b in boxes)
        found = sum(any(_overlap(b, g) for b in boxes) for g in visible)
        parts.append(f"thr{thr}: N={len(boxes)} on-ped={on} peds-found={found}/{len(visible)}")
    return " | ".join(parts)


def main() -> None:
    session = ort.InferenceSession(build_model("pedestrian").SerializeToString(), providers=["CPUExecutionProvider"])
    for width, height in RESOLUTIONS:
        for t in TIMES_S:
            print(width, height, t, probe(session, width, height, t))


if __name__ == "__main__":
    main()
