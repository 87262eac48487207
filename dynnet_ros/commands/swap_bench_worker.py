"""Child-process entry of ``dynnet swap bench``: one configuration measured in a fresh process.

``python -m dynnet_ros.commands.swap_bench_worker CONFIG RESULT`` (commands/swap_bench.py starts
it). A fresh process per configuration because peak RSS is a per-process high-water mark and
allocator state carries over. The worker takes its baseline RSS after imports (this module's
imports, onnxruntime's included, are part of the baseline, not of the model) and input creation,
*before the model is loaded*, then reports:

* ``peak_load_mb``   VmHWM − baseline including model loading (ONNX parse, weight file verify),
* ``peak_mb``        VmHWM − baseline while serving frames (the mark is reset after loading
                     with ``/proc/self/clear_refs``; memory still held from loading counts),
* latency mean/p95, ``Cached`` growth in /proc/meminfo, and how much of the weight file
  sits in the page cache afterwards (mincore — immune to other processes' I/O).

Mode ``sequence`` (``sequence_worker``) instead feeds a sequence of input shapes to one engine
built with a budget at the first of them, as a node does, and reports per frame the peak (VmHWM
− baseline, the mark reset before each frame), the latency, the engine's minimum at that shape
and whether the frame ran within the budget, ran flagged over it, or was refused. A frame's peak
includes what the process held when it began (``held_before_mb``): after a frame flagged over
the budget, the next one starts from that state.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import gc
import json
import mmap
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import onnxruntime as ort

from dynnet_ros.bytesize import MB
from dynnet_ros.engine.engine import Engine
from dynnet_ros.engine.modelio.models import input_specs, load_model
from dynnet_ros.engine.runtime.base import BudgetExceeded
from dynnet_ros.memtrim import release_memory
from dynnet_ros.procmem import reset_peak_rss, status_bytes

SPECIAL_INPUTS: dict[str, np.ndarray] = {
    "score_threshold": np.array([0.3], np.float32), "iou_threshold": np.array([0.5], np.float32),
    "max_detections": np.array([50], np.int64)}


class _Runner(Protocol):
    """What every measured configuration offers: the Engine and direct onnxruntime (``_OrtDirect``)."""

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]: ...

    def stats(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


# ---------------------------------------------------------------------------- measurements
def meminfo_kb(key: str) -> int:
    with open("/proc/meminfo") as handle:
        for line in handle:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


def cached_bytes_of(path: str | os.PathLike) -> int:
    """Bytes of ``path`` resident in the page cache (mincore over a read-only mapping)."""
    size = os.path.getsize(path)
    if size == 0:
        return 0
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    page = mmap.PAGESIZE
    with open(path, "rb") as handle:
        mapped = mmap.mmap(handle.fileno(), size, prot=mmap.PROT_READ)
        try:
            pages = (size + page - 1) // page
            vec = (ctypes.c_ubyte * pages)()
            view = np.frombuffer(mapped, dtype=np.uint8)
            libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
            status = libc.mincore(ctypes.c_void_p(view.ctypes.data), size, vec)
            del view
            if status != 0:
                return -1
            return int(sum(v & 1 for v in vec)) * page
        finally:
            mapped.close()


def make_feeds(input_specs, height: int, width: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Image-like inputs in [0, 1) (LiDAR-like ones mostly empty), zoo extras at sane values."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for spec in input_specs:
        if spec.name in SPECIAL_INPUTS:
            feeds[spec.name] = SPECIAL_INPUTS[spec.name].astype(spec.dtype)
            continue
        dims = [d if isinstance(d, int) else (height if i == len(spec.dims) - 2 else width if i == len(spec.dims) - 1
                                              else 1) for i, d in enumerate(spec.dims)]
        value = rng.random(dims, dtype=np.float64)
        if "lidar" in spec.name or "depth" in spec.name:
            value = value * 20.0 * (rng.random(dims) > 0.9)
        feeds[spec.name] = value.astype(spec.dtype)
    return feeds


def feeds_at(input_specs, shapes: Mapping[str, tuple[int, ...]], seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs at exactly ``shapes`` (values in [0, 1)), zoo extras at sane values."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for spec in input_specs:
        if spec.name in SPECIAL_INPUTS:
            feeds[spec.name] = SPECIAL_INPUTS[spec.name].astype(spec.dtype)
        else:
            feeds[spec.name] = rng.random(tuple(shapes[spec.name]), dtype=np.float64).astype(spec.dtype)
    return feeds


# ---------------------------------------------------------------------------- worker
def sequence_worker(config: dict) -> dict:
    """One engine, built with ``budget_mb`` at the first shapes of ``sequence`` (``over_budget``
    its policy), fed every shapes of the sequence in turn; per frame: peak RSS growth above the
    baseline taken before the engine was built, latency, the minimum at those shapes and the
    outcome ("within", "flagged" over the budget, "raised" BudgetExceeded)."""
    specs = input_specs(load_model(config["model"], check=False))
    sequence = [{name: tuple(shape) for name, shape in shapes.items()} for shapes in config["sequence"]]
    feeds = [feeds_at(specs, shapes, seed=k) for k, shapes in enumerate(sequence)]
    release_memory()
    reset_peak_rss()
    baseline = status_bytes("VmRSS")
    budget = config["budget_mb"]
    try:
        engine = Engine(config["model"], threads=config.get("threads"), memory_budget_mb=budget,
                        input_shapes=sequence[0], over_budget=config.get("over_budget", "run"))
    except ValueError as exc:
        return {"budget_mb": budget, "error": f"rejected: {exc}"}
    frames = []
    for shapes, feed in zip(sequence, feeds):
        gc.collect()
        reset_peak_rss()
        held = status_bytes("VmRSS") - baseline  # what the frame starts from: the previous frame's state
        start = time.perf_counter()
        try:
            outputs = engine.run(feed)
        except BudgetExceeded as exc:
            outcome, minimum = "raised", exc.minimum_mb
        else:
            del outputs  # a node drops a frame's outputs once it published them
            over = engine.engine_stats().over_budget
            outcome = "within" if over is None else "flagged"
            minimum = engine.min_budget_mb()
        ms = (time.perf_counter() - start) * 1e3
        frames.append({"shapes": {name: list(shape) for name, shape in shapes.items()}, "outcome": outcome,
                       "peak_mb": (status_bytes("VmHWM") - baseline) / MB, "held_before_mb": held / MB, "ms": ms,
                       "minimum_mb": minimum})
    engine.close()
    return {"budget_mb": budget, "over_budget": config.get("over_budget", "run"), "frames": frames}


def changes_worker(config: dict) -> dict:
    """One engine at ``shapes`` (``swappable`` or plain, ``budget_mb`` from the constructor),
    taken through the budgets ``changes`` (None: unlimited) between frames. Per state: the
    peak of the change itself (VmHWM − baseline from just before ``set_memory_budget`` to the end
    of the first frame after it) and the peak of ``iters`` frames after that."""
    specs = input_specs(load_model(config["model"], check=False))
    shapes = {name: tuple(shape) for name, shape in config["shapes"].items()}
    feeds = feeds_at(specs, shapes)
    release_memory()
    reset_peak_rss()
    baseline = status_bytes("VmRSS")
    engine = Engine(config["model"], threads=config.get("threads"), memory_budget_mb=config.get("budget_mb"),
                    swappable=config.get("swappable", False), input_shapes=shapes)

    def frames() -> float:
        for _ in range(config.get("iters", 3)):
            engine.run(feeds)
        return (status_bytes("VmHWM") - baseline) / MB

    engine.run(feeds)
    gc.collect()
    reset_peak_rss()
    states = [{"budget_mb": config.get("budget_mb"), "executor": engine.engine_stats().executor,
               "state_peak_mb": frames()}]
    for budget in config["changes"]:
        gc.collect()
        reset_peak_rss()
        engine.set_memory_budget(budget)
        engine.run(feeds)
        change = (status_bytes("VmHWM") - baseline) / MB
        reset_peak_rss()
        states.append({"budget_mb": budget, "executor": engine.engine_stats().executor, "change_peak_mb": change,
                       "state_peak_mb": frames(), "rss_mb": (status_bytes("VmRSS") - baseline) / MB})
    engine.close()
    return {"states": states}


def worker(config: dict) -> dict:
    """Run one configuration in this (fresh) process and return its measurements."""
    if config["mode"] == "sequence":
        return sequence_worker(config)
    if config["mode"] == "changes":
        return changes_worker(config)
    specs = input_specs(load_model(config["model"], check=False))
    height, width = config["size"]
    feeds = make_feeds(specs, height, width, seed=config.get("seed", 0))
    release_memory()  # the parsed model's freed heap goes back first: reused by the engine, it would hide its growth
    reset_peak_rss()
    baseline = status_bytes("VmRSS") // 1024
    cached0 = meminfo_kb("Cached")
    mode = config["mode"]
    budget = config.get("budget_mb")
    start = time.perf_counter()
    budgeted: Engine | None = None  # every mode but "ort": the Engine, with its budget controls
    try:
        if mode == "ab":
            return _ab_worker(config, feeds)
        if mode == "ort":  # the paper's DInf: the framework's own direct inference, default options
            engine: _Runner = _OrtDirect(config["model"], config.get("threads"))
        else:
            budgeted = _engine_for(config["model"], config.get("threads"), budget if mode != "inmemory" else None,
                                   feeds)
            engine = budgeted
    except ValueError as exc:  # a budget below the model's minimum is refused, with its reason
        return {"mode": mode, "budget_mb": budget, "error": f"rejected: {exc}"}
    if mode == "naive" and budgeted is not None and budgeted._swap.streamed is not None:
        budgeted._swap.streamed.window.naive = True
        budgeted._swap.streamed.set_budget(int(config["budget_mb"] * MB))
    load_s = time.perf_counter() - start
    first = engine.run(feeds)  # the first frame settles partitions for this input size
    if mode in ("swap", "naive") and budget is not None and budgeted is not None:
        budgeted.set_memory_budget(budget)
    del first
    peak_load = status_bytes("VmHWM") // 1024 - baseline
    gc.collect()
    reset_peak_rss()
    latencies = []
    outputs: dict[str, np.ndarray] | None = None
    for _ in range(config.get("warmup", 1)):
        engine.run(feeds)
    for _ in range(config["iters"]):
        t0 = time.perf_counter()
        outputs = engine.run(feeds)
        latencies.append((time.perf_counter() - t0) * 1e3)
    peak = status_bytes("VmHWM") // 1024 - baseline
    rss_end = status_bytes("VmRSS") // 1024 - baseline
    cached1 = meminfo_kb("Cached")
    stats = engine.stats()
    window = None if budgeted is None else budgeted.engine_stats().window
    result = {
        "mode": mode, "budget_mb": budget, "size": config["size"], "load_s": load_s,
        "peak_load_mb": peak_load / 1024, "peak_mb": peak / 1024, "rss_end_mb": rss_end / 1024,
        "latency_ms": latencies, "mean_ms": float(np.mean(latencies)), "p95_ms": float(np.percentile(latencies, 95)),
        "cached_delta_mb": (cached1 - cached0) / 1024, "executor": stats.get("executor"),
        "blocks": stats.get("blocks"), "swap": stats.get("swap"),
    }
    if window is not None:
        result["store_cached_mb"] = cached_bytes_of(Path(window.store) / "weights.bin") / MB
    if config.get("switch_test") and window is not None and budgeted is not None:
        table = [b for b, _ in budgeted.latency_table()]
        levels: list[float | None] = [b * 1.001 for b in table] or [budget]
        times = []
        for k in range(config.get("switches", 40)):
            level = levels[k % len(levels)] if k % 2 else budget
            t0 = time.perf_counter()
            budgeted.set_memory_budget(level)
            times.append((time.perf_counter() - t0) * 1e3)
            if k % 4 == 3:
                engine.run(feeds)  # the next frame after a switch runs with the new partition
        result["switch_ms"] = times
        result["switch_p95_ms"] = float(np.percentile(times, 95))
    if config.get("outputs"):
        if outputs is None:
            raise ValueError("saving outputs needs at least one measured frame (iters >= 1)")
        np.savez(config["outputs"], **outputs)  # type: ignore[arg-type]  # stub: a ** dict might hold allow_pickle
    engine.close()
    return result


def _engine_for(model: str, threads: int | None, budget: float | None, feeds: dict) -> Engine:
    """An Engine under ``budget`` at the bench's input size (budgets are judged at the input
    shapes the engine is told; a budget below the minimum there is refused with the reason)."""
    return Engine(model, threads=threads, memory_budget_mb=budget,
                  input_shapes={name: tuple(value.shape) for name, value in feeds.items()})


def _ab_worker(config: dict, feeds: dict) -> dict:
    """Latency only: direct onnxruntime, the in-memory Engine (no budget) and the swapped engine
    take turns frame by frame in one process (rotating the order), so all three see the same CPU
    contention (this machine is shared)."""
    direct = _OrtDirect(config["model"], config.get("threads"))
    inmemory = _engine_for(config["model"], config.get("threads"), None, feeds)
    direct.run(feeds)  # their first-frame allocations happen before the swapped engine's baseline
    inmemory.run(feeds)
    swapped = _engine_for(config["model"], config.get("threads"), config["budget_mb"], feeds)
    runners: list[tuple[str, _Runner]] = [("ort", direct), ("inmemory", inmemory), ("swap", swapped)]
    for _ in range(config.get("warmup", 1)):
        for _, runner in runners:
            runner.run(feeds)
    times: dict[str, list[float]] = {name: [] for name, _ in runners}
    cpu: dict[str, list[float]] = {name: [] for name, _ in runners}
    for k in range(config["iters"]):
        order = runners[k % 3:] + runners[:k % 3]
        if k % 2:
            order = order[::-1]
        for name, runner in order:
            c0, t0 = time.process_time(), time.perf_counter()
            runner.run(feeds)
            times[name].append((time.perf_counter() - t0) * 1e3)
            cpu[name].append((time.process_time() - c0) * 1e3)
    stats = swapped.stats()
    for _, runner in runners:
        runner.close()

    def ratio(a: str, b: str) -> dict:
        return {"mean": float(np.mean(times[a]) / np.mean(times[b])),
                "median": float(np.median(times[a]) / np.median(times[b])),
                # CPU seconds per frame (all threads): the work each side does, immune to
                # waiting for a core on a shared machine.
                "cpu": float(np.sum(cpu[a]) / max(np.sum(cpu[b]), 1e-9))}

    vs_ort, vs_inmemory = ratio("swap", "ort"), ratio("swap", "inmemory")
    return {"mode": "ab", "budget_mb": config["budget_mb"], "ort_ms": times["ort"], "swap_ms": times["swap"],
            "inmemory_ms": times["inmemory"],
            "ratio_mean": vs_ort["mean"], "ratio_median": vs_ort["median"], "cpu_ratio": vs_ort["cpu"],
            "inmemory_ratio_mean": vs_inmemory["mean"], "inmemory_ratio_median": vs_inmemory["median"],
            "inmemory_cpu_ratio": vs_inmemory["cpu"],
            "inmemory_vs_ort_mean": float(np.mean(times["inmemory"]) / np.mean(times["ort"])),
            "executor": stats.get("executor"), "swap": stats.get("swap")}


class _OrtDirect:
    """A plain onnxruntime session with the Engine's run/stats/close surface."""

    def __init__(self, model: str, threads: int | None) -> None:
        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
        options.log_severity_level = 3
        self._session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
        self._names = [o.name for o in self._session.get_outputs()]

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(self._names, self._session.run(self._names, feeds)))

    def stats(self) -> dict[str, Any]:
        return {"executor": "onnxruntime", "blocks": 1}

    def close(self) -> None:
        self._session = None


if __name__ == "__main__":  # worker entry: python -m dynnet_ros.commands.swap_bench_worker CONFIG RESULT
    config = json.loads(Path(sys.argv[1]).read_text())
    Path(sys.argv[2]).write_text(json.dumps(worker(config)))
