"""Input frames for `dynnet map`: synthetic road scenes of mixed difficulty, or `.npz` files.

Why here (commands layer): the scenes come from the sensor simulator's renderer
(``sim/scene.py``) and the mapper takes plain feeds, so the two meet in the command.

Difficulty varies frame to frame: 0-4 pedestrians, contrast from full down to 30 %, and sensor
noise up to sigma 0.15, so early exits see easy and hard frames alike.
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from dynnet_ros.engine.modelio.models import input_specs
from dynnet_ros.engine.modelio.onnx_proto import ModelProto
from dynnet_ros.sim.scene import make_scene, render_camera

LIDAR_HIT_RATE = 0.02


def scene_image(index: int, height: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Frame ``index``: RGB [1,3,H,W] float32 in [0,1] and the scene's true depth [1,1,H,W] (0: sky)."""
    rng = np.random.default_rng(1000 + index)
    scene = make_scene(0.7 * index, count=index % 5)
    rgb, depth = render_camera(scene, width, height, frame=index)
    image = rgb.astype(np.float32) / 255.0
    contrast = 1.0 - 0.7 * ((index * 7) % 10) / 9.0
    noise = 0.15 * ((index * 3) % 5) / 4.0
    image = 0.5 + (image - 0.5) * contrast + rng.normal(0.0, noise, image.shape).astype(np.float32)
    image = np.clip(image, 0.0, 1.0).transpose(2, 0, 1)[None].astype(np.float32)
    finite = np.where(np.isfinite(depth), depth, 0.0).astype(np.float32)
    return np.ascontiguousarray(image), finite[None, None]


def scene_feeds(model: ModelProto, count: int, height: int, width: int) -> Iterator[dict[str, np.ndarray]]:
    """``count`` feeds for ``model``: the scene image for a [1,3,H,W] input, sparse LiDAR depth for a
    [1,1,H,W] one, the zoo detector's thresholds for its [1] inputs."""
    specs = input_specs(model)
    for index in range(count):
        image, depth = scene_image(index, height, width)
        rng = np.random.default_rng(index)
        feed: dict[str, np.ndarray] = {}
        for spec in specs:
            if spec.rank == 4 and spec.dims[1] == 3:
                feed[spec.name] = image
            elif spec.rank == 4 and spec.dims[1] == 1:
                hits = rng.random(depth.shape) < LIDAR_HIT_RATE
                feed[spec.name] = np.where(hits, depth, 0.0).astype(np.float32)
            elif spec.rank == 1 and spec.dtype == np.int64:
                feed[spec.name] = np.array([100], np.int64)
            elif spec.rank == 1:
                feed[spec.name] = np.array([0.45 if "iou" in spec.name else 0.3], spec.dtype)
            else:
                raise ValueError(f"cannot make a scene feed for input {spec.describe()}; give --inputs FILE.npz")
        yield feed


def npz_feeds(paths: list[Path], model: ModelProto) -> list[dict[str, np.ndarray]]:
    """One feed per ``.npz`` file, keyed by the model's input names; ValueError naming what is missing."""
    names = [spec.name for spec in input_specs(model)]
    feeds = []
    for path in paths:
        try:
            with np.load(path) as data:
                feed = {name: np.ascontiguousarray(data[name]) for name in names if name in data}
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path}: not a readable .npz file ({exc})") from None
        missing = [name for name in names if name not in feed]
        if missing:
            raise ValueError(f"{path}: no array for input(s) {', '.join(missing)} (it has the model's inputs by name)")
        feeds.append(feed)
    return feeds
