"""What serving four cameras as batches gains over one frame per model run, without ROS.

A ``ServingCore`` with the zoo's lane model and four cameras (``front``, ``left``, ``right``,
``rear``) is handed rounds of four frames, one per camera, all offered at once; a round ends
when its four results are out. Per setting, the median round time over ``--rounds`` rounds
(after two warm-up rounds) and the frames per second it makes: ``batch_window_ms`` 5 (the four
frames run as one batch, one engine run) against 0 (one engine run per frame). Printed as a
Markdown table (docs/ros.md, "Several cameras on one model node").

Usage: python bench/serving_cameras.py [--rounds 20] [--size 640x480] [--threads 1]
"""
from __future__ import annotations

import argparse
import logging
import statistics
import threading
import time
from typing import Any

import numpy as np

from dynnet_ros.nodes.lane_node import make_segmenter
from dynnet_ros.nodes.model_params import common_specs
from dynnet_ros.perception.budget_split import FrameCosts
from dynnet_ros.perception.mailbox import Arrival
from dynnet_ros.perception.serving import Decoded, FrameInfo, ServingCore, ServingTask
from dynnet_ros.sim.frames import parse_resolution
from dynnet_ros.zoo import ensure_model

CAMERAS = ("front", "left", "right", "rear")


def run(window_ms: float, rounds: int, width: int, height: int, threads: int) -> list[float]:
    """Round times (ms) of a four-camera core with ``batch_window_ms`` ``window_ms``."""
    done = threading.Semaphore(0)
    params: dict[str, Any] = {spec.name: spec.default for spec in common_specs("lane")}
    params.update({"model_path": str(ensure_model("lane")), "threads": threads, "max_input_side": 0,
                   "cameras": list(CAMERAS), "batch_window_ms": window_ms, "model_format": "auto",
                   "classes": [""], "output_name": "", "lane_threshold": 0.5,
                   "camera_sizes": [f"{width}x{height}"]})

    def serve(frames: list[FrameInfo], rgbs: list[np.ndarray], core: Any) -> None:
        core.batch(rgbs)

    def outcome(arrival: Arrival, what: str) -> None:
        if what == "processed":
            done.release()

    task = ServingTask("lane", lambda path, p, budget: make_segmenter(path, p, budget),
                       lambda rgb: Decoded(rgb, None, "rgb8", rgb.nbytes), serve, costs=FrameCosts(0, 8.0))
    core = ServingCore(task, params, logging.getLogger("serving_cameras"), name="bench", outcome=outcome,
                       status_changed=lambda: None, sources=list(CAMERAS))
    core.worker.start()
    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 255, (height, width, 3), dtype=np.uint8) for _ in CAMERAS]
    times = []
    try:
        for index in range(rounds + 2):
            start = time.perf_counter()
            for i, cam in enumerate(CAMERAS):
                core.offer(cam, index * 10 + i, cam, frames[i])
            for _ in CAMERAS:
                done.acquire()
            if index >= 2:
                times.append((time.perf_counter() - start) * 1e3)
    finally:
        core.close()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20, help="timed rounds per setting (default 20)")
    parser.add_argument("--size", default="640x480", help="camera frame WIDTHxHEIGHT (default 640x480)")
    parser.add_argument("--threads", type=int, default=1, help="engine threads (default 1)")
    args = parser.parse_args()
    width, height = parse_resolution(args.size)
    print(f"| four {args.size} cameras, lane zoo model | round (4 frames), median ms | frames/s |")
    print("|---|---|---|")
    settings = (("one frame per run (`batch_window_ms: 0`)", 0.0), ("one batch of 4 (`batch_window_ms: 5`)", 5.0))
    for label, window in settings:
        median = statistics.median(run(window, args.rounds, width, height, args.threads))
        print(f"| {label} | {median:.1f} | {4e3 / median:.1f} |")


if __name__ == "__main__":
    main()
