"""`dynnet demo`'s picture of what the models saw and said: recent frames per model, one montage.

Why the demo records frames itself instead of asking the nodes: the nodes' outputs carry the
camera header (stamp and frame_id), so pairing each output with the camera frame, CameraInfo
and LiDAR cloud of the same stamp shows exactly the input a result came from, with no change
to the nodes. Pedestrian boxes are read back from the markers the node publishes (corners on
the z = 1 m plane of the camera frame, so pixel = K · corner) and their labels' text (class and
score), which works whether or not vision_msgs is installed.

Memory stays bounded: a short ring of camera messages (the newest ``CAMERA_RING`` frames, as
received, not converted) and per model the few newest pairs per camera resolution.
"""
from __future__ import annotations

import threading
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from rclpy.node import Node
from rclpy.qos import qos_profile_sensor_data
from sensor_msgs.msg import CameraInfo, Image, PointCloud2
from visualization_msgs.msg import MarkerArray

from dynnet_ros.geometry import extrinsic_matrix, transform_points
from dynnet_ros.nodes.convert import cloud_to_xyzi, image_to_array, image_to_rgb8
from dynnet_ros.nodes.foxglove_view import marker_outlines
from dynnet_ros.perception.projection import validate_intrinsics
from dynnet_ros.view.convert import plane_boxes

#: camera messages kept to pair with outputs (an output arrives one inference after its frame)
CAMERA_RING = 24
#: frames shown per model row (the depth row shows half as many, each as depth map + LiDAR)
FRAMES_PER_ROW = 4
#: pairs kept per model and camera resolution
PAIRS_PER_SIZE = 2
LANE_COLOUR = np.array([0.1, 1.0, 0.2])
DEPTH_CMAP = "turbo"

Stamp = tuple[int, int]


def _stamp(header) -> Stamp:
    return int(header.stamp.sec), int(header.stamp.nanosec)


@dataclass
class Pair:
    """One model output with the camera frame (and, for depth, the cloud and K) it came from."""

    t: float                   # stamp in seconds
    camera: Image
    output: Any
    intrinsics: np.ndarray | None = None
    cloud: PointCloud2 | None = None


@dataclass
class _ModelPairs:
    by_size: dict[tuple[int, int], deque] = field(default_factory=dict)

    def add(self, pair: Pair) -> None:
        size = (int(pair.camera.width), int(pair.camera.height))
        self.by_size.setdefault(size, deque(maxlen=PAIRS_PER_SIZE)).append(pair)

    def recent(self, count: int) -> list[Pair]:
        """The newest pair of each camera size first (so the row shows every resolution seen),
        then the next newest, oldest to newest left to right."""
        rounds = [sorted((q[-1 - i] for q in self.by_size.values() if len(q) > i), key=lambda p: -p.t)
                  for i in range(PAIRS_PER_SIZE)]
        chosen = [p for r in rounds for p in r][:count]
        return sorted(chosen, key=lambda p: p.t)


