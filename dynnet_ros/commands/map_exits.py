"""`dynnet map exits MODEL --frames BAG_OR_DIR --out EXITS.onnx`: learn early exits from the
user's own frames (self-distillation, no labels) and write the model with them."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from dynnet_ros.commands import CommandError, _map_arguments
from dynnet_ros.commands.exit_frames import exit_inputs, read_frames
from dynnet_ros.engine.modelio import onnx_proto
from dynnet_ros.engine.modelio.models import load_model
from dynnet_ros.engine.rdp import analyze
from dynnet_ros.mapper.exit_heads import learn_exits
from dynnet_ros.perception.model_info import model_info
from dynnet_ros.zoo import resolve_model_spec


def run(args: argparse.Namespace) -> int:
    _map_arguments.required(args.frames, "--frames", "BAG_OR_DIR", "give the frames to learn from")
    _map_arguments.required(args.out, "--out", "EXITS.onnx", "give the file to write the model with exits to")
    model_path = resolve_model_spec(args.model)
    console = Console()
    try:
        proto = load_model(model_path)
        inputs = exit_inputs(model_info(proto, str(model_path)), args.task, args.size, args.score_threshold)
        frames = read_frames(args.frames, args.topic, args.count)
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    console.print(f"{Path(model_path).name}: {inputs.task.kind} heads ({inputs.reason}); {len(frames)} frames "
                  f"from {args.frames}; {inputs.preprocess.describe()}")
    at = None if args.at == "auto" else [name.strip() for name in args.at.split(",") if name.strip()]
    with console.status("preparing …") as status:
        feeds = [inputs.feed(frame) for frame in frames]
        try:
            learned = learn_exits(proto, inputs.task, feeds, analyze(proto), at=at, count=args.exits,
                                  held_out=args.held_out, progress=lambda text: status.update(text + " …"))
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        onnx_proto.save(learned.model, str(args.out))
    table = Table(title=f"exits on {learned.held_out_frames} held-out frames ({learned.train_frames} fitted) "
                        f"-> {args.out}")
    for col in ("exit", "reads", "FLOPs before", "hands on MB", "agrees", "at ≥ 99 %", "at ≥ 95 %"):
        table.add_column(col, justify="left" if col == "reads" else "right")
    for k, report in enumerate(learned.reports):
        cells = []
        for key in ("99%", "95%"):
            threshold, rate, _ = report.thresholds[key]
            cells.append("never early" if rate == 0.0 else f"{threshold:.3f}: {rate:.0%} early")
        table.add_row(str(k), f"{report.point.tensor} {'x'.join(map(str, report.point.shape))}",
                      f"{report.point.cost_fraction:.0%}", f"{report.point.crossing_bytes / 2**20:.2f}",
                      f"{report.agreement:.0%}", *cells)
    console.print(table)
    if all(r.thresholds["99%"][1] == 0.0 for r in learned.reports):
        console.print("no exit answers early at ≥ 99 % agreement on these frames: stages with these exits will not "
                      "pay; run the model as one stage")
    console.print(f"wrote {args.out}: `dynnet map stages {args.out}` cuts it at its exits")
    if args.json:
        args.json.write_text(json.dumps(learned.to_json(), indent=1))
    return 0
