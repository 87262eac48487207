"""`dynnet zoo build|info`: build the demo models into the cache and report their size/compute."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console, JustifyMethod
from rich.table import Table

from dynnet_ros.commands import CommandError
from dynnet_ros.engine.modelio import onnx_proto
from dynnet_ros.engine.plan.layout import prepare as prepare_engine
from dynnet_ros.swap.streamed import prepare as prepare_streaming
from dynnet_ros.zoo import BUILDER_VERSION, MODEL_NAMES, build_model, ensure_model, zoo_dir
from dynnet_ros.zoo.samples import measure_latency
from dynnet_ros.zoo.stats import ModelStats, model_stats

_H, _W = 480, 640


def _row(name: str, stats: ModelStats, path: Path | None) -> dict:
    return {"model": name, "params": stats.params, "weight_mb": round(stats.weight_mb, 2),
            "gflops_640x480": round(stats.gflops, 3), "path": str(path) if path else None}


def _shown(path: str | None) -> str:
    return Path(path).name if path else "-"


def _print(rows: list[dict], title: str) -> None:
    table = Table(title=title)
    timed = any("latency_ms_median" in r for r in rows)
    cols: list[tuple[str, JustifyMethod]] = [("model", "left"), ("params", "right"), ("weight MB", "right"),
                                             ("GFLOPs @640x480", "right")]
    cols += [("ORT ms median / min", "right"), ("CPU ms/run", "right")] if timed else [("file", "left")]
    for col, justify in cols:
        table.add_column(col, justify=justify)
    for r in rows:
        last = ([f"{r['latency_ms_median']:.0f} / {r['latency_ms_min']:.0f}", f"{r['cpu_ms_per_run']:.0f}"]
                if timed else [_shown(r["path"])])
        table.add_row(r["model"], f"{r['params']:,}", f"{r['weight_mb']:.1f}", f"{r['gflops_640x480']:.2f}", *last)
    Console().print(table)


def run(args: argparse.Namespace) -> int:
    rows = []
    if args.zoo_command == "build":
        out = args.out if args.out is not None else zoo_dir()
        for name in MODEL_NAMES:
            try:
                path = ensure_model(name, out, force=args.force)
            except OSError as exc:
                raise CommandError(f"cannot write {name} model to {out}: {exc}") from exc
            rows.append(_row(name, model_stats(onnx_proto.load(path)), path))
            prepare_engine(path)  # checker verdict + NCHWc layout cached: a node's first start is quick
            prepare_streaming(path)  # the weight file a budget streams from
        title = f"dynnet zoo ({out}, builder {BUILDER_VERSION})"
    else:
        for name in MODEL_NAMES:
            model = build_model(name)
            row = _row(name, model_stats(model), None)
            if args.latency:
                lat = measure_latency(model, name, _H, _W, threads=args.threads, runs=args.runs)
                row.update(latency_ms_median=round(lat.median_ms, 1), latency_ms_min=round(lat.min_ms, 1),
                           cpu_ms_per_run=round(lat.cpu_ms, 1), threads=args.threads)
            rows.append(row)
        title = f"dynnet zoo (builder {BUILDER_VERSION})"
    _print(rows, title)
    if args.json is not None:
        args.json.write_text(json.dumps({"builder_version": BUILDER_VERSION, "input": [1, 3, _H, _W],
                                         "models": rows}, indent=2) + "\n")
    return 0
