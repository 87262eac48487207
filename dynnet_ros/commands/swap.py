"""`dynnet swap prepare|profile|bench`: block stores, device delay profiles, swap benchmarks."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from dynnet_ros.commands import CommandError
from dynnet_ros.zoo import resolve_model_spec

NAME = "swap"
HELP = "SwapNet block swapping: prepare a block store, profile this device, benchmark budgets"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="swap_command", required=True, metavar="ACTION")
    prep = sub.add_parser("prepare", help="split MODEL into blocks and write its store (skeletons + aligned weights)")
    prep.add_argument("model", help="ONNX file or zoo:NAME")
    prep.add_argument("--out", type=Path, default=None, help="store directory (default: ~/.cache/dynnet_ros/swap/<hash>)")
    prep.add_argument("--max-atoms", type=int, default=16, help="finest split (sessions per model, default 16)")
    prep.add_argument("--force", action="store_true", help="rebuild even if a valid store exists")
    prep.add_argument("--optimize", choices=("all", "basic"), default="all",
                      help="all: onnxruntime's CPU-specific rewrites baked into the atoms (fastest); basic: "
                           "ONNX-domain rewrites only (portable, lower activation memory, TensorRT)")
    prep.add_argument("--json", type=Path, default=None, metavar="FILE", help="write the block table as JSON")

    prof = sub.add_parser("profile", help="measure block delays here and fit t_in/t_ex/t_out (device profile YAML)")
    prof.add_argument("models", nargs="*", default=["zoo:depth", "zoo:lane"], help="ONNX files or zoo:NAME")
    prof.add_argument("--sizes", default="192x256,384x512", help="input sizes HxW,HxW (default 192x256,384x512)")
    prof.add_argument("--repeats", type=int, default=2)
    prof.add_argument("--threads", type=int, default=None)
    prof.add_argument("--out", type=Path, default=None, help="profile YAML (default ~/.cache/dynnet_ros/swap/"
                      "device_profile.yaml or $DYNNET_SWAP_PROFILE)")
    prof.add_argument("--json", type=Path, default=None, metavar="FILE", help="also write samples + fit as JSON")

    bench = sub.add_parser("bench", help="peak memory and latency per budget: SwapNet vs in-memory vs naive blocks")
    bench.add_argument("model", help="ONNX file or zoo:NAME")
    bench.add_argument("--budgets", default="100%,50%,25%",
                       help="P%% = room for P%% of the weights (unlimited peak - (1-P)*weights), or N MB")
    bench.add_argument("--size", default="480x640", help="input HxW (default 480x640)")
    bench.add_argument("--iters", type=int, default=8)
    bench.add_argument("--repeats", type=int, default=1, help="rounds of fresh processes; medians reported")
    bench.add_argument("--threads", type=int, default=None)
    bench.add_argument("--store", default=None, help="store directory (default: a temporary one)")
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
    return {"prepare": _prepare, "profile": _profile, "bench": _bench}[args.swap_command](args)


def _prepare(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from dynnet_ros.swap.store import ensure_store, model_digest, prepare

    model = resolve_model_spec(args.model)
    if args.max_atoms < 1:
        raise CommandError("--max-atoms must be >= 1")
    console = Console()
    with console.status(f"preparing {Path(model).name} …"):
        if args.force:
            from dynnet_ros.swap.store import default_store_dir

            out = args.out or default_store_dir(model_digest(model), args.optimize)
            store, reason = prepare(model, out, max_atoms=args.max_atoms, optimize=args.optimize), "--force"
        else:
            store, reason = ensure_store(model, args.out, max_atoms=args.max_atoms, optimize=args.optimize)
    if reason:
        console.print(f"[yellow]store rebuilt:[/] {reason}")
    costs = store.reference_costs()
    table = Table(title=f"{store.path}  (reference input {store.index['reference_shapes']})")
    for col in ("atom", "nodes", "weights MB", "depth", "GFLOPs", "act MB", "cut MB", "inputs"):
        table.add_column(col, justify="right" if col != "inputs" else "left")
    rows = []
    for entry, flops, act, cut in zip(store.atoms, costs.flops, costs.act_bytes, costs.cut_bytes):
        atom = entry.atom
        rows.append({"atom": atom.index, "nodes": [atom.start, atom.end], "weight_bytes": atom.weight_bytes,
                     "depth": atom.depth, "flops": flops, "act_bytes": act, "cut_bytes": cut,
                     "inputs": list(atom.inputs)})
        table.add_row(str(atom.index), f"{atom.start}-{atom.end}", f"{atom.weight_bytes / 2**20:.2f}", str(atom.depth),
                      f"{flops / 1e9:.2f}", f"{act / 2**20:.1f}", f"{cut / 2**20:.1f}", ", ".join(atom.inputs)[:60])
    console.print(table)
    console.print(f"{store.index['optimized']} store; weights.bin {store.weights_bytes / 2**20:.1f} MB (4096-aligned), "
                  f"inline constants {store.index['inline_weight_bytes'] / 1024:.1f} KB")
    from dynnet_ros.swap.streamed import prepare as prepare_streaming

    with console.status("weight file for streaming …"):
        streamed = prepare_streaming(model)
    if streamed is None:
        console.print("no blocked layout on this CPU: budgets swap the per-block sessions above")
    else:
        console.print(f"streamed weights (the default swap mode): {streamed.directory}, "
                      f"{len(streamed.tensors)} tensors, {streamed.size / 2**20:.1f} MB, FC weights split at "
                      f"{streamed.index['split_bytes'] / 2**20:.2f} MB")
    if args.json:
        args.json.write_text(json.dumps({"store": str(store.path), "rebuilt": reason, "atoms": rows,
                                         "stream_weights": None if streamed is None else str(streamed.directory)},
                                        indent=1))
    return 0


def _profile(args) -> int:
    from rich.console import Console

    from dynnet_ros.engine.model_io import input_specs, load_model
    from dynnet_ros.swap.bench import make_feeds
    from dynnet_ros.swap.delay_model import default_profile_path
    from dynnet_ros.swap.profiling import profile
    from dynnet_ros.swap.store import ensure_store

    console = Console()
    sizes = parse_sizes(args.sizes)
    stores = []
    for spec in args.models:
        model = resolve_model_spec(spec)
        store, _ = ensure_store(model)
        specs = input_specs(load_model(model, check=False))
        stores.append((store, lambda size, specs=specs: make_feeds(specs, *size)))
    with console.status("profiling blocks …") as status:
        model, samples = profile(stores, sizes, repeats=args.repeats, threads=args.threads,
                                 progress=lambda text: status.update(f"profiling {text}"))
    out = args.out or default_profile_path()
    model.save(out)
    console.print(f"alpha {model.alpha * 1e9:.3f} s/GB  beta {model.beta * 1e6:.1f} µs/tensor  "
                  f"gamma {model.gamma * 1e9:.3f} s/GFLOP  eta {model.eta * 1e6:.2f} µs/tensor")
    console.print("R²: " + ", ".join(f"{k} {v:.3f}" for k, v in model.r2.items()) + f"  ({len(samples)} samples)")
    console.print(f"wrote {out}")
    if args.json:
        args.json.write_text(json.dumps({"profile": str(out), "r2": model.r2,
                                         "coefficients": {"alpha": model.alpha, "beta": model.beta,
                                                          "gamma": model.gamma, "eta": model.eta},
                                         "samples": [s.__dict__ for s in samples]}, indent=1))
    return 0


def _bench(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from dynnet_ros.swap.bench import BenchPlan, plot, run_bench

    model = resolve_model_spec(args.model)
    (size,) = parse_sizes(args.size)[:1]
    budgets = [b for b in args.budgets.split(",") if b.strip()]
    if not budgets or args.iters < 1 or args.repeats < 1:
        raise CommandError("need at least one budget, --iters >= 1 and --repeats >= 1")
    console = Console(width=max(160, Console().width))
    plan = BenchPlan(model, budgets, size, iters=args.iters, threads=args.threads, repeats=args.repeats,
                     store=args.store, ab=not args.no_ab)
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
        table.add_row(row["config"], fmt(row.get("budget_mb")), fmt(row["peak_mb"]), fmt(row.get("peak_over_budget"), "{:.2f}"),
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
