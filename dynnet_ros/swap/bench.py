"""``dynnet swap bench``: SwapNet vs direct in-memory inference vs naive equal partitions.

Every configuration runs in a fresh process (peak RSS is a per-process high-water mark and
allocator state carries over).  A worker takes its baseline RSS after imports and input
creation, *before the model is loaded*, then reports:

* ``peak_load_mb``   VmHWM − baseline including model loading (ONNX parse, store verify),
* ``peak_mb``        VmHWM − baseline while serving frames (the mark is reset after loading
                     with ``/proc/self/clear_refs``; memory still held from loading counts),
* latency mean/p95, ``Cached`` growth in /proc/meminfo, and how much of the store's weight
  file sits in the page cache afterwards (mincore — immune to other processes' I/O).

Budget specs: ``P%`` leaves room for P % of the weights next to the in-memory footprint,
i.e. budget = unlimited peak − (1 − P/100) × weight bytes (so ``25%`` is the issue's target
case); ``NMB`` is an absolute budget.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import json
import mmap
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dynnet_ros.engine.procmem import status_bytes

MB = 1 << 20
SPECIAL_INPUTS = {"score_threshold": np.array([0.3], np.float32), "iou_threshold": np.array([0.5], np.float32),
                  "max_detections": np.array([50], np.int64)}


# ---------------------------------------------------------------------------- measurements
def meminfo_kb(key: str) -> int:
    with open("/proc/meminfo") as handle:
        for line in handle:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


def reset_peak() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0); False where not permitted."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


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


# ---------------------------------------------------------------------------- worker
def worker(config: dict) -> dict:
    """Run one configuration in this (fresh) process and return its measurements."""
    import onnx  # noqa: F401  (imports are part of the baseline, not of the model)
    import onnxruntime  # noqa: F401

    from dynnet_ros.engine.model_io import input_specs, load_model

    specs = input_specs(load_model(config["model"], check=False))
    feeds = make_feeds(specs, *config["size"], seed=config.get("seed", 0))
    os.environ["DYNNET_SWAP_STORE"] = config["store"]
    import gc

    gc.collect()
    reset_peak()
    baseline = status_bytes("VmRSS") // 1024
    cached0 = meminfo_kb("Cached")
    mode = config["mode"]
    budget = config.get("budget_mb")
    start = time.perf_counter()
    try:
        if mode == "ab":
            return _ab_worker(config, feeds)
        if mode == "ort":  # the paper's DInf: the framework's own direct inference, default options
            engine = _OrtDirect(config["model"], config.get("threads"))
        else:
            engine = _engine_for(config["model"], config.get("threads"), budget if mode != "inmemory" else None,
                                 feeds)
    except ValueError as exc:  # a budget below the model's minimum is refused, with its reason
        return {"mode": mode, "budget_mb": budget, "error": f"rejected: {exc}"}
    if mode == "naive" and engine._swap.swapped is not None:
        engine._swap.swapped.naive = True
        engine._swap.swapped.set_budget(budget)
    if mode == "naive" and engine._swap.streamed is not None:
        engine._swap.streamed.window.naive = True
        engine._swap.streamed.set_budget(int(budget * MB))
    load_s = time.perf_counter() - start
    first = engine.run(feeds)  # the first frame settles partitions for this input size
    if mode in ("swap", "naive") and budget is not None:
        engine.set_memory_budget(budget)
    del first
    peak_load = status_bytes("VmHWM") // 1024 - baseline
    gc.collect()
    reset_peak()
    latencies = []
    outputs = None
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
    result = {
        "mode": mode, "budget_mb": budget, "size": config["size"], "load_s": load_s,
        "peak_load_mb": peak_load / 1024, "peak_mb": peak / 1024, "rss_end_mb": rss_end / 1024,
        "latency_ms": latencies, "mean_ms": float(np.mean(latencies)), "p95_ms": float(np.percentile(latencies, 95)),
        "cached_delta_mb": (cached1 - cached0) / 1024, "executor": stats.get("executor"),
        "blocks": stats.get("blocks"), "swap": stats.get("swap"),
    }
    swap = stats.get("swap")
    if swap:
        result["store_cached_mb"] = cached_bytes_of(Path(swap["store"]) / "weights.bin") / MB
    if config.get("switch_test") and getattr(engine, "_swap", None) is not None and (
            engine._swap.swapped is not None or engine._swap.streamed is not None):
        table = [b for b, _ in engine.latency_table()]
        levels = [b * 1.001 for b in table] or [budget]
        times = []
        for k in range(config.get("switches", 40)):
            level = levels[k % len(levels)] if k % 2 else budget
            t0 = time.perf_counter()
            engine.set_memory_budget(level)
            times.append((time.perf_counter() - t0) * 1e3)
            if k % 4 == 3:
                engine.run(feeds)  # the next frame after a switch runs with the new partition
        result["switch_ms"] = times
        result["switch_p95_ms"] = float(np.percentile(times, 95))
    if config.get("outputs"):
        np.savez(config["outputs"], **outputs)
    engine.close()
    return result


def _engine_for(model: str, threads: int | None, budget: float | None, feeds: dict):
    """An Engine under ``budget``.  Budgets are checked against the input size the engine has
    seen; before its first frame that is the reference size (480x640).  When the bench input is
    smaller and the budget only fits it, start in memory, run one frame, then apply the budget
    (what a node does when the budget manager lowers its budget)."""
    from dynnet_ros.engine import Engine

    try:
        return Engine(model, threads=threads, memory_budget_mb=budget)
    except ValueError:
        engine = Engine(model, threads=threads)
        engine.run(feeds)
        engine.set_memory_budget(budget)
        return engine


def _ab_worker(config: dict, feeds: dict) -> dict:
    """Latency only: direct onnxruntime, the in-memory Engine (no budget) and the swapped engine
    take turns frame by frame in one process (rotating the order), so all three see the same CPU
    contention (this machine is shared)."""
    direct = _OrtDirect(config["model"], config.get("threads"))
    inmemory = _engine_for(config["model"], config.get("threads"), None, feeds)
    direct.run(feeds)  # their first-frame allocations happen before the swapped engine's baseline
    inmemory.run(feeds)
    swapped = _engine_for(config["model"], config.get("threads"), config["budget_mb"], feeds)
    runners = [("ort", direct), ("inmemory", inmemory), ("swap", swapped)]
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
        import onnxruntime as ort

        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
        options.log_severity_level = 3
        self._session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
        self._names = [o.name for o in self._session.get_outputs()]

    def run(self, feeds):
        return dict(zip(self._names, self._session.run(self._names, feeds)))

    def stats(self) -> dict:
        return {"executor": "onnxruntime", "blocks": 1}

    def close(self) -> None:
        self._session = None


# ---------------------------------------------------------------------------- orchestration
@dataclass
class BenchPlan:
    model: str
    budgets: list[str]
    size: tuple[int, int] = (480, 640)
    iters: int = 8
    warmup: int = 1
    threads: int | None = None
    repeats: int = 1
    store: str | None = None
    ab: bool = True


def parse_budget(spec: str, unlimited_mb: float, weight_mb: float) -> float:
    spec = spec.strip()
    try:
        if spec.endswith("%"):
            share = float(spec[:-1]) / 100.0
            if not 0 <= share <= 1:
                raise ValueError
            return unlimited_mb - (1.0 - share) * weight_mb
        if spec.lower().endswith("mb"):
            return float(spec[:-2])
        return float(spec)
    except ValueError:
        raise ValueError(f"bad budget {spec!r}: use P% (0..100) or N / NMB") from None


def run_worker(config: dict, timeout: float = 900) -> dict:
    with tempfile.TemporaryDirectory(prefix="dynnet-swapbench-") as tmp:
        cfg_path, out_path = Path(tmp) / "config.json", Path(tmp) / "result.json"
        cfg_path.write_text(json.dumps(config))
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        proc = subprocess.run([sys.executable, "-m", "dynnet_ros.swap.bench", str(cfg_path), str(out_path)],
                              capture_output=True, text=True, timeout=timeout, env=env)
        if proc.returncode != 0 or not out_path.exists():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:]
            raise RuntimeError(f"bench worker {config['mode']} failed: {' | '.join(tail)}")
        result = json.loads(out_path.read_text())
        if "error" in result:
            raise RuntimeError(result["error"])
        return result


def run_bench(plan: BenchPlan, progress=print) -> dict:
    """All configurations, round-robin over ``repeats`` rounds; medians reported."""
    from dynnet_ros.engine.model_io import load_model, weight_bytes
    from dynnet_ros.swap.store import ensure_store

    if plan.store is None:  # a private store, removed afterwards
        with tempfile.TemporaryDirectory(prefix="dynnet-swapstore-") as tmp:
            return run_bench(dataclasses.replace(plan, store=str(Path(tmp) / "store")), progress)
    optimize = os.environ.get("DYNNET_SWAP_OPTIMIZE", "all")  # the workers' Engines read the same variable
    store, rebuilt = ensure_store(plan.model, plan.store, optimize=optimize)
    if "DYNNET_SWAP_OPTIMIZE" not in os.environ:
        # The Engine also opens the leaner variant (next to the store, "-basic"); building it
        # inside a worker would charge the store build's heap to that worker's serving peak.
        ensure_store(plan.model, f"{store.path}-basic", optimize="basic")
    from dynnet_ros.swap.control import stream_mode

    if stream_mode():  # the streamed engine's weight file, built here rather than inside a worker
        from dynnet_ros.engine.plan.loader import load_skeleton
        from dynnet_ros.swap.streamed import prepare_weight_file

        try:
            prepare_weight_file(load_skeleton(plan.model))
        except ValueError as exc:
            progress(f"no streamed weight file ({exc}); the workers swap per-block sessions")
    weight_mb = weight_bytes(load_model(plan.model, check=False)) / MB
    with tempfile.TemporaryDirectory(prefix="dynnet-swapbench-out-") as outdir:
        base = {"model": plan.model, "size": list(plan.size), "iters": plan.iters, "warmup": plan.warmup,
                "threads": plan.threads, "store": str(store.path)}
        runs: dict[str, list[dict]] = {}
        ref_npz = str(Path(outdir) / "inmemory.npz")
        budgets: dict[str, float] = {}
        for round_ in range(plan.repeats):
            progress(f"round {round_ + 1}/{plan.repeats}: onnxruntime direct")
            runs.setdefault("ort", []).append(run_worker({**base, "mode": "ort"}))
            progress(f"round {round_ + 1}/{plan.repeats}: in-memory")
            runs.setdefault("inmemory", []).append(run_worker({**base, "mode": "inmemory", "outputs": ref_npz}))
            unlimited = float(np.median([r["peak_mb"] for r in runs["inmemory"]]))
            for spec in plan.budgets:
                budgets.setdefault(spec, parse_budget(spec, unlimited, weight_mb))
                for mode in ("swap", "naive"):
                    progress(f"round {round_ + 1}/{plan.repeats}: {mode} @ {spec} = {budgets[spec]:.1f} MB")
                    npz = str(Path(outdir) / f"{mode}_{spec.strip('%')}.npz")
                    key = f"{mode}@{spec}"
                    try:
                        result = run_worker({**base, "mode": mode, "budget_mb": budgets[spec], "outputs": npz,
                                             "switch_test": mode == "swap" and round_ == 0})
                        result["max_abs_diff"] = _max_diff(ref_npz, npz)
                    except RuntimeError as exc:
                        result = {"mode": mode, "budget_mb": budgets[spec], "error": str(exc)}
                    runs.setdefault(key, []).append(result)
                if plan.ab:
                    progress(f"round {round_ + 1}/{plan.repeats}: A/B latency @ {spec}")
                    try:
                        ab = run_worker({**base, "mode": "ab", "budget_mb": budgets[spec],
                                         "iters": max(plan.iters, 12)})
                    except RuntimeError as exc:
                        ab = {"mode": "ab", "budget_mb": budgets[spec], "error": str(exc)}
                    runs.setdefault(f"ab@{spec}", []).append(ab)
    summary = []
    for key, results in runs.items():
        if key.startswith("ab@"):
            continue
        ok = [r for r in results if "error" not in r]
        if not ok:
            summary.append({"config": key, "error": results[-1]["error"], "budget_mb": results[-1]["budget_mb"]})
            continue
        row = {"config": key, "mode": ok[0]["mode"], "budget_mb": ok[0].get("budget_mb"),
               "peak_mb": float(np.median([r["peak_mb"] for r in ok])),
               "peak_load_mb": float(np.median([r["peak_load_mb"] for r in ok])),
               "mean_ms": float(np.median([r["mean_ms"] for r in ok])),
               "p95_ms": float(np.median([r["p95_ms"] for r in ok])),
               "cached_delta_mb": float(np.median([r["cached_delta_mb"] for r in ok])),
               "blocks": ok[-1].get("blocks"), "executor": ok[-1].get("executor")}
        for extra in ("store_cached_mb", "max_abs_diff", "switch_p95_ms"):
            values = [r[extra] for r in ok if r.get(extra) is not None]
            if values:
                row[extra] = float(max(values))
        swap = ok[-1].get("swap")
        if swap:
            row.update(partition=swap.get("partition"), pinned_blocks=swap.get("pinned_blocks"),
                       predicted_ms=swap.get("predicted_ms"),
                       predicted_peak_mb=(swap.get("predicted_peak_bytes") or 0) / MB,
                       io_mode=swap.get("io_mode"), optimized=swap.get("optimized"),
                       streamed=swap.get("streamed"), wrap=swap.get("wrap_prefetch"))
        if row["budget_mb"]:
            row["peak_over_budget"] = row["peak_mb"] / row["budget_mb"]
        summary.append(row)
    for row in summary:
        ab = [r for r in runs.get(f"ab@{row['config'].partition('@')[2]}", []) if "error" not in r]
        if row.get("mode") == "swap" and ab:
            row["ab_ratio_mean"] = float(np.median([r["ratio_mean"] for r in ab]))
            row["ab_ratio_median"] = float(np.median([r["ratio_median"] for r in ab]))
            row["ab_cpu_ratio"] = float(np.median([r["cpu_ratio"] for r in ab]))
            for key in ("inmemory_ratio_mean", "inmemory_cpu_ratio", "inmemory_vs_ort_mean"):
                values = [r[key] for r in ab if key in r]
                if values:
                    row[f"ab_{key}"] = float(np.median(values))
    inmem = next(r for r in summary if r["config"] == "inmemory")
    ort_row = next((r for r in summary if r["config"] == "ort" and "mean_ms" in r), inmem)
    # Latency targets are checked against the faster of the two in-memory references.
    reference_ms = min(inmem["mean_ms"], ort_row["mean_ms"])
    for row in summary:
        if "mean_ms" in row:
            row["latency_vs_inmemory"] = row["mean_ms"] / reference_ms
    return {"model": plan.model, "size": list(plan.size), "weight_mb": weight_mb, "store": str(store.path),
            "reference_ms": reference_ms,
            "store_rebuilt": rebuilt, "optimized": store.index["optimized"], "unlimited_peak_mb": inmem["peak_mb"], "budgets_mb": budgets,
            "summary": summary, "runs": runs, "threads": plan.threads, "repeats": plan.repeats}


def _max_diff(ref: str, other: str) -> float | None:
    if not (os.path.exists(ref) and os.path.exists(other)):
        return None
    a, b = np.load(ref), np.load(other)
    worst = 0.0
    for name in a.files:
        if a[name].shape != b[name].shape:
            return float("inf")
        if a[name].size:
            worst = max(worst, float(np.max(np.abs(a[name].astype(np.float64) - b[name].astype(np.float64)))))
    return worst


def plot(result: dict, path: str | os.PathLike) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in result["summary"] if "peak_mb" in r]
    labels = [r["config"] for r in rows]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    x = np.arange(len(rows))
    colors = ["tab:gray" if r["mode"] in ("inmemory", "ort") else "tab:blue" if r["mode"] == "swap" else "tab:orange"
              for r in rows]
    ax1.bar(x, [r["peak_mb"] for r in rows], color=colors)
    for i, r in enumerate(rows):
        if r.get("budget_mb"):
            ax1.hlines(r["budget_mb"], i - 0.4, i + 0.4, colors="red")
    ax1.set_xticks(x, labels, rotation=30, ha="right")
    ax1.set_ylabel("peak RSS above baseline (MB); red = budget")
    ax2.bar(x, [r["mean_ms"] for r in rows], color=colors,
            yerr=[[0] * len(rows), [max(0.0, r["p95_ms"] - r["mean_ms"]) for r in rows]])
    ax2.set_xticks(x, labels, rotation=30, ha="right")
    ax2.set_ylabel("latency ms (mean, bar to p95)")
    fig.suptitle(f"{Path(result['model']).name} @ {result['size'][0]}x{result['size'][1]}: "
                 "in-memory (gray), SwapNet (blue), naive equal blocks (orange)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":  # worker entry: python -m dynnet_ros.swap.bench CONFIG RESULT
    config = json.loads(Path(sys.argv[1]).read_text())
    Path(sys.argv[2]).write_text(json.dumps(worker(config)))
