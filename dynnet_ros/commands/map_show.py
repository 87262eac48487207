"""`dynnet map show`: a search result (its --json file) as tables."""
from __future__ import annotations

import argparse
import json

from rich.console import Console
from rich.table import Table

from dynnet_ros.commands import CommandError


def _row(table: Table, label: str, entry: dict) -> None:
    assignment = entry.get("assignment", {})
    units = ", ".join(f"{k}:{v}" for k, v in assignment.items())
    table.add_row(label, f"{entry['latency_ms']:.3f}", f"{entry['energy_mj']:.3f}", f"{entry.get('accuracy', 1):.3f}",
                  units if len(units) < 70 else units[:67] + "...")


def run(args: argparse.Namespace) -> int:
    if args.result is None:
        raise CommandError("give the JSON file `dynnet map search --json` wrote")
    try:
        data = json.loads(args.result.read_text())
        pick, pareto, baselines = data["pick"], data["pareto"], data.get("baselines", [])
        for entry in [pick, *pareto, *baselines]:
            float(entry["latency_ms"]), float(entry["energy_mj"])
    except json.JSONDecodeError as exc:
        raise CommandError(f"{args.result}: not JSON ({exc.msg}, line {exc.lineno})") from None
    except (KeyError, TypeError, ValueError) as exc:
        raise CommandError(f"{args.result}: not a `dynnet map search --json` result (missing {exc})") from None
    console = Console()
    console.print(f"{data.get('kind', '?')} search on {data.get('hardware', '?')}, energy {data.get('energy', '?')}; "
                  f"{json.dumps(data.get('search', {}))}")
    if "calibrated" in data:
        costs = ", ".join(f"{k} {v:g}" for k, v in data.get("runtime_costs", {}).items())
        model = f"runtime costs {costs}" if data["calibrated"] else "the paper's model (no runtime costs)"
        console.print(f"predictions with {model}; {data.get('runtime_costs_source', '')}")
    table = Table("", "latency ms", "energy mJ", "accuracy", "assignment")
    _row(table, f"pick ({pick.get('rule', '')})", pick)
    for entry in baselines:
        _row(table, entry.get("label", "baseline"), entry)
    for i, entry in enumerate(pareto[:args.limit]):
        _row(table, f"pareto {i}", entry)
    console.print(table)
    if "measured" in data:
        m = data["measured"]
        console.print(f"measured {m['mean_ms']:.3f} ms vs predicted {m['predicted_ms']:.3f} ms ({m['error']:.1%})")
    return 0
