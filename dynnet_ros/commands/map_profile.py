"""`dynnet map profile`: measure a model's stages and layers per unit, or import measurements."""
from __future__ import annotations

import argparse
import json

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from dynnet_ros.commands import CommandError
from dynnet_ros.commands._search_inputs import cached_profile, frames, model_stages
from dynnet_ros.mapper.hardware import load_hardware
from dynnet_ros.mapper.model_search import fit_surrogate
from dynnet_ros.mapper.profile_io import combine, read_profile, to_csv


def run(args: argparse.Namespace) -> int:
    console = Console()
    hardware = load_hardware(args.hw)
    summary: dict = {"hardware": hardware.name}
    if args.imports:
        if args.model is not None:
            raise CommandError("give a MODEL to measure or --import files, not both")
        profile = combine([read_profile(spec, hardware) for spec in args.imports], hardware)
        summary["source"] = "imported"
    else:
        if args.model is None:
            raise CommandError("give a MODEL to measure, or --import FILE")
        path, model, stage_set = model_stages(args.model)
        sizes = [f"{h}x{w}" for h, w in args.sizes]
        feeds = [frames(model, size, 1)[0] for size in args.sizes]
        total = len(hardware.units) * len(sizes) * len(stage_set.stages)
        with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                      TimeElapsedColumn(), console=console, transient=True) as bar:
            task = bar.add_task("profiling", total=total)

            def step(what: str) -> None:
                bar.update(task, advance=1, description=what)
            profile, cache, hit, skipped, notes = cached_profile(path, stage_set, hardware, feeds, sizes,
                                                                 args.repeats, not args.no_layers, step)
        console.print(f"profile {'from cache' if hit else 'measured'}: {cache}")
        for line in skipped:
            console.print(f"skipped {line}")
        for line in notes:
            console.print(line)
        summary.update(source="cache" if hit else "measured", cache=str(cache), skipped=skipped, notes=notes)
    console.print(f"{len(profile.measurements)} rows, {len(profile.layers)} layers/stages on "
                  f"{', '.join(profile.units)}; energy {profile.power_label()}")
    summary.update(rows=len(profile.measurements), units=list(profile.units), power=profile.power_label())
    surrogate = fit_surrogate(profile, hardware)
    if surrogate is not None and surrogate.report:
        table = Table("unit", "held-out rows", "R²", "MAPE", title="cost model (xgboost), latency")
        for acc in surrogate.report:
            table.add_row(acc.unit, str(acc.samples), f"{acc.r2:.3f}", f"{acc.mape:.1%}")
        console.print(table)
        summary["surrogate"] = [{"unit": a.unit, "samples": a.samples, "r2": a.r2, "mape": a.mape}
                                for a in surrogate.report]
    if args.out:
        args.out.write_text(to_csv(profile))
        console.print(f"wrote {args.out}")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1))
    return 0
