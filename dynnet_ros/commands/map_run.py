"""`dynnet map run MODEL --mapping FILE`: run the stages on their units, print exits and stage times."""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from dynnet_ros.commands import CommandError, _map_arguments
from dynnet_ros.commands.map_inputs import npz_feeds, scene_feeds
from dynnet_ros.engine.modelio.models import load_model
from dynnet_ros.mapper.advice import never_early
from dynnet_ros.mapper.build import build_stages
from dynnet_ros.mapper.mapping import check_stage_count, load_mapping
from dynnet_ros.mapper.runtime import StageExecutor
from dynnet_ros.zoo import resolve_model_spec


def confidence_text(confidence: float | None) -> str:
    """A confidence for a table: "no exit" where the exit has no criterion (it never answers early)."""
    return "no exit" if confidence is None or not math.isfinite(confidence) else f"{confidence:.3f}"


def run(args: argparse.Namespace) -> int:
    _map_arguments.required(args.mapping, "--mapping", "FILE", "give the mapping file to run")
    model_path = resolve_model_spec(args.model)
    mapping = load_mapping(args.mapping)
    console = Console()
    with console.status("building the stages …") as status:
        proto = load_model(model_path)
        height, width = args.size
        feeds = npz_feeds(list(args.inputs), proto) if args.inputs else list(scene_feeds(proto, args.frames,
                                                                                         height, width))
        calibration = list(scene_feeds(proto, 16, 96, 128)) if mapping.partition.width is not None else None
        stage_set = build_stages(proto, mapping.partition, calibration,
                                 progress=lambda text: status.update(text + " …"))
        try:
            check_stage_count(mapping, len(stage_set.stages))
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        status.update("opening a session per stage on its unit …")
        executor = StageExecutor(stage_set, mapping)
    if args.deadline_ms is not None:
        executor.set_deadline(args.deadline_ms)
    rows: list[dict[str, Any]] = []
    try:
        executor.run(feeds[0])   # warm-up: first runs allocate
        executor.reset_counters()
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task("frames", total=len(feeds))
            for index, feed in enumerate(feeds):
                executor.run(feed)
                result = executor.last_result
                assert result is not None
                rows.append({"frame": index, "exit": result.exit_index, "early": result.early,
                             "confidence": round(result.confidence, 4) if math.isfinite(result.confidence) else None,
                             "latency_ms": round(result.latency_ms, 3),
                             "deadline_hit": result.deadline_hit, "overlap": round(result.overlap, 3),
                             "stage_ms": {str(k): round(v, 3) for k, v in sorted(result.stage_ms.items())},
                             "skipped": list(result.skipped)})
                progress.advance(task)
        details = executor.details()
    finally:
        executor.close()
    table = Table(title=f"{Path(model_path).name}: {len(stage_set.stages)} stages on "
                        f"{', '.join(details['mapping'])} ({mapping.hardware.name})")
    for col in ("frame", "exit", "early", "confidence", "latency ms", "stage ms", "skipped"):
        table.add_column(col, justify="left" if col in ("stage ms", "skipped") else "right")
    for row in rows:
        table.add_row(str(row["frame"]), str(row["exit"]), "yes" if row["early"] else "no",
                      confidence_text(row["confidence"]),
                      f"{row['latency_ms']:.1f}", " ".join(f"{k}:{v:.1f}" for k, v in row["stage_ms"].items()),
                      ",".join(map(str, row["skipped"])) or "-")
    console.print(table)
    latencies = np.array([r["latency_ms"] for r in rows])
    summary = {"frames": len(rows), "mean_ms": round(float(latencies.mean()), 3),
               "p95_ms": round(float(np.percentile(latencies, 95)), 3), "exit_histogram": details["exit_histogram"],
               "busy_fraction": details["busy_fraction"], "units": details["units"]}
    console.print(f"mean {summary['mean_ms']:.1f} ms, p95 {summary['p95_ms']:.1f} ms; exits "
                  f"{summary['exit_histogram']}; busy {summary['busy_fraction']}")
    advice = never_early(stage_set, {int(k): v for k, v in details["exit_histogram"].items()},
                         list(details["thresholds"]))
    if advice:
        summary["advice"] = advice
        console.print(f"[yellow]{advice}[/yellow]")
    if args.json:
        args.json.write_text(json.dumps({"summary": summary, "frames": rows, "mapping": mapping.to_json()}, indent=1))
    return 0
