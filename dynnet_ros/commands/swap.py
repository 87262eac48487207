"""`dynnet swap prepare|bench`: streamed weight files and swap benchmarks."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from dynnet_ros.commands import CommandError
from dynnet_ros.commands.swap_bench import BenchPlan, plot, run_bench
from dynnet_ros.engine.plan.loader import load_skeleton
from dynnet_ros.swap.streamed import prepare_weight_file
from dynnet_ros.swap.weight_file import StoreError
from dynnet_ros.units import MB
from dynnet_ros.zoo import resolve_model_spec

NAME = "swap"
HELP = "weights streamed under a memory budget: prepare a weight file, benchmark budgets"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="swap_command", required=True, metavar="ACTION")
    prep = sub.add_parser("prepare", help="write MODEL's weight file for streaming (built on first use otherwise)")
    prep.add_argument("model", help="ONNX file or zoo:NAME")
    prep.add_argument("--layout", choices=("nchwc", "as-given"), default="nchwc",
                      help="nchwc: onnxruntime's blocked layout where this CPU has its kernels, else the model "
                           "as given (default); as-given: always the model as given")
    prep.add_argument("--json", type=Path, default=None, metavar="FILE", help="write the weight file's summary as JSON")

    bench = sub.add_parser("bench", help="peak memory and latency per budget: streamed vs in-memory vs naive")
    bench.add_argument("model", help="ONNX file or zoo:NAME")
    bench.add_argument("--budgets", default="100%,50%,25%",
                       help="P%% = room for P%% of the weights (unlimited peak - (1-P)*weights), or N MB")
    bench.add_argument("--size", default="480x640", help="input HxW (default 480x640)")
    bench.add_argument("--iters", type=int, default=8)
    bench.add_argument("--repeats", type=int, default=1, help="rounds of fresh processes; medians reported")
    bench.add_argument("--threads", type=int, default=None)
    bench.add_argument("--no-ab", action="store_true",
                       help="skip the same-process A/B latency run (direct onnxruntime vs swapped, alternating)")
    bench.add_argument("--json", type=Path, default=None, metavar="FILE")
    bench.add_argument("--png", type=Path, default=None, metavar="FILE")


def parse_sizes(text: str) -> list[tuple[int, int]]:
    try:
        sizes = [tuple(int(v) for v in item.lower().split("x")) for item in text.split(",") if item.strip()]
        if not sizes or any(len(s) != 2 or min(s) < 1 for s in sizes):
            raise ValueError
    except ValueError:
        raise CommandError(f"bad size list {text!r}: use HxW[,HxW...]") from None
    return sizes  # type: ignore[return-value]


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
        console.print(f"[yellow]weight file rebuilt:[/] {reason}")
    console.print(f"{weights.directory}: {weights.layout} layout, {len(weights.tensors)} tensors, "
                  f"{weights.size / MB:.1f} MB, FC weights split at {weights.index['split_bytes'] / MB:.2f} MB")
    if args.json:
        args.json.write_text(json.dumps({"weights": str(weights.directory), "layout": weights.layout,
                                         "rebuilt": reason, "tensors": len(weights.tensors), "bytes": weights.size,
                                         "split_bytes": weights.index["split_bytes"]}, indent=1))
    return 0


def _bench(args) -> int:
    model = resolve_model_spec(args.model)
    (size,) = parse_sizes(args.size)[:1]
    budgets = [b for b in args.budgets.split(",") if b.strip()]
    if not budgets or args.iters < 1 or args.repeats < 1:
        raise CommandError("need at least one budget, --iters >= 1 and --repeats >= 1")
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
