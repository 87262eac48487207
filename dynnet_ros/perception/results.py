"""What the perception cores return: typed results in source-image pixels."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Detections:
    """Boxes x1, y1, x2, y2 (N, 4) float32 in source pixels, highest score first."""

    boxes_xyxy: np.ndarray
    scores: np.ndarray       # (N,) float32
    class_ids: np.ndarray    # (N,) int64
    class_names: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.scores)

    def to_json(self) -> list[dict[str, Any]]:
        return [{"box_xyxy": [round(float(v), 2) for v in box], "score": round(float(score), 4),
                 "class_id": int(cid), "class_name": name}
                for box, score, cid, name in zip(self.boxes_xyxy, self.scores, self.class_ids, self.class_names)]


@dataclass(frozen=True)
class Segmentation:
    """``mask``: (H, W) bool of the selected classes at source size; ``probability``: (H, W) float32
    in [0, 1] that a pixel belongs to them (None when the model gives none); ``class_map``:
    (H, W) int32 class per pixel for multi-class models (else None)."""

    mask: np.ndarray
    probability: np.ndarray | None = None
    class_map: np.ndarray | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"mask_fraction": round(float(self.mask.mean()), 5) if self.mask.size else 0.0}
        if self.class_map is not None:
            ids, counts = np.unique(self.class_map, return_counts=True)
            out["class_pixels"] = {int(i): int(c) for i, c in zip(ids, counts)}
        return out


@dataclass(frozen=True)
class DepthFit:
    """Relative inverse depth made metric: 1 / metres = scale * relative + shift.

    ``residual``: RMS of the inliers' inverse-depth residuals (1/m); ``points``: LiDAR points that
    fell on the frame; ``inliers``: those the fit kept; ``held``: this frame had too few points
    (or no usable fit) and the last good fit was reused."""

    scale: float
    shift: float
    residual: float
    points: int
    inliers: int
    held: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"scale": self.scale, "shift": self.shift, "residual_inv_m": self.residual, "points": self.points,
                "inliers": self.inliers, "held": self.held}


@dataclass(frozen=True)
class Depth:
    """``metres``: (H, W) float32 at source size, 0 where unknown. ``fit``: how a relative model's
    output was made metric (None for metric models); ``lidar_points``: LiDAR points on the frame;
    ``relative``: a relative model's own output at source size (None for metric models)."""

    metres: np.ndarray
    fit: DepthFit | None = None
    lidar_points: int = 0
    relative: np.ndarray | None = None

    def to_json(self) -> dict[str, Any]:
        valid = self.metres[self.metres > 0]
        return {"valid_fraction": round(float(valid.size / max(self.metres.size, 1)), 5),
                "min_m": float(valid.min()) if valid.size else None,
                "median_m": float(np.median(valid)) if valid.size else None,
                "max_m": float(valid.max()) if valid.size else None,
                "lidar_points": self.lidar_points, "fit": None if self.fit is None else self.fit.to_json()}
