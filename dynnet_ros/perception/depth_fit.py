"""Robust scale-and-shift fit of relative inverse depth to LiDAR: 1/z = scale * relative + shift.

Why in inverse depth: MiDaS/Depth-Anything-style models predict inverse depth up to an unknown
affine map, so the model is linear there (and far points, whose inverse depth is near zero, do
not dominate the fit). Why robust: projected LiDAR returns include points seen through glass, on
thin structures the camera misses, or behind an edge (parallax between the sensors); a plain
least-squares fit follows them. The fit is least median of squares over random point pairs
(breakdown point 50 %), then least squares on the points within ``sigmas`` robust standard
deviations, repeated until the inlier set settles. Plain numpy: a few hundred candidate lines
over a subsample cost well under a frame's inference, and the result is deterministic (fixed
seed).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class AffineFit:
    scale: float
    shift: float
    residual: float   # RMS of the inliers' residuals (units of y)
    inliers: int


def robust_affine_fit(x: np.ndarray, y: np.ndarray, *, min_points: int = 20, trials: int = 256,
                      sample: int = 2000, sigmas: float = 3.0, rounds: int = 10,
                      seed: int = 0) -> AffineFit | None:
    """Fit y = scale * x + shift with scale > 0, robust to up to half the points being outliers.

    None when there are fewer than ``min_points`` points or no increasing line explains them.
    """
    x = np.asarray(x, dtype=np.float64).reshape(-1)
    y = np.asarray(y, dtype=np.float64).reshape(-1)
    finite = np.isfinite(x) & np.isfinite(y)
    x, y = x[finite], y[finite]
    n = len(x)
    if n < max(min_points, 3):
        return None
    rng = np.random.default_rng(seed)
    pick = rng.choice(n, size=sample, replace=False) if n > sample else np.arange(n)
    xs, ys = x[pick], y[pick]
    i, j = rng.integers(0, len(xs), trials), rng.integers(0, len(xs), trials)
    dx = xs[i] - xs[j]
    usable = np.abs(dx) > 1e-12 * max(float(np.abs(xs).max()), 1.0)
    if not usable.any():
        return None
    slopes = (ys[i] - ys[j])[usable] / dx[usable]
    shifts = ys[i][usable] - slopes * xs[i][usable]
    increasing = slopes > 0
    if not increasing.any():
        return None
    slopes, shifts = slopes[increasing], shifts[increasing]
    median_sq = np.median((ys[None, :] - (slopes[:, None] * xs[None, :] + shifts[:, None])) ** 2, axis=1)
    best = int(np.argmin(median_sq))
    scale, shift = float(slopes[best]), float(shifts[best])
    floor = 1e-9 * max(float(np.abs(y).mean()), 1e-12)   # exact data: a zero spread must still admit inliers
    inliers: np.ndarray | None = None
    for _ in range(rounds):
        residual = y - (scale * x + shift)
        # robust spread (LMedS scale estimate with its small-sample correction)
        spread = 1.4826 * (1.0 + 5.0 / max(n - 2, 1)) * float(np.sqrt(np.median(residual ** 2)))
        chosen = np.abs(residual) <= sigmas * spread + floor
        if chosen.sum() < 3:
            break
        if inliers is not None and np.array_equal(chosen, inliers):
            break
        inliers = chosen
        design = np.stack([x[inliers], np.ones(int(inliers.sum()))], axis=1)
        (scale, shift), *_ = np.linalg.lstsq(design, y[inliers], rcond=None)
        scale, shift = float(scale), float(shift)
    if inliers is None or scale <= 0:
        return None
    residual = y[inliers] - (scale * x[inliers] + shift)
    return AffineFit(scale, shift, float(np.sqrt(np.mean(residual ** 2))), int(inliers.sum()))
