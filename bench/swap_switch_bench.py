"""Budget-change latency: cycle Engine.set_memory_budget through every level of a model's table.

Usage: python bench/swap_switch_bench.py [MODEL ...] [--height H --width W --cycles N]
Prints, per model, the p50/p95/max time of one set_memory_budget call and how many calls
crossed between store variants (all <-> basic), with the other variant's executor kept warm
(default) and rebuilt on each crossing (DYNNET_SWAP_KEEP_WARM=0 semantics), as JSON lines.
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np

from dynnet_ros.engine import Engine
from dynnet_ros.swap.control import SwapControl
from dynnet_ros.zoo import ensure_model


def feeds_for(engine: Engine, h: int, w: int) -> dict:
    from dynnet_ros.swap.bench import make_feeds  # the swap bench's valid inputs per zoo model

    return make_feeds(engine.inputs, h, w)


def measure(name: str, h: int, w: int, cycles: int, keep_warm: bool) -> dict:
    SwapControl.keep_warm = keep_warm
    engine = Engine(str(ensure_model(name)), threads=1)
    feeds = feeds_for(engine, h, w)
    engine.run(feeds)
    levels = [mb for mb, _ in engine.latency_table()[:-1]]  # swapped levels (the last is in memory)
    engine.set_memory_budget(levels[0])
    engine.run(feeds)
    cross_times: list[float] = []
    times, crossings, variant = [], 0, engine.stats()["swap"]["optimized"]
    # every level up and down, then jumps between the bottom (+ room for a warm sibling) and the top
    sequence = levels + levels[::-1] + [levels[0] + 2.0, levels[-1]] * 3
    for _ in range(cycles):
        for mb in sequence:
            start = time.perf_counter()
            engine.set_memory_budget(mb * 1.0001)
            times.append((time.perf_counter() - start) * 1e3)
            now = engine.stats()["swap"]["optimized"]
            crossings += now != variant
            if now != variant:
                cross_times.append(times[-1])
            variant = now
        engine.run(feeds)
    engine.close()
    t = np.array(times)
    return {"model": name, "keep_warm": keep_warm, "input": f"{h}x{w}", "switches": len(times),
            "crossings": crossings, "p50_ms": round(float(np.percentile(t, 50)), 2),
            "p95_ms": round(float(np.percentile(t, 95)), 2), "max_ms": round(float(t.max()), 2),
            "crossing_p95_ms": round(float(np.percentile(cross_times, 95)), 2) if cross_times else None,
            "crossing_ms": [round(x, 1) for x in cross_times]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=["lane", "depth"])
    parser.add_argument("--height", type=int, default=480)
    parser.add_argument("--width", type=int, default=640)
    parser.add_argument("--cycles", type=int, default=3)
    args = parser.parse_args()
    for name in args.models:
        for keep_warm in (False, True):
            print(json.dumps(measure(name, args.height, args.width, args.cycles, keep_warm)), flush=True)


if __name__ == "__main__":
    main()
