"""Map-and-Conquer on trained models: exits learned from photographs, one stage vs stages.

    python bench/mapper_real.py [--models yolov8n-detector,ppocr-text-detector] [--fit N]
                                [--calibration N] [--test N] [--size HxW] [--rounds R] [--json FILE]

Per corpus model (test/_corpus.py): crops of the photographs scikit-image bundles (and its
scanned page of text) make three disjoint frame sets, each cropped with its own seed: ``--fit``
frames the exit head is fitted on (``dynnet map exits``' code: ``mapper.exit_heads``, one
automatically chosen exit), ``--calibration`` frames that choose the thresholds (the lowest
whose mapped answers agree with the full model on >= 99 % and >= 95 % of them), and ``--test``
frames every configuration below answers, interleaved frame by frame in one process, ``--rounds``
times (mean latency over every answer):

(a) one stage on one core group (``cpu0``: one core, one pinned thread);
(b) one stage on a group of both cores (two threads);
(c) two stages, ``cpu0`` then ``cpu1``, exit threshold for >= 99 % calibration agreement;
(d) the same at the >= 95 % threshold;
(e) two stages one after the other on the group of both cores, >= 95 % threshold.

Then `dynnet map search` on the model with its exit (prefer latency, accuracy drop <= 1 %, the
calibration frames, a small budget): what the mapper itself would pick, and its advice.

Agreement on the test frames is the exit's per task (``exit_heads.agrees``): text map — >= 99 %
of the pixels on the same side of 0.5; detector — the same "any box" (score >= 0.25) and the
final output's shape. The mapper's own advice for each mapped run (``mapper.advice.never_early``)
is printed beside it.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from dynnet_ros.commands.exit_frames import exit_inputs
from dynnet_ros.engine.rdp import analyze
from dynnet_ros.mapper.advice import never_early
from dynnet_ros.mapper.build import build_stages
from dynnet_ros.mapper.exit_heads import agrees, learn_exits, threshold_for
from dynnet_ros.mapper.exits import model_exits
from dynnet_ros.mapper.mapping import parse_mapping
from dynnet_ros.mapper.partition import Partition
from dynnet_ros.mapper.runtime import StageExecutor
from dynnet_ros.perception.model_info import model_info

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "test"))
from _corpus import by_name, photos, resize, text_page  # the corpus lives with the tests

MODELS = ("yolov8n-detector", "ppocr-text-detector")


def crops(count: int, seed: int, size: tuple[int, int]) -> list[np.ndarray]:
    """``count`` random crops (40-90 % of each side) of the bundled photographs and the page,
    resized to ``size`` (one input shape for every frame, as a camera gives)."""
    shots = [img for _, img in photos()] + ([text_page()] if text_page() is not None else [])
    if not shots:
        raise SystemExit("scikit-image's bundled photographs are not installed (requirements-dev.txt)")
    rng = np.random.default_rng(seed)
    out = []
    for k in range(count):
        img = shots[k % len(shots)]
        h, w = img.shape[:2]
        ch, cw = int(h * rng.uniform(0.4, 0.9)), int(w * rng.uniform(0.4, 0.9))
        y, x = rng.integers(0, h - ch + 1), rng.integers(0, w - cw + 1)
        out.append(np.ascontiguousarray(resize(img[y:y + ch, x:x + cw], *size)))
    return out


def bench_model(name: str, args: argparse.Namespace) -> dict[str, Any]:
    corpus = by_name(name)
    if not corpus.available():
        raise SystemExit(corpus.skip_reason)
    model = onnx.load(str(corpus.path()))
    inputs = exit_inputs(model_info(model, str(corpus.path())), "auto", tuple(args.size), 0.25)
    feed = inputs.feed
    fit = [feed(f) for f in crops(args.fit, 1, args.size)]
    calibration = [feed(f) for f in crops(args.calibration, 2, args.size)]
    test = [feed(f) for f in crops(args.test, 3, args.size)]
    started = time.perf_counter()
    learned = learn_exits(model, inputs.task, fit, analyze(model), held_out=0.2)
    fit_s = time.perf_counter() - started
    task = inputs.task
    spec = model_exits(learned.model)[0]
    stage_set = build_stages(learned.model, Partition())
    one_stage = build_stages(model, Partition())
    conf, ok = _exit_table(learned.model, spec, task, calibration)
    t99 = threshold_for(conf, ok, 0.99)
    t95 = threshold_for(conf, ok, 0.95)
    configs = {
        "(a) one stage, 1 core": (one_stage, {"hardware": "this-machine", "stages": ["cpu0"]}),
        "(b) one stage, 2 cores": (one_stage, {"hardware": "this-machine:1", "stages": ["cpu0"]}),
        "(c) 2 stages cpu0+cpu1, >=99 %": (stage_set, {"hardware": "this-machine",
                                                     "stages": [{"unit": "cpu0", "threshold": t99[0]}, "cpu1"]}),
        "(d) 2 stages cpu0+cpu1, >=95 %": (stage_set, {"hardware": "this-machine",
                                                     "stages": [{"unit": "cpu0", "threshold": t95[0]}, "cpu1"]}),
        "(e) 2 stages on 2 cores, >=95 %": (stage_set, {"hardware": "this-machine:1",
                                                      "stages": [{"unit": "cpu0", "threshold": t95[0]}, "cpu0"]}),
    }
    executors = {label: StageExecutor(s, parse_mapping(m)) for label, (s, m) in configs.items()}
    reference = onnx.ModelProto()
    reference.CopyFrom(model)
    times: dict[str, list[float]] = {label: [] for label in configs}
    agree: dict[str, list[bool]] = {label: [] for label in configs}
    try:
        refs = [_run_full(model, f, task.output) for f in test]
        for executor in executors.values():
            executor.run(test[0])
            executor.reset_counters()
        for r in range(args.rounds):
            for i, frame in enumerate(test):
                order = list(executors.items())
                shift = (i + r) % len(order)
                for label, executor in order[shift:] + order[:shift]:
                    out = executor.run(frame)
                    result = executor.last_result
                    assert result is not None
                    times[label].append(result.latency_ms)
                    agree[label].append(agrees(task, out[task.output], refs[i]))
        rows = {}
        for label, executor in executors.items():
            details = executor.details()
            histogram = {int(k): v for k, v in details["exit_histogram"].items()}
            rows[label] = {"mean_ms": float(np.mean(times[label])), "p95_ms": float(np.percentile(times[label], 95)),
                           "agreement": float(np.mean(agree[label])), "exits": details["exit_histogram"],
                           "thresholds": details["thresholds"],
                           "advice": never_early(executor.stage_set, histogram, details["thresholds"])}
    finally:
        for executor in executors.values():
            executor.close()
    report = learned.reports[0]
    search = _search(learned.model, calibration, args)
    return {"search": search, "model": name, "task": task.to_json(), "exit": report.point.to_json(),
            "fit_frames": len(fit),
            "fit_seconds": round(fit_s, 1), "calibration_frames": len(calibration), "test_frames": len(test),
            "rounds": args.rounds, "calibration": {"99%": t99, "95%": t95},
            "exit_agreement_calibration": float(np.mean(ok)), "configs": rows}


def _search(model: onnx.ModelProto, frames: list[dict[str, np.ndarray]], args: argparse.Namespace) -> dict[str, Any]:
    """`dynnet map search` on the model with its exit (calibration: the calibration frames; its
    own profile cache in a temporary directory): its pick and advice."""
    with tempfile.TemporaryDirectory() as tmp:
        path, npz, out = Path(tmp) / "exits.onnx", Path(tmp) / "calibration.npz", Path(tmp) / "search.json"
        onnx.save(model, str(path))
        np.savez(npz, **{name: np.concatenate([f[name] for f in frames]) for name in frames[0]})
        size = f"{args.size[0]}x{args.size[1]}"
        command = [sys.executable, "-c", "from dynnet_ros.cli import main; raise SystemExit(main())", "map", "search",
                   str(path), "--hw", "this-machine", "--size", size, "--calibration", str(npz), "--no-layers",
                   "--repeats", "3", "--generations", "8", "--population", "16", "--prefer", "latency",
                   "--max-accuracy-drop", "0.01", "--json", str(out)]
        subprocess.run(command, check=True, capture_output=True, env=dict(os.environ, DYNNET_MAP_DIR=tmp))
        result = json.loads(out.read_text())
    pick = result["pick"]
    return {"assignment": pick["assignment"], "thresholds": pick["thresholds"],
            "predicted_ms": pick["latency_ms"], "exit_rates": pick["exit_rates"],
            "baselines": {b.get("label", ""): b["latency_ms"] for b in result["baselines"]},
            "advice": result.get("advice")}


def _exit_table(model: onnx.ModelProto, spec, task, frames) -> tuple[list[float], list[bool]]:
    import onnxruntime as ort
    from onnx import helper

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    names = list(spec.tensors)
    probe.graph.output.extend(helper.make_empty_tensor_value_info(n) for n in names)
    session = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    conf, ok = [], []
    for frame in frames:
        values = dict(zip([task.output, *names], session.run([task.output, *names], frame)))
        conf.append(spec.confidence(values))
        ok.append(agrees(task, values[spec.outputs[0]], values[task.output]))
    return conf, ok


def _run_full(model: onnx.ModelProto, feed, output: str) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run([output], feed)[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--fit", type=int, default=40)
    parser.add_argument("--calibration", type=int, default=40)
    parser.add_argument("--test", type=int, default=24)
    parser.add_argument("--size", type=lambda t: tuple(int(v) for v in t.split("x")), default=(320, 320),
                        help="frame size HxW (multiples of 32)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    results = [bench_model(name, args) for name in args.models.split(",")]
    print(f"load average {load_before:.1f} -> {os.getloadavg()[0]:.1f}; {time.perf_counter() - started:.0f} s")
    print("| model | exit at (FLOPs before) | configuration | threshold | mean ms (p95) | x of (a) | early answers "
          "| agreement | mapper's advice |")
    print("|---|---|---|---|---|---|---|---|---|")
    for res in results:
        base = res["configs"]["(a) one stage, 1 core"]["mean_ms"]
        for label, row in res["configs"].items():
            thresholds = [t for t in row["thresholds"][:-1] if t is not None]
            exits = row["exits"]
            early = sum(v for k, v in exits.items() if k != str(len(row["thresholds"]) - 1))
            total = sum(exits.values())
            print(f"| {res['model']} | {res['exit']['tensor']} ({res['exit']['cost_fraction']:.0%}) | {label} | "
                  f"{', '.join(f'{t:.3f}' for t in thresholds) or '-'} | {row['mean_ms']:.1f} ({row['p95_ms']:.1f}) | "
                  f"{base / row['mean_ms']:.2f}x | {f'{early}/{total}' if thresholds else '-'} | "
                  f"{row['agreement']:.0%} | {'one stage' if row['advice'] else '-'} |")
    print()
    print("| model | `map search` pick (prefer latency, accuracy drop <= 1 %) | predicted ms | single-unit "
          "baselines, predicted ms | the search's advice |")
    print("|---|---|---|---|---|")
    for res in results:
        search = res["search"]
        units = ", ".join(f"{k}: {v}" for k, v in search["assignment"].items())
        baselines = ", ".join(f"{k} {v:.1f}" for k, v in search["baselines"].items() if k.endswith("-only"))
        print(f"| {res['model']} | {units}; thresholds {search['thresholds']}; exit rates {search['exit_rates']} | "
              f"{search['predicted_ms']:.1f} | {baselines} | {search['advice'] or '-'} |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
