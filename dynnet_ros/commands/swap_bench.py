"""``dynnet swap bench``: streamed weights vs direct in-memory inference vs naive streaming.

Every configuration runs in a fresh process (commands/swap_bench_worker.py says what it
measures); this module plans the runs, starts the workers, and summarises their medians.

Budget specs: ``P%`` leaves room for P % of the weights next to the in-memory footprint,
i.e. budget = unlimited peak − (1 − P/100) × weight bytes (so ``25%`` leaves the window a
quarter of the weights); ``NMB`` is an absolute budget.

A size sweep (``run_sweep``, the default of ``dynnet swap bench``) measures, at every input size
a model node can feed (``SWEEP_CAMERAS`` letterboxed as the nodes do), the in-memory engine and
the streamed one at each budget, and flags every row whose peak exceeds ``OVER_LIMIT`` × budget.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from dynnet_ros.bytesize import MB
from dynnet_ros.engine.modelio.loader import load_skeleton
from dynnet_ros.engine.modelio.models import load_model, weight_bytes
from dynnet_ros.perception.letterbox import plan_letterbox
from dynnet_ros.swap.streamed import prepare_weight_file

#: camera resolutions (WxH) the sweep letterboxes, 320x240 … 1920x1080
SWEEP_CAMERAS = ((320, 240), (640, 480), (800, 600), (1024, 768), (1280, 720), (1280, 800), (1280, 960),
                 (1280, 1024), (1920, 1080))
#: the zoo models' input size (the nodes' default ``max_input_side`` -1 = the model's own) and multiple
SWEEP_MAX_SIDE = 640
SWEEP_MULTIPLE = 32
#: a row whose peak exceeds this × its budget is flagged
OVER_LIMIT = 1.05


def sweep_sizes(cameras=SWEEP_CAMERAS, max_side: int = SWEEP_MAX_SIDE,
                multiple: int = SWEEP_MULTIPLE) -> list[tuple[int, int]]:
    """Every padded input (H, W) the nodes feed for ``cameras``, in increasing area."""
    target = (max_side, max_side) if max_side else None  # the zoo formats' letterbox: shrink only
    sizes = {(box.pad_h, box.pad_w) for box in (plan_letterbox(h, w, target=target, multiple=multiple, scaleup=False)
                                                 for w, h in cameras)}
    return sorted(sizes, key=lambda hw: (hw[0] * hw[1], hw))


@dataclass
class BenchPlan:
    model: str
    budgets: list[str]
    size: tuple[int, int] = (480, 640)
    iters: int = 8
    warmup: int = 1
    threads: int | None = None
    repeats: int = 1
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
        command = [sys.executable, "-m", "dynnet_ros.commands.swap_bench_worker", str(cfg_path), str(out_path)]
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
        if proc.returncode != 0 or not out_path.exists():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:]
            raise RuntimeError(f"bench worker {config['mode']} failed: {' | '.join(tail)}")
        result = json.loads(out_path.read_text())
        if "error" in result:
            raise RuntimeError(result["error"])
        return result


def run_bench(plan: BenchPlan, progress=print) -> dict:
    """All configurations, round-robin over ``repeats`` rounds; medians reported."""
    # the weight file is built here: built inside a worker, its heap would count in that worker's peak
    weights, rebuilt = prepare_weight_file(load_skeleton(plan.model))
    weight_mb = weight_bytes(load_model(plan.model, check=False)) / MB
    with tempfile.TemporaryDirectory(prefix="dynnet-swapbench-out-") as outdir:
        base = {"model": plan.model, "size": list(plan.size), "iters": plan.iters, "warmup": plan.warmup,
                "threads": plan.threads}
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
            row.update(pinned_mb=swap["pinned_bytes"] / MB, allowance_mb=swap["allowance_bytes"] / MB,
                       predicted_peak_mb=swap["predicted_peak_bytes"] / MB, io_mode=swap["io_mode"],
                       layout=swap["layout"])
        if row["budget_mb"]:
            row["peak_over_budget"] = row["peak_mb"] / row["budget_mb"]
        summary.append(row)
    for row in summary:
        ab_runs = [r for r in runs.get(f"ab@{row['config'].partition('@')[2]}", []) if "error" not in r]
        if row.get("mode") == "swap" and ab_runs:
            row["ab_ratio_mean"] = float(np.median([r["ratio_mean"] for r in ab_runs]))
            row["ab_ratio_median"] = float(np.median([r["ratio_median"] for r in ab_runs]))
            row["ab_cpu_ratio"] = float(np.median([r["cpu_ratio"] for r in ab_runs]))
            for key in ("inmemory_ratio_mean", "inmemory_cpu_ratio", "inmemory_vs_ort_mean"):
                values = [r[key] for r in ab_runs if key in r]
                if values:
                    row[f"ab_{key}"] = float(np.median(values))
    inmem = next(r for r in summary if r["config"] == "inmemory")
    ort_row = next((r for r in summary if r["config"] == "ort" and "mean_ms" in r), inmem)
    # Latency targets are checked against the faster of the two in-memory references.
    reference_ms = min(inmem["mean_ms"], ort_row["mean_ms"])
    for row in summary:
        if "mean_ms" in row:
            row["latency_vs_inmemory"] = row["mean_ms"] / reference_ms
    return {"model": plan.model, "size": list(plan.size), "weight_mb": weight_mb, "store": str(weights.directory),
            "layout": weights.layout, "reference_ms": reference_ms, "store_rebuilt": rebuilt,
            "unlimited_peak_mb": inmem["peak_mb"], "budgets_mb": budgets,
            "summary": summary, "runs": runs, "threads": plan.threads, "repeats": plan.repeats}


def run_sweep(model: str, budgets: list[str], sizes: list[tuple[int, int]], *, iters: int = 4,
              threads: int | None = None, progress=print) -> dict:
    """Peak / budget of the streamed engine at every size (see the module docstring): per size,
    the in-memory engine's peak sets the P % budgets; a budget below the model's minimum at that
    size is a refusal row carrying the reason (with the minimum)."""
    weights, _ = prepare_weight_file(load_skeleton(model))  # built here, not inside a measured worker
    weight_mb = weight_bytes(load_model(model, check=False)) / MB
    rows: list[dict] = []
    for height, width in sizes:
        base = {"model": model, "size": [height, width], "iters": iters, "warmup": 1, "threads": threads}
        progress(f"{height}x{width}: in-memory")
        inmem = run_worker({**base, "mode": "inmemory"})
        rows.append({"size": [height, width], "config": "inmemory", "budget_mb": None, "peak_mb": inmem["peak_mb"],
                     "mean_ms": inmem["mean_ms"]})
        for spec in budgets:
            budget = parse_budget(spec, inmem["peak_mb"], weight_mb)
            progress(f"{height}x{width}: swap @ {spec} = {budget:.1f} MB")
            row: dict = {"size": [height, width], "config": f"swap@{spec}", "budget_mb": budget}
            try:
                result = run_worker({**base, "mode": "swap", "budget_mb": budget})
            except RuntimeError as exc:
                row["error"] = str(exc)
            else:
                row.update(peak_mb=result["peak_mb"], mean_ms=result["mean_ms"],
                           peak_over_budget=result["peak_mb"] / budget,
                           min_budget_mb=result["swap"]["min_budget_bytes"] / MB if result.get("swap") else None)
                row["over"] = row["peak_over_budget"] > OVER_LIMIT
            rows.append(row)
    over = [r for r in rows if r.get("over")]
    return {"model": model, "weight_mb": weight_mb, "store": str(weights.directory), "sizes": [list(s) for s in sizes],
            "budgets": budgets, "limit": OVER_LIMIT, "rows": rows, "over": len(over),
            "refused": sum(1 for r in rows if "error" in r),
            "worst": max((r["peak_over_budget"] for r in rows if "peak_over_budget" in r), default=None)}


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
    rows = [r for r in result["summary"] if "peak_mb" in r]
    labels = [r["config"] for r in rows]
    fig = Figure(figsize=(11, 4.2))
    ax1, ax2 = fig.subplots(1, 2)
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
                 "in-memory (gray), SwapNet (blue), naive streaming (orange)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
