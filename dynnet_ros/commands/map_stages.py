"""`dynnet map stages MODEL --partition P.yaml --out DIR`: write the stage models and a summary."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from dynnet_ros.bytesize import MB
from dynnet_ros.commands import _map_arguments
from dynnet_ros.commands.map_inputs import scene_feeds
from dynnet_ros.engine.modelio.models import load_model
from dynnet_ros.mapper.advice import no_early_exit
from dynnet_ros.mapper.build import build_stages
from dynnet_ros.mapper.partition import Partition, load_partition
from dynnet_ros.zoo import resolve_model_spec


def run(args: argparse.Namespace) -> int:
    _map_arguments.required(args.out, "--out", "DIR", "give the directory to write the stages to")
    model_path = resolve_model_spec(args.model)
    partition = load_partition(args.partition) if args.partition else Partition()
    console = Console()
    with console.status("reading the model …") as status:
        proto = load_model(model_path)
        frames = None
        if partition.width is not None:
            height, width = args.size
            status.update(f"rendering {args.calibration} calibration scenes …")
            frames = list(scene_feeds(proto, args.calibration, height, width))
        stage_set = build_stages(proto, partition, frames, progress=lambda text: status.update(text + " …"))
        status.update(f"writing {len(stage_set.stages)} stage models …")
        stage_set.save(args.out)
    summary = stage_set.summary()
    table = Table(title=f"{Path(model_path).name}: {len(stage_set.stages)} {stage_set.kind}-wise stages -> {args.out}")
    for col in ("stage", "nodes", "weights MB", "reads", "exit", "criterion"):
        table.add_column(col, justify="right" if col in ("stage", "nodes", "weights MB") else "left")
    for stage in stage_set.stages:
        reads = ", ".join(f"{name}" + ("" if src < 0 else f" (stage {src})") for name, src in stage.sources.items())
        table.add_row(str(stage.index), str(len(stage.model.graph.node)), f"{stage.weight_bytes / MB:.2f}",
                      reads, ", ".join(stage.exit.outputs), stage.exit.criterion)
    console.print(table)
    agreement = summary.get("agreement")
    if agreement:
        console.print(f"argmax agreement with the full model over {agreement['frames']} scenes, per exit: "
                      + ", ".join(f"{v:.0%}" for v in agreement["argmax_agreement"]))
    advice = no_early_exit(stage_set)
    if advice:
        summary["advice"] = advice
        console.print(f"[yellow]{advice}[/yellow]")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1))
    onnx_files = sorted(Path(args.out).glob("stage_*.onnx"))
    console.print(f"wrote {len(onnx_files)} stage models and stages.json to {args.out}")
    return 0
