"""`dynnet bench`: the planned engine vs a plain onnxruntime session, each in a fresh process.

Why fresh processes: peak memory (VmHWM) is a per-process high-water mark, and allocator state
(onnxruntime's arena, glibc's heap) carries over between sessions in one process. Each worker
resets the mark after its imports (``/proc/self/clear_refs`` = 5), takes its baseline, loads
the model, runs the same seeded shape sequence and reports latency and peak above baseline.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from matplotlib.figure import Figure

from dynnet_ros.bytesize import MB
from dynnet_ros.commands import CommandError
from dynnet_ros.engine.backends.cpu_planned import create_planned_executor
from dynnet_ros.engine.backends.registry import available_backends, load_for_backend
from dynnet_ros.engine.engine import Engine
from dynnet_ros.engine.modelio import onnx_proto
from dynnet_ros.engine.modelio.models import input_specs, load_model
from dynnet_ros.engine.runtime.ort_executor import default_threads, session_options
from dynnet_ros.procmem import reset_peak_rss, status_bytes
from dynnet_ros.zoo import resolve_model_spec

# Sensible values for inputs the zoo models take besides images (everything else: random).
_SPECIAL_INPUTS = {"score_threshold": 0.3, "iou_threshold": 0.5, "max_detections": 50}


def make_feeds(specs, height: int, width: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Random feeds for ``specs`` (InputSpec list) with image-like dims bound to height/width."""
    feeds = {}
    for spec in specs:
        dims = []
        spatial = [i for i, d in enumerate(spec.dims) if not isinstance(d, int)]
        for axis, d in enumerate(spec.dims):
            if isinstance(d, int):
                dims.append(d)
            elif str(d).upper() in ("H", "HEIGHT") or (len(spatial) >= 2 and axis == spatial[-2]):
                dims.append(height)
            elif str(d).upper() in ("W", "WIDTH") or (len(spatial) >= 1 and axis == spatial[-1]):
                dims.append(width)
            else:
                dims.append(1)
        if spec.name in _SPECIAL_INPUTS:
            feeds[spec.name] = np.full(dims, _SPECIAL_INPUTS[spec.name], dtype=spec.dtype)
        elif spec.dtype.kind == "f":
            value = rng.random(dims, dtype=np.float32).astype(spec.dtype)
            if "depth" in spec.name:  # sparse metric depth, like a projected LiDAR scan
                value = np.where(value > 0.9, value * 50.0, 0.0).astype(spec.dtype)
            feeds[spec.name] = value
        elif spec.dtype == np.bool_:
            feeds[spec.name] = np.ones(dims, dtype=np.bool_)
        else:
            feeds[spec.name] = np.ones(dims, dtype=spec.dtype)
    return feeds


# ---------------------------------------------------------------------------------- worker
def _worker(config: dict) -> dict:
    """Runs in a fresh interpreter: load one side, run the sequence, report."""
    specs = input_specs(load_model(config["model"], check=False))
    shapes = [tuple(s) for s in config["shapes"]]
    rng = np.random.default_rng(config["seed"])
    feeds_by_shape = {s: make_feeds(specs, s[0], s[1], rng) for s in dict.fromkeys(shapes)}
    reset_peak_rss()  # imports and feed generation do not count
    baseline = status_bytes("VmRSS")
    start = time.perf_counter()
    if config["side"] == "engine":
        engine = Engine(config["model"], backend=config["backend"], threads=config["threads"])
        run = engine.run
    else:
        engine = None
        session = ort.InferenceSession(config["model"], sess_options=session_options(config["threads"]),
                                       providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]

        def run(feeds):
            return dict(zip(names, session.run(names, feeds)))
    load_s = time.perf_counter() - start
    load_peak = status_bytes("VmHWM") - baseline
    latencies: list[float] = []
    cpu_ms: list[float] = []
    first_at: dict[tuple[int, ...], float] = {}
    first_cpu: dict[tuple[int, ...], float] = {}
    for shape in shapes:
        c0, t0 = time.process_time(), time.perf_counter()
        run(feeds_by_shape[shape])
        latency = (time.perf_counter() - t0) * 1e3
        cpu_ms.append((time.process_time() - c0) * 1e3)
        latencies.append(latency)
        first_at.setdefault(shape, latency)
        first_cpu.setdefault(shape, cpu_ms[-1])
    peak = status_bytes("VmHWM") - baseline
    steady, steady_cpu = {}, {}
    for shape in first_at:
        runs, cpu_runs = [], []
        for _ in range(config["steady_runs"]):
            c0, t0 = time.process_time(), time.perf_counter()
            run(feeds_by_shape[shape])
            runs.append((time.perf_counter() - t0) * 1e3)
            cpu_runs.append((time.process_time() - c0) * 1e3)
        if runs:
            steady[shape] = float(np.median(runs))
            steady_cpu[shape] = float(np.median(cpu_runs))
    ratios = [first_at[s] / steady[s] for s in steady if steady[s] > 0]
    cpu_ratios = [first_cpu[s] / steady_cpu[s] for s in steady_cpu if steady_cpu[s] > 0]
    result = {
        "side": config["side"], "load_s": load_s, "load_peak_mb": load_peak / MB,
        "peak_mb": peak / MB, "rss_end_mb": (status_bytes("VmRSS") - baseline) / MB,
        "mean_ms": float(np.mean(latencies)), "p95_ms": float(np.percentile(latencies, 95)),
        "latencies_ms": latencies,
        # CPU time of the process per run: steadier than wall time on a shared machine
        "mean_cpu_ms": float(np.mean(cpu_ms)),
        "first_run_ratio_mean": float(np.mean(ratios)) if ratios else None,
        "first_run_ratio_max": float(np.max(ratios)) if ratios else None,
        "first_run_cpu_ratio_mean": float(np.mean(cpu_ratios)) if cpu_ratios else None,
        "steady_mean_ms": float(np.mean(list(steady.values()))) if steady else None,
    }
    if engine is not None:
        result["engine_stats"] = {k: v for k, v in engine.stats().items() if _jsonable(v)}
    return result


