"""Example input feeds for the zoo models (tests, benchmarks, `dynnet zoo info --latency`).

Why here: every caller needs the same extra inputs (the pedestrian thresholds, a sparse LiDAR
image for depth), and they belong with the models' I/O contract.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from dynnet_ros.engine.modelio.onnx_proto import ModelProto

from .cache import MODEL_NAMES


def example_inputs(name: str, height: int = 480, width: int = 640, seed: int = 0) -> dict[str, np.ndarray]:
    """A valid feed for model ``name``: random RGB in [0,1] (+ thresholds / 2% LiDAR hits)."""
    if name not in MODEL_NAMES:
        raise ValueError(f"unknown zoo model {name!r}; expected one of {', '.join(MODEL_NAMES)}")
    if height % 32 or width % 32 or height <= 0 or width <= 0:
        raise ValueError(f"input size {height}x{width} must be positive multiples of 32")
    rng = np.random.default_rng(seed)
    feed = {"image": rng.random((1, 3, height, width), dtype=np.float32)}
    if name == "pedestrian":
        feed.update(score_threshold=np.array([0.3], np.float32), iou_threshold=np.array([0.45], np.float32),
                    max_detections=np.array([100], np.int64))
    elif name == "depth":
        hits = rng.random((1, 1, height, width)) < 0.02
        feed["lidar_depth"] = np.where(hits, rng.uniform(1.0, 60.0, hits.shape), 0.0).astype(np.float32)
    return feed


@dataclass(frozen=True)
class Latency:
    median_ms: float   # wall clock per run
    min_ms: float
    cpu_ms: float      # process CPU time per run, all threads (no spin-waiting): robust to other load
    runs: int


def measure_latency(model: ModelProto, name: str, height: int = 480, width: int = 640,
                    threads: int = 2, runs: int = 10, warmup: int = 2) -> Latency:
    """onnxruntime CPU latency of one model (session options: ``threads`` intra-op threads)."""

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    # no spin-waiting, so CPU time counts work rather than idle polling
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    feed = example_inputs(name, height, width)
    for _ in range(warmup):
        sess.run(None, feed)
    times = []
    cpu_start = time.process_time()
    for _ in range(runs):
        start = time.perf_counter()
        sess.run(None, feed)
        times.append((time.perf_counter() - start) * 1e3)
    cpu_ms = (time.process_time() - cpu_start) * 1e3 / runs
    return Latency(float(np.median(times)), float(min(times)), cpu_ms, runs)
