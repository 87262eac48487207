"""Engine runs at once: frames per second of one engine run at a time against several.

For a zoo model that batches (lane, depth) at a camera size, three settings serve the same frames (``--frames`` per
setting, after two warm-up rounds), each the way a multi-camera node would:

- ``one run``: one thread runs batches of ``--batch`` frames on an engine with every CPU
  (``threads`` default), what ``batches_in_flight: 1`` does;
- ``runs at once``: ``--runs`` threads each run batches of ``batch / runs`` frames on one engine
  built with ``concurrent_runs=runs`` (the CPUs shared between them), what
  ``batches_in_flight: 2`` does;
- ``runs at once, every CPU each``: the same with ``threads`` = every CPU per run.

Printed: frames/s, CPU ms per frame and the arena bytes each setting holds (every lane's). The
engine is built ``swappable`` like a node's, with no budget.

Usage: python bench/engine_runs.py [--model lane] [--size 640x480] [--batch 4] [--runs 2] [--frames 64]
"""
from __future__ import annotations

import argparse
import threading
import time

import numpy as np

from dynnet_ros.engine import Engine
from dynnet_ros.engine.plan.options import default_threads
from dynnet_ros.sim.frames import parse_resolution
from dynnet_ros.zoo import ensure_model
from dynnet_ros.zoo.samples import example_inputs


def measure(model: str, height: int, width: int, batch: int, runs: int, threads: int | None,
            frames: int) -> tuple[float, float, float]:
    """(frames/s, CPU ms per frame, arena MiB) of ``runs`` threads on one engine."""
    one = example_inputs(model, height, width)
    per_run = max(1, batch // runs)
    feeds = {name: np.repeat(value, per_run, axis=0) if value.ndim == 4 else value for name, value in one.items()}
    with Engine(str(ensure_model(model)), swappable=True, concurrent_runs=runs, threads=threads) as engine:
        for _ in range(2):
            engine.run(feeds)
        rounds = max(1, frames // (per_run * runs))

        def work() -> None:
            for _ in range(rounds):
                engine.run(feeds)

        workers = [threading.Thread(target=work) for _ in range(runs)]
        start, cpu = time.perf_counter(), time.process_time()
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        served = rounds * per_run * runs
        arena = engine.engine_stats().executor_stats.arena_bytes or 0
    return served / wall, cpu * 1e3 / served, arena / 2**20


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="lane")
    parser.add_argument("--size", default="640x480", help="camera size WxH")
    parser.add_argument("--batch", type=int, default=4, help="frames in flight (the cameras)")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--frames", type=int, default=64)
    args = parser.parse_args()
    width, height = parse_resolution(args.size)
    cpus = default_threads()
    settings = [("one run", 1, None), ("runs at once", args.runs, None),
                ("runs at once, every CPU each", args.runs, cpus)]
    print(f"| {args.model} {args.size}, {args.batch} frames in flight | runs x threads | frames/s | "
          f"CPU ms/frame | arena MiB |\n|---|---|---|---|---|")
    for label, runs, threads in settings:
        fps, cpu_ms, arena = measure(args.model, height, width, args.batch, runs, threads, args.frames)
        used = threads or max(1, cpus // runs)
        print(f"| {label} | {runs} x {used} | {fps:.1f} | {cpu_ms:.1f} | {arena:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