def _jsonable(value) -> bool:
    try:
        json.dumps(value)
        return True
    except TypeError:
        return False


def run_worker(config: dict, timeout_s: float = 1800) -> dict:
    """Start a fresh interpreter for one side and return its JSON report."""
    with tempfile.TemporaryDirectory() as tmp:
        cfg_path, out_path = Path(tmp, "config.json"), Path(tmp, "result.json")
        cfg_path.write_text(json.dumps(config))
        proc = subprocess.run([sys.executable, "-m", "dynnet_ros.commands.bench", "--worker", str(cfg_path),
                               str(out_path)], capture_output=True, text=True, timeout=timeout_s)
        if proc.returncode != 0 or not out_path.exists():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            raise ValueError(f"{config['side']} worker failed: {tail[0]}")
        return json.loads(out_path.read_text())


# ---------------------------------------------------------------------------------- reports
def node_counts(model_path: str, threads: int | None) -> dict:
    """Nodes in the model, in the graph the engine executes (after onnxruntime's layout rewrite
    where used, and our simplification), and in onnxruntime's own EXTENDED-optimised graph."""
    skeleton = load_for_backend("cpu", model_path)
    executor = create_planned_executor(skeleton, threads=1, versions=False)
    try:
        graph = getattr(executor, "graph", None)
        report = getattr(executor, "simplify_report", None)
        executed = len(graph.nodes) if graph is not None else None
        layout = executor.options.layout if hasattr(executor, "options") else "plain onnxruntime"
    finally:
        executor.close()
    with tempfile.TemporaryDirectory() as tmp:
        options = session_options(threads)
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        options.optimized_model_filepath = str(Path(tmp, "opt.onnx"))
        ort.InferenceSession(model_path, sess_options=options, providers=["CPUExecutionProvider"])
        ort_nodes = len(onnx_proto.load(options.optimized_model_filepath, load_external_data=False).graph.node)
    return {"original": len(skeleton.graph.node), "ours_executed": executed, "layout": layout,
            "ort_extended": ort_nodes, "simplify": report.to_json() if report is not None else None}


def _median_side(runs: list[dict]) -> dict:
    out = dict(runs[-1])
    for key in ("load_s", "load_peak_mb", "peak_mb", "rss_end_mb", "mean_ms", "p95_ms", "mean_cpu_ms",
                "first_run_ratio_mean",
                "first_run_ratio_max", "first_run_cpu_ratio_mean", "steady_mean_ms"):
        values = [r[key] for r in runs if r.get(key) is not None]
        out[key] = float(np.median(values)) if values else None
    out["runs"] = len(runs)
    return out


def compare(model_path: str, shapes: list[tuple[int, int]], *, threads: int | None, seed: int = 0,
            steady_runs: int = 2, repeats: int = 1, backend: str = "cpu") -> dict:
    threads = threads or default_threads()
    base = {"model": model_path, "shapes": shapes, "seed": seed, "threads": threads,
            "steady_runs": steady_runs, "backend": backend}
    runs: dict[str, list[dict]] = {"engine": [], "onnxruntime": []}
    for _ in range(max(1, repeats)):
        runs["engine"].append(run_worker({**base, "side": "engine"}))
        runs["onnxruntime"].append(run_worker({**base, "side": "onnxruntime"}))
    ours, ort_side = _median_side(runs["engine"]), _median_side(runs["onnxruntime"])
    return {"model": model_path, "threads": threads, "samples": len(shapes), "shapes": shapes,
            "engine": ours, "onnxruntime": ort_side,
            "ratios": {"peak": ours["peak_mb"] / ort_side["peak_mb"] if ort_side["peak_mb"] > 0 else None,
                       "mean_latency": ours["mean_ms"] / ort_side["mean_ms"],
                       "p95_latency": ours["p95_ms"] / ort_side["p95_ms"],
                       "mean_cpu": ours["mean_cpu_ms"] / ort_side["mean_cpu_ms"]}}


