"""Budgets over a varying input size: `python bench/budget_shapes.py [--out DIR] [--models ...]`.

Per model, one engine is built with a budget at the first input shapes of a sequence (as a node
does: ``Engine(memory_budget_mb=B, input_shapes=first)``), then fed the sequence twice over, in a
fresh process per budget (commands/swap_bench_worker.py ``sequence`` mode). Budgets are P % of
the unlimited footprint at the first shapes in the sense of docs/swap.md: the in-memory level −
(1 − P/100) × the weights. Per shape: the engine's minimum there, what happened (within the
budget, flagged over it with ``over_budget="run"``, refused), the peak RSS growth over the
budget, and the latency of its first frame (which measures the footprint at a new size in a
child process) and of its second. Writes DIR/budget_shapes.json and DIR/budget_shapes.md.

``--changes MODEL`` adds budget changes at one input size (the ``changes`` mode): an engine
built plain and one built ``swappable`` taken through minimum → middle → minimum → unlimited →
middle; per change, its peak (to the end of the first frame after it) against the peaks of the
states before and after.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "test"))
from _corpus import by_name  # the corpus lives with the tests

from dynnet_ros.bytesize import MB
from dynnet_ros.commands.swap_bench import parse_budget, run_worker
from dynnet_ros.engine import Engine
from dynnet_ros.zoo import MODEL_NAMES, ensure_model

Shapes = dict[str, tuple[int, ...]]


def zoo_shapes(name: str, height: int, width: int) -> Shapes:
    shapes: Shapes = {"image": (1, 3, height, width)}
    if name == "depth":
        shapes["lidar_depth"] = (1, 1, height, width)
    if name == "pedestrian":
        shapes.update({"score_threshold": (1,), "iou_threshold": (1,), "max_detections": (1,)})
    return shapes


def cases() -> dict[str, tuple[str, list[Shapes]]]:
    """model -> (path, shape sequence): zoo models over the letterboxed sizes a node feeds, the
    corpus detector and text recogniser over a detector's and a text line's usual input sizes."""
    out = {name: (str(ensure_model(name)), [zoo_shapes(name, h, w) for h, w in ((256, 320), (480, 640), (384, 640))])
           for name in MODEL_NAMES}
    detector, recogniser = by_name("yolov8n-detector"), by_name("ppocr-text-recogniser")
    if detector.available():
        out[detector.name] = (str(detector.path()), [{"images": (1, 3, 320, 320)}, {"images": (1, 3, 480, 640)},
                                                     {"images": (2, 3, 256, 384)}])
    if recogniser.available():
        out[recogniser.name] = (str(recogniser.path()), [{"x": (1, 3, 48, 320)}, {"x": (1, 3, 48, 160)},
                                                         {"x": (1, 3, 48, 640)}])
    return out


def key(shapes: Shapes) -> str:
    return ", ".join("x".join(map(str, shape)) for name, shape in shapes.items() if len(shape) > 1)


def measure(name: str, path: str, sequence: list[Shapes], budgets: list[str], threads: int) -> list[dict]:
    with Engine(path, threads=threads, swappable=True, input_shapes=sequence[0]) as engine:
        calibration = engine._swap.footprint(sequence[0])
        unlimited, weights = calibration.inmemory_bytes() / MB, calibration.weight_span / MB
        minimum = engine.min_budget_mb()
    rows = []
    for spec in budgets:
        budget = parse_budget(spec, unlimited, weights)
        config = {"mode": "sequence", "model": path, "threads": threads, "budget_mb": budget, "over_budget": "run",
                  "sequence": [{n: list(s) for n, s in shapes.items()} for shapes in sequence + sequence]}
        try:
            result = run_worker(config)
        except RuntimeError as exc:  # refused at the first shapes: below the minimum there
            rows.append({"model": name, "level": spec, "budget_mb": budget, "minimum_mb": minimum,
                         "error": str(exc)})
            continue
        frames = result["frames"]
        # a frame right after one flagged over the budget starts from that state: its peak is the
        # flagged frame's, so a shape's peak is taken from its frames that follow no flagged one
        own = [k == 0 or frames[k - 1]["outcome"] != "flagged" for k in range(len(frames))]
        half = len(frames) // 2
        for k in range(half):
            first, second = frames[k], frames[k + half]
            peaks = [f["peak_mb"] for f, mine in ((first, own[k]), (second, own[k + half])) if mine]
            rows.append({"model": name, "level": spec, "budget_mb": budget, "shape": key(first["shapes"]),
                         "minimum_mb": first["minimum_mb"], "outcome": second["outcome"],
                         "peak_mb": max(peaks) if peaks else min(first["peak_mb"], second["peak_mb"]),
                         "carried": not peaks, "first_ms": first["ms"], "ms": second["ms"]})
        print(f"{name} {spec}: done", flush=True)
    return rows


def measure_changes(name: str, path: str, shapes: Shapes, threads: int) -> list[dict]:
    with Engine(path, threads=threads, swappable=True, input_shapes=shapes) as engine:
        low, top = engine.min_budget_mb(), engine._swap.footprint(shapes).inmemory_bytes() / MB
    mid = (low + top) / 2
    rows = []
    for swappable in (False, True):
        result = run_worker({"mode": "changes", "model": path, "threads": threads, "swappable": swappable,
                             "shapes": {n: list(s) for n, s in shapes.items()},
                             "changes": [low * 1.01, mid, low * 1.01, None, mid]})
        states = result["states"]
        for before, after in zip(states, states[1:]):
            rows.append({"model": name, "engine": "swappable" if swappable else "plain", "input": key(shapes),
                         "from_mb": before["budget_mb"], "to_mb": after["budget_mb"],
                         "before_peak_mb": before["state_peak_mb"], "change_peak_mb": after["change_peak_mb"],
                         "after_peak_mb": after["state_peak_mb"]})
    return rows


def changes_markdown(rows: list[dict]) -> str:
    lines = ["| model | engine | input | budget MB | peak before MB | peak of the change MB | peak after MB "
             "| change / larger state |", "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        mb = lambda v: "unlimited" if v is None else f"{v:.1f}"  # noqa: E731
        larger = max(row["before_peak_mb"], row["after_peak_mb"])
        lines.append(f"| {row['model']} | {row['engine']} | {row['input']} | {mb(row['from_mb'])} → "
                     f"{mb(row['to_mb'])} | {row['before_peak_mb']:.1f} | {row['change_peak_mb']:.1f} "
                     f"| {row['after_peak_mb']:.1f} | {row['change_peak_mb'] / larger:.2f} |")
    return "\n".join(lines) + "\n"


def markdown(rows: list[dict]) -> str:
    lines = ["| model | budget | input | minimum MB | outcome | peak MB | peak / budget | first frame ms | ms |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        level = f"{row['level']} = {row['budget_mb']:.1f} MB"
        if "error" in row:
            lines.append(f"| {row['model']} | {level} | first input | {row['minimum_mb']:.1f} | refused at "
                         f"construction | - | - | - | - |")
            continue
        carried = " *" if row["carried"] else ""
        lines.append(f"| {row['model']} | {level} | {row['shape']} | {row['minimum_mb']:.1f} | {row['outcome']} "
                     f"| {row['peak_mb']:.1f}{carried} | {row['peak_mb'] / row['budget_mb']:.2f} "
                     f"| {row['first_ms']:.0f} | {row['ms']:.0f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench-results/budget-shapes"))
    parser.add_argument("--models", default=None, help="comma-separated subset (default: every zoo and corpus case)")
    parser.add_argument("--budgets", default="100%,50%,25%")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--changes", default=None, help="also measure budget changes of this model (a case name)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    known = cases()
    names = args.models.split(",") if args.models is not None else list(known)
    names = [name for name in names if name]
    rows: list[dict] = []
    for name in names:
        path, sequence = known[name]
        rows += measure(name, path, sequence, args.budgets.split(","), args.threads)
        (args.out / "budget_shapes.json").write_text(json.dumps(rows, indent=1))
    table = markdown(rows)
    (args.out / "budget_shapes.md").write_text(table)
    print(table)
    silent = [r for r in rows if "error" not in r and r["outcome"] == "within" and r["peak_mb"] > 1.05 * r["budget_mb"]]
    print(f"frames above 1.05 x budget without a flag: {len(silent)}")
    if args.changes:
        path, sequence = known[args.changes]
        change_rows = measure_changes(args.changes, path, sequence[0], args.threads)
        (args.out / "budget_changes.json").write_text(json.dumps(change_rows, indent=1))
        print(changes_markdown(change_rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
