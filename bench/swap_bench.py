"""SwapNet benchmark over every zoo model: `python bench/swap_bench.py [--out DIR] [--iters N]`.

Runs `dynnet swap bench` for each model (fresh process per configuration) and writes
DIR/<model>.json, DIR/<model>.png and DIR/swap_bench.md (the table docs/swap.md shows).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dynnet_ros.commands.swap_bench import BenchPlan, plot, run_bench
from dynnet_ros.zoo import MODEL_NAMES, ensure_model


def markdown(results: list[dict]) -> str:
    lines = ["| model | config | budget MB | peak MB | peak/budget | mean ms | p95 ms | A/B wall ×ORT | A/B CPU ×ORT "
             "| A/B wall ×inmem | A/B CPU ×inmem | blocks (pinned) | max abs diff | switch p95 ms "
             "| store in page cache MB |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    fmt = lambda v, f="{:.1f}": "-" if v is None else f.format(v)  # noqa: E731
    for result in results:
        name = Path(result["model"]).stem
        for row in result["summary"]:
            if "error" in row:
                lines.append(f"| {name} | {row['config']} | {fmt(row.get('budget_mb'))} | error: {row['error'][:80]} "
                             "| | | | | | | | | | | |")
                continue
            pinned = f" ({row['pinned_blocks']})" if row.get("pinned_blocks") is not None else ""
            if row.get("optimized"):
                pinned += f" {row['optimized'].replace('ort-', '')}"
            if row.get("streamed"):
                pinned += " stream"
            if row.get("wrap"):
                pinned += " wrap"
            lines.append(
                f"| {name} | {row['config']} | {fmt(row.get('budget_mb'))} | {fmt(row['peak_mb'])} "
                f"| {fmt(row.get('peak_over_budget'), '{:.2f}')} | {fmt(row['mean_ms'], '{:.0f}')} "
                f"| {fmt(row['p95_ms'], '{:.0f}')} | {fmt(row.get('ab_ratio_mean'), '{:.2f}')} "
                f"| {fmt(row.get('ab_cpu_ratio'), '{:.2f}')} "
                f"| {fmt(row.get('ab_inmemory_ratio_mean'), '{:.2f}')} "
                f"| {fmt(row.get('ab_inmemory_cpu_ratio'), '{:.2f}')} "
                f"| {row.get('blocks')}{pinned} "
                f"| {fmt(row.get('max_abs_diff'), '{:.1e}')} | {fmt(row.get('switch_p95_ms'), '{:.2f}')} "
                f"| {fmt(row.get('store_cached_mb'))} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench-results/swap"))
    parser.add_argument("--models", default=",".join(MODEL_NAMES))
    parser.add_argument("--budgets", default="100%,50%,25%")
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--size", default="480x640")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    height, width = (int(v) for v in args.size.split("x"))
    results = []
    for name in [m for m in args.models.split(",") if m]:
        plan = BenchPlan(str(ensure_model(name)), args.budgets.split(","), (height, width), iters=args.iters,
                         threads=args.threads)
        result = run_bench(plan, progress=lambda text, name=name: print(f"[{name}] {text}", flush=True))
        (args.out / f"{name}.json").write_text(json.dumps(result, indent=1))
        plot(result, args.out / f"{name}.png")
        results.append(result)
        (args.out / "swap_bench.md").write_text(markdown(results))
    print(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