def _table(result: dict) -> str:
    e, o = result["engine"], result["onnxruntime"]
    rows = [("peak MB above baseline", e["peak_mb"], o["peak_mb"]),
            ("  of which at load", e["load_peak_mb"], o["load_peak_mb"]),
            ("mean latency ms", e["mean_ms"], o["mean_ms"]),
            ("p95 latency ms", e["p95_ms"], o["p95_ms"]),
            ("mean CPU time ms", e.get("mean_cpu_ms"), o.get("mean_cpu_ms")),
            ("first run / steady (mean)", e["first_run_ratio_mean"], o["first_run_ratio_mean"]),
            ("first run / steady (max)", e["first_run_ratio_max"], o["first_run_ratio_max"]),
            ("first run / steady, CPU (mean)", e.get("first_run_cpu_ratio_mean"), o.get("first_run_cpu_ratio_mean")),
            ("load s", e["load_s"], o["load_s"])]
    nodes = result.get("nodes")
    lines = [f"{'':30s} {'engine':>12s} {'onnxruntime':>12s}"]
    for label, a, b in rows:
        fa = "-" if a is None else f"{a:12.2f}"
        fb = "-" if b is None else f"{b:12.2f}"
        lines.append(f"{label:30s} {fa:>12s} {fb:>12s}")
    if nodes:
        lines.append(f"{'nodes (model ' + str(nodes['original']) + ')':30s} {nodes['ours_executed'] or 0:12d} "
                     f"{nodes['ort_extended']:12d}")
    r = result["ratios"]
    lines.append(f"ratios engine/ort: peak {r['peak']:.2f}, mean {r['mean_latency']:.2f}, p95 {r['p95_latency']:.2f}, "
                 f"cpu {r['mean_cpu']:.2f}")
    return "\n".join(lines)


def plot(result: dict, path: str) -> None:
    e, o = result["engine"], result["onnxruntime"]
    fig = Figure(figsize=(14, 4))
    axes = fig.subplots(1, 3)
    names = ["engine", "onnxruntime"]
    axes[0].bar(names, [e["peak_mb"], o["peak_mb"]], color=["tab:blue", "tab:orange"])
    axes[0].set_title("peak memory above baseline (MB)")
    x = np.arange(2)
    axes[1].bar(x - 0.2, [e["mean_ms"], e["p95_ms"]], 0.4, label="engine", color="tab:blue")
    axes[1].bar(x + 0.2, [o["mean_ms"], o["p95_ms"]], 0.4, label="onnxruntime", color="tab:orange")
    axes[1].set_xticks(x, ["mean", "p95"])
    axes[1].set_title("latency (ms)")
    axes[1].legend()
    axes[2].plot(e["latencies_ms"], label="engine", color="tab:blue")
    axes[2].plot(o["latencies_ms"], label="onnxruntime", color="tab:orange")
    axes[2].set_xlabel("sample")
    axes[2].set_ylabel("ms")
    axes[2].set_title("latency per sample")
    axes[2].legend()
    fig.suptitle(f"{Path(result['model']).name}: {result['samples']} shapes, {result['threads']} threads")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def run(args: argparse.Namespace) -> int:
    reason = available_backends()[args.engine_backend]
    if reason is not None:
        raise CommandError(f"argument --engine-backend: {args.engine_backend} is unavailable: {reason}")
    shapes = args.shapes.sequence(args.samples, args.seed)
    model_path = resolve_model_spec(args.model)
    result = compare(model_path, shapes, threads=args.threads, seed=args.seed, steady_runs=args.steady_runs,
                     repeats=args.repeats, backend=args.engine_backend)
    result["nodes"] = node_counts(model_path, args.threads)
    print(_table(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    if args.plot:
        plot(result, args.plot)
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        report = _worker(json.loads(Path(sys.argv[2]).read_text()))
        Path(sys.argv[3]).write_text(json.dumps(report))
        sys.exit(0)
    sys.exit("usage: python -m dynnet_ros.commands.bench --worker CONFIG OUT (use `dynnet bench`)")
