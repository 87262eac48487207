"""Pictures of perception results: what `dynnet infer` writes beside its JSON.

Figures are drawn with matplotlib's object API (no pyplot state), so this works in threads and
without a display.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib import colormaps
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from dynnet_ros.perception import Depth, Detections, Segmentation

MASK_COLOUR = np.array([0.1, 1.0, 0.2])
DEPTH_CMAP = "turbo"
_DPI = 100


def _figure(width: int, height: int, panels: int = 1) -> Figure:
    fig = Figure(figsize=(panels * width / _DPI, height / _DPI), dpi=_DPI)
    return fig


def detections_png(image: np.ndarray, result: Detections, path: Path) -> None:
    """The image with one labelled box per detection ("class score")."""
    height, width = image.shape[:2]
    fig = _figure(width, height)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.imshow(image)
    palette = colormaps["tab10"]
    for (x1, y1, x2, y2), score, cid, name in zip(result.boxes_xyxy.tolist(), result.scores.tolist(),
                                                  result.class_ids.tolist(), result.class_names):
        colour = palette(int(cid) % 10)
        ax.add_patch(Rectangle((x1, y1), x2 - x1, y2 - y1, fill=False, edgecolor=colour, linewidth=2))
        ax.text(x1, y1, f"{name} {score:.2f}", color="white", fontsize=8, va="bottom",
                bbox={"facecolor": colour, "edgecolor": "none", "pad": 1})
    ax.set_xlim(0, width)
    ax.set_ylim(height, 0)
    ax.axis("off")
    fig.savefig(path, dpi=_DPI)


def segmentation_png(image: np.ndarray, result: Segmentation, path: Path) -> None:
    """The image with the mask blended in green, beside the probability map when there is one."""
    rgb = image.astype(np.float32) / 255.0
    alpha = 0.5 * result.mask[:, :, None]
    overlay = rgb * (1 - alpha) + MASK_COLOUR * alpha
    panels = [overlay]
    if result.probability is not None:
        panels.append(colormaps["magma"](result.probability)[:, :, :3])
    _save_panels(panels, path)


def depth_png(image: np.ndarray, result: Depth, path: Path) -> None:
    """The image beside the depth map (metres, or a relative model's own output before its first
    LiDAR fit), coloured over the map's 2nd-98th percentile so near and far both show; unknown
    pixels black."""
    relative = result.fit is None and result.relative is not None
    values = result.relative if relative and result.relative is not None else result.metres
    valid = np.isfinite(values) if relative else values > 0
    coloured = np.zeros(values.shape + (3,), np.float32)
    if valid.any():
        low, high = np.percentile(values[valid], [2, 98])
        scaled = np.clip((values - low) / ((high - low) or 1.0), 0, 1)
        coloured = colormaps[DEPTH_CMAP](1.0 - scaled if not relative else scaled)[:, :, :3]   # near = warm
        coloured[~valid] = 0.0
    _save_panels([image.astype(np.float32) / 255.0, coloured], path)


def _save_panels(panels: list[np.ndarray], path: Path) -> None:
    height, width = panels[0].shape[:2]
    fig = _figure(width, height, len(panels))
    for i, panel in enumerate(panels):
        ax = fig.add_axes((i / len(panels), 0, 1 / len(panels), 1))
        ax.imshow(np.clip(panel, 0.0, 1.0))
        ax.axis("off")
    fig.savefig(path, dpi=_DPI)
