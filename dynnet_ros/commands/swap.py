"""`dynnet swap prepare|bench`: streamed weight files and swap benchmarks."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from dynnet_ros.bytesize import MB
from dynnet_ros.commands import CommandError
from dynnet_ros.commands.swap_bench import OVER_LIMIT, BenchPlan, plot, run_bench, run_sweep, sweep_sizes
from dynnet_ros.engine.modelio.loader import load_skeleton
from dynnet_ros.swap.streamed import prepare_weight_file
from dynnet_ros.swap.weight_file import StoreError
from dynnet_ros.zoo import resolve_model_spec


def run(args: argparse.Namespace) -> int:
    return {"prepare": _prepare, "bench": _bench}[args.swap_command](args)


def _prepare(args) -> int:
    model = resolve_model_spec(args.model)
    console = Console()
    try:
        with console.status(f"weight file of {Path(model).name} …"):
            weights, reason = prepare_weight_file(load_skeleton(model), args.layout)
    except (ValueError, OSError, StoreError) as exc:
        raise CommandError(str(exc)) from None
    if reason:
        console.print(f"replaced a damaged or stale weight file ({reason})")
    console.print(f"{weights.directory}: {weights.layout} layout, {len(weights.tensors)} tensors, "
                  f"{weights.size / MB:.1f} MB, FC weights split at {weights.index['split_bytes'] / MB:.2f} MB")
    if args.json:
        args.json.write_text(json.dumps({"weights": str(weights.directory), "layout": weights.layout,
                                         "rebuilt": reason, "tensors": len(weights.tensors), "bytes": weights.size,
                                         "split_bytes": weights.index["split_bytes"]}, indent=1))
    return 0


def _bench(args) -> int:
    model = resolve_model_spec(args.model)
    budgets: list[str] = args.budgets
    if args.size is None:
        return _sweep(args, model, budgets, args.sizes or sweep_sizes())
    size: tuple[int, int] = args.size
    console = Console(width=max(160, Console().width))
    plan = BenchPlan(model, budgets, size, iters=args.iters, threads=args.threads, repeats=args.repeats,
                     ab=not args.no_ab)
    with console.status("benchmarking …") as status:
        result = run_bench(plan, progress=lambda text: status.update(text))
    table = Table(title=f"{Path(model).name} @ {size[0]}x{size[1]}: weights {result['weight_mb']:.1f} MB, "
                        f"unlimited peak {result['unlimited_peak_mb']:.1f} MB")
    for col in ("config", "budget MB", "peak MB", "peak/budget", "load peak MB", "mean ms", "p95 ms", "× ref",
                "A/B ×ORT", "blocks", "max |diff|", "switch p95 ms", "store cached MB"):
        table.add_column(col, justify="left" if col == "config" else "right")
    fmt = lambda v, f="{:.1f}": "-" if v is None else f.format(v)  # noqa: E731
    for row in result["summary"]:
        if "error" in row:
            table.add_row(row["config"], fmt(row.get("budget_mb")), "[red]" + row["error"][:60], *["-"] * 10)
            continue
        table.add_row(row["config"], fmt(row.get("budget_mb")), fmt(row["peak_mb"]),
                      fmt(row.get("peak_over_budget"), "{:.2f}"),
                      fmt(row["peak_load_mb"]), fmt(row["mean_ms"]), fmt(row["p95_ms"]),
                      fmt(row.get("latency_vs_inmemory"), "{:.2f}"), fmt(row.get("ab_ratio_mean"), "{:.2f}"),
                      str(row.get("blocks")),
                      fmt(row.get("max_abs_diff"), "{:.1e}"), fmt(row.get("switch_p95_ms"), "{:.2f}"),
                      fmt(row.get("store_cached_mb")))
    console.print(table)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    if args.png:
        plot(result, args.png)
    return 0


def _sweep(args, model: str, budgets: list[str], sizes: list[tuple[int, int]]) -> int:
    """The size sweep: peak / budget per input size and budget, rows above the limit flagged."""
    console = Console(width=max(120, Console().width))
    with console.status("size sweep …") as status:
        result = run_sweep(model, budgets, sizes, iters=args.iters, threads=args.threads,
                           progress=lambda text: status.update(text))
    table = Table(title=f"{Path(model).name}: weights {result['weight_mb']:.1f} MB, peak / budget per input size")
    for col in ("size", "config", "budget MB", "peak MB", "peak/budget", f"> {OVER_LIMIT:g}", "mean ms"):
        table.add_column(col, justify="left" if col in ("size", "config") else "right")
    fmt = lambda v, f="{:.1f}": "-" if v is None else f.format(v)  # noqa: E731
    for row in result["rows"]:
        size = f"{row['size'][0]}x{row['size'][1]}"
        if "error" in row:
            table.add_row(size, row["config"], fmt(row["budget_mb"]), "[yellow]refused: " + row["error"][-90:], "-",
                          "-", "-")
            continue
        table.add_row(size, row["config"], fmt(row["budget_mb"]), fmt(row["peak_mb"]),
                      fmt(row.get("peak_over_budget"), "{:.2f}"), "[red]OVER" if row.get("over") else "",
                      fmt(row["mean_ms"]))
    console.print(table)
    worst = "-" if result["worst"] is None else f"{result['worst']:.2f}"
    console.print(f"{len(result['rows'])} rows, {result['over']} above {OVER_LIMIT:g} x budget, "
                  f"{result['refused']} refused (below the minimum at that size); worst peak/budget {worst}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0