class FrameRecorder:
    """Subscribes on ``node`` (spun elsewhere) under ``namespace`` and keeps recent pairs: of the
    single camera (``camera/image_raw``, outputs ``lane/mask``, ...), or of the listed camera
    ``camera`` (``NAME/image_raw``, outputs ``NAME/lane/mask``, ...) of a multi-camera graph."""

    def __init__(self, node: Node, namespace: str, lidar_to_camera: list[float], camera: str | None = None) -> None:
        self.lidar_to_camera = extrinsic_matrix(lidar_to_camera)
        self.lock = threading.Lock()
        self._camera: OrderedDict[Stamp, Image] = OrderedDict()
        self._clouds: OrderedDict[Stamp, PointCloud2] = OrderedDict()
        self._infos: dict[tuple[int, int], np.ndarray] = {}
        self.pairs = {task: _ModelPairs() for task in ("lane", "pedestrian", "depth")}
        qos = qos_profile_sensor_data
        ns = namespace.rstrip("/")
        outputs = f"{ns}/{camera}" if camera else ns
        node.create_subscription(Image, f"{ns}/{camera or 'camera'}/image_raw", self._on_camera, qos)
        node.create_subscription(CameraInfo, f"{ns}/{camera or 'camera'}/camera_info", self._on_info, qos)
        node.create_subscription(PointCloud2, f"{ns}/lidar/points", self._on_cloud, qos)
        node.create_subscription(Image, f"{outputs}/lane/mask", lambda m: self._on_output("lane", m), 5)
        node.create_subscription(MarkerArray, f"{outputs}/pedestrian/markers",
                                 lambda m: self._on_output("pedestrian", m), 5)
        node.create_subscription(Image, f"{outputs}/depth/image", lambda m: self._on_output("depth", m), 5)

    def _on_camera(self, msg: Image) -> None:
        with self.lock:
            self._camera[_stamp(msg.header)] = msg
            while len(self._camera) > CAMERA_RING:
                self._camera.popitem(last=False)

    def _on_cloud(self, msg: PointCloud2) -> None:
        with self.lock:
            self._clouds[_stamp(msg.header)] = msg
            while len(self._clouds) > CAMERA_RING:
                self._clouds.popitem(last=False)

    def _on_info(self, msg: CameraInfo) -> None:
        try:
            k = validate_intrinsics(msg.k)
        except ValueError:
            return
        with self.lock:
            self._infos[(int(msg.width), int(msg.height))] = k

    def _on_output(self, task: str, msg: Any) -> None:
        header = msg.markers[0].header if isinstance(msg, MarkerArray) and msg.markers else getattr(msg, "header", None)
        if header is None:
            return
        key = _stamp(header)
        with self.lock:
            camera = self._camera.get(key)
            if camera is None:
                return
            pair = Pair(t=key[0] + key[1] * 1e-9, camera=camera, output=msg,
                        intrinsics=self._infos.get((int(camera.width), int(camera.height))),
                        cloud=self._clouds.get(key))
            self.pairs[task].add(pair)

    def snapshot(self) -> dict[str, list[Pair]]:
        with self.lock:
            return {task: pairs.recent(FRAMES_PER_ROW if task != "depth" else FRAMES_PER_ROW // 2)
                    for task, pairs in self.pairs.items()}


# --------------------------------------------------------------------------- reading outputs back

def marker_boxes(markers: MarkerArray, k: np.ndarray) -> list[tuple[np.ndarray, str]]:
    """Pixel boxes (x1, y1, x2, y2) and label text of a pedestrian MarkerArray.

    Box markers are LINE_STRIPs on the z = 1 m plane; labels are the TEXT_VIEW_FACING markers
    with the same id (the live view reads them the same way)."""
    outlines, labels, _ = marker_outlines(markers)
    return list(zip(plane_boxes(outlines, k), labels))


def lidar_pixels(cloud: PointCloud2, transform: np.ndarray, k: np.ndarray, width: int,
                 height: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """u, v, depth (m) of the cloud's points that land in the image, nearest first drawn last."""
    cam = transform_points(transform, cloud_to_xyzi(cloud)[:, :3])
    cam = cam[cam[:, 2] > 0.1]
    u = k[0, 0] * cam[:, 0] / cam[:, 2] + k[0, 1] * cam[:, 1] / cam[:, 2] + k[0, 2]
    v = k[1, 1] * cam[:, 1] / cam[:, 2] + k[1, 2]
    inside = (u >= 0) & (u < width) & (v >= 0) & (v < height)
    order = np.argsort(-cam[inside, 2])
    return u[inside][order], v[inside][order], cam[inside, 2][order]


# --------------------------------------------------------------------------- rendering

def _title(pair: Pair, t0: float | None) -> str:
    when = f"t={pair.t - t0:.1f} s" if t0 is not None else ""
    return f"{pair.camera.width}x{pair.camera.height} {when}".strip()


def _lane_panel(ax, pair: Pair) -> None:
    rgb = image_to_rgb8(pair.camera).astype(np.float32) / 255.0
    mask = image_to_array(pair.output) > 0
    overlay = rgb.copy()
    overlay[mask] = 0.45 * rgb[mask] + 0.55 * LANE_COLOUR
    ax.imshow(overlay)
    ax.set_xlabel(f"lane pixels {100.0 * mask.mean():.1f} %", fontsize=7)


def _pedestrian_panel(ax, pair: Pair) -> None:
    ax.imshow(image_to_rgb8(pair.camera))
    boxes = marker_boxes(pair.output, pair.intrinsics) if pair.intrinsics is not None else []
    for (x1, y1, x2, y2), text in boxes:
        ax.add_patch(Rectangle((x1, y1), x2 - x1, y2 - y1, fill=False, edgecolor="red", linewidth=1.2))
        ax.text(x1, y1, text, color="white", fontsize=6, va="bottom",
                bbox={"facecolor": "red", "alpha": 0.7, "pad": 1, "linewidth": 0})
    ax.set_xlabel(f"{len(boxes)} detection(s)" if pair.intrinsics is not None else "no CameraInfo: boxes unknown",
                  fontsize=7)


def _depth_panels(ax_depth, ax_lidar, pair: Pair, transform: np.ndarray, vmax: float, fig: Figure) -> None:
    depth = image_to_array(pair.output)
    shown = ax_depth.imshow(depth, cmap=DEPTH_CMAP, vmin=0.0, vmax=vmax)
    fig.colorbar(shown, ax=ax_depth, fraction=0.035, pad=0.02).set_label("m", fontsize=7)
    ax_depth.set_xlabel("depth_node output", fontsize=7)
    grey = image_to_rgb8(pair.camera).mean(axis=2)
    ax_lidar.imshow(grey, cmap="gray", vmin=0, vmax=400)  # dimmed so the points stand out
    if pair.cloud is not None and pair.intrinsics is not None:
        u, v, z = lidar_pixels(pair.cloud, transform, pair.intrinsics, int(pair.camera.width),
                               int(pair.camera.height))
        ax_lidar.scatter(u, v, c=z, cmap=DEPTH_CMAP, vmin=0.0, vmax=vmax, s=2, linewidths=0)
        ax_lidar.set_xlabel(f"LiDAR: {len(z)} points in view, same colour scale", fontsize=7)
    else:
        ax_lidar.set_xlabel("no LiDAR cloud with this stamp", fontsize=7)
    ax_lidar.set_xlim(0, pair.camera.width)
    ax_lidar.set_ylim(pair.camera.height, 0)


def render_montage(pairs: dict[str, list[Pair]], lidar_to_camera: np.ndarray, path: Path,
                   nodes: dict[str, str] | None = None) -> bool:
    """Write the montage PNG: one row per model (lane, pedestrian, depth); False when no model
    output could be paired with its camera frame (nothing is written then)."""
    if not any(pairs.values()):
        return False
    nodes = nodes or {}
    stamps = [p.t for row in pairs.values() for p in row]
    t0 = min(stamps) if stamps else None
    depth_vmax = max((float(np.percentile(image_to_array(p.output), 98)) for p in pairs.get("depth", [])),
                     default=50.0) or 50.0
    fig = Figure(figsize=(4.0 * FRAMES_PER_ROW, 3.4 * 3), layout="constrained")
    grid = fig.add_gridspec(3, FRAMES_PER_ROW)
    rows = (("lane", "camera + lane mask"), ("pedestrian", "boxes: class score"),
            ("depth", "depth map | LiDAR points"))
    for r, (task, what) in enumerate(rows):
        row = pairs.get(task, [])
        label = f"{nodes.get(task, task + '_node')}\n{what}"
        if not row:
            ax = fig.add_subplot(grid[r, :])
            ax.text(0.5, 0.5, f"{label}: no output paired with a camera frame", ha="center", va="center")
            ax.set_axis_off()
            continue
        for i, pair in enumerate(row):
            if task == "depth":
                ax_d, ax_l = fig.add_subplot(grid[r, 2 * i]), fig.add_subplot(grid[r, 2 * i + 1])
                _depth_panels(ax_d, ax_l, pair, lidar_to_camera, depth_vmax, fig)
                axes = [ax_d, ax_l]
            else:
                axes = [fig.add_subplot(grid[r, i])]
                (_lane_panel if task == "lane" else _pedestrian_panel)(axes[0], pair)
            for ax in axes:
                ax.set_xticks([])
                ax.set_yticks([])
                ax.set_title(_title(pair, t0), fontsize=8)
            if i == 0:
                axes[0].set_ylabel(label, fontsize=8)
    fig.suptitle("recent frames per model (output paired with the camera frame of the same stamp)", fontsize=10)
    fig.savefig(path, dpi=90)
    return True


__all__ = ["FrameRecorder", "Pair", "lidar_pixels", "marker_boxes", "render_montage"]
