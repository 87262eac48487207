"""Map-and-Conquer's system model against the stage runtime on this machine: predicted vs measured.

    python bench/mapper_accuracy.py [--model multiexit] [--size 128x128] [--frames 8] [--rounds 5]
                                    [--repeats 3] [--json FILE] [--keep]

Three stage sets of the model — depth-wise at its exits, a width split (2 stages, P 0.5/0.5) without
feature reuse and one where stage 1 reuses stage 0's features — each under several mappings onto
the two CPU groups (single-unit, alternating, with and without early exits). In every round, in one
process: each stage part is timed alone on each unit (the runtime's pinned sessions, runs back to
back: warm caches), then each mapping in turn answers every frame in the stage runtime (after one
warm-up frame: warm caches too, as a node running one mapping has them), the order rotating from
round to round. A part's time is its min over the rounds' runs, a mapping's latency the mean over
frames of each frame's min over the rounds: min-of-N on both sides, so the load of the machine
(which only adds) falls out of both alike as far as it can.

Predictions (``mapper.runtime_costs``): the task graph of the runtime's own parts with the part
times, at the exit rates the calibration of those frames gives,

* ``alone``: the paper's model (no runtime costs);
* ``calibrated``: plus the runtime costs (``system_model.RuntimeCosts``: a dispatch cost per part,
  a contention factor for two units running at once, a slowdown of the parts' own times) fitted
  to the *other* mappings (leave one out), so no mapping's prediction saw its own measurement.

Prints a row per mapping and the MAPE of each prediction; ``--json`` writes them all; ``--keep``
keeps the costs fitted on all mappings where ``dynnet map search`` on this machine finds them
(``mapper.runtime_cache``).
"""
from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import asdict
from typing import Any

import numpy as np
import onnx

from dynnet_ros.commands.map_inputs import scene_feeds
from dynnet_ros.mapper.build import build_stages
from dynnet_ros.mapper.hardware import load_hardware
from dynnet_ros.mapper.mapping import StageAssignment, StageMapping
from dynnet_ros.mapper.model_search import calibrate
from dynnet_ros.mapper.partition import Partition, parse_partition
from dynnet_ros.mapper.runtime import StageExecutor
from dynnet_ros.mapper.runtime_cache import KeptCosts, costs_file, write_costs
from dynnet_ros.mapper.runtime_costs import (
    Observation,
    contention_matters,
    fit_runtime_costs,
    part_graph,
    part_info,
    predict,
    relative_errors,
    time_parts,
)
from dynnet_ros.mapper.system_model import RuntimeCosts
from dynnet_ros.settings import settings
from dynnet_ros.zoo import ensure_model

NEVER = 2.0   # above every confidence: the exit never answers


def stage_sets(model: onnx.ModelProto, frames: list[dict]) -> dict[str, Any]:
    """The three stage sets of the bench, by name."""
    width = {"stages": 2, "P": [0.5, 0.5]}
    return {"depth": build_stages(model, Partition()),
            "width": build_stages(model, parse_partition({"width": dict(width, I=[0, 0])}), frames),
            "width-reuse": build_stages(model, parse_partition({"width": dict(width, I=[1, 0])}), frames)}


def mappings(stages: int, early: list[float]) -> list[tuple[str, list[str], list[float | None]]]:
    """(label, unit per stage, threshold per stage) of the mappings measured for a stage set:
    each group alone and alternating groups, without early exits and with ``early``."""
    alternating = [["cpu0", "cpu1"][k % 2] for k in range(stages)]
    flipped = [["cpu1", "cpu0"][k % 2] for k in range(stages)]
    out = []
    for name, units in (("cpu0-only", ["cpu0"] * stages), ("cpu1-only", ["cpu1"] * stages),
                        ("alternating", alternating), ("alternating-flipped", flipped)):
        out.append((name, units, [NEVER] * (stages - 1) + [None]))
        out.append((f"{name}+early", units, list(early) + [None]))
    return out


def run_bench(args: argparse.Namespace) -> dict[str, Any]:
    hardware = load_hardware("this-machine")
    model = onnx.load(ensure_model(args.model))
    height, width = (int(v) for v in args.size.split("x"))
    frames = list(scene_feeds(model, args.frames, height, width))
    sets = stage_sets(model, frames)
    load_before = os.getloadavg()
    plans = []      # (set name, label, units, thresholds, executor)
    infos, rates = {}, {}
    for set_name, stage_set in sets.items():
        infos[set_name] = part_info(stage_set, frames[0])
        calibration = calibrate(stage_set, frames)
        # early thresholds: each early exit's median confidence on these frames
        early = [float(np.median(calibration.exits.confidence[:, k])) for k in range(len(stage_set.stages) - 1)]
        for label, units, thresholds in mappings(len(stage_set.stages), early):
            finite = [t if t is not None and t < NEVER else np.inf for t in thresholds[:-1]]
            rates[(set_name, label)] = tuple(float(r) for r in calibration.exits.outcome(finite)[0])
            mapping = StageMapping(hardware, Partition(), tuple(StageAssignment(u, None, t)
                                                               for u, t in zip(units, thresholds)))
            plans.append((set_name, label, units, thresholds, StageExecutor(stage_set, mapping)))
    best_part: dict[str, dict] = {name: {} for name in sets}
    best_frame = np.full((len(plans), len(frames)), np.inf)
    taken = np.zeros((len(plans), len(frames)), dtype=int)
    began = time.perf_counter()
    try:
        for _, _, _, _, executor in plans:
            executor.run(frames[0])
        for round_ in range(args.rounds):
            for set_name in sets:
                for key, ms in time_parts(infos[set_name], hardware, ["cpu0", "cpu1"], frames[0],
                                          args.repeats).items():
                    best_part[set_name][key] = min(ms, best_part[set_name].get(key, np.inf))
            shift = round_ % len(plans)          # each round starts with another mapping
            for i in list(range(shift, len(plans))) + list(range(shift)):
                executor = plans[i][-1]
                executor.run(frames[-1])         # its weights back in the caches, as in a node's steady state
                for f, feeds in enumerate(frames):
                    start = time.perf_counter()
                    executor.run(feeds)
                    best_frame[i, f] = min(best_frame[i, f], (time.perf_counter() - start) * 1000.0)
                    assert executor.last_result is not None
                    taken[i, f] = executor.last_result.exit_index
            print(f"round {round_ + 1}/{args.rounds} done ({time.perf_counter() - began:.0f} s, "
                  f"load {os.getloadavg()[0]:.1f})", flush=True)
    finally:
        for *_, executor in plans:
            executor.close()
    raw = {"model": args.model, "size": args.size, "frames": len(frames), "rounds": args.rounds,
           "repeats": args.repeats, "seconds": round(time.perf_counter() - began, 1),
           "load_average_before": list(load_before), "load_average_after": list(os.getloadavg()),
           "part_ms": {name: [[k, j, u, ms] for (k, j, u), ms in parts.items()] for name, parts in best_part.items()},
           "mappings": [{"stages": set_name, "mapping": label, "units": units,
                         "thresholds": [t if t is None or t < NEVER else "never" for t in thresholds],
                         "exit_rates_predicted": list(rates[(set_name, label)]),
                         "exit_rates_measured": (np.bincount(taken[i], minlength=len(units)) / len(frames)).tolist(),
                         "frame_min_ms": best_frame[i].tolist()}
                        for i, (set_name, label, units, thresholds, _) in enumerate(plans)]}
    return analyse(raw, {name: infos[name] for name in sets})


def analyse(raw: dict[str, Any], infos: dict[str, Any]) -> dict[str, Any]:
    """Predictions (alone, calibrated leave-one-out) and errors for the measured ``raw`` data."""
    hardware = load_hardware("this-machine")
    parts = {name: {(k, j, u): ms for k, j, u, ms in rows} for name, rows in raw["part_ms"].items()}
    observations = []
    for m in raw["mappings"]:
        graph = part_graph(infos[m["stages"]], m["units"], parts[m["stages"]], hardware)
        observations.append(Observation(graph, tuple(m["exit_rates_predicted"]), float(np.mean(m["frame_min_ms"]))))
    fitted_all = fit_runtime_costs(observations, hardware)
    rows = []
    for i, m in enumerate(raw["mappings"]):
        others = observations[:i] + observations[i + 1:]
        fitted = fit_runtime_costs(others, hardware, None if contention_matters(others, hardware) else [1.0])
        obs = observations[i]
        alone, calibrated = predict(obs, hardware), predict(obs, hardware, fitted)
        rows.append(dict({k: v for k, v in m.items() if k != "frame_min_ms"}, measured_ms=obs.measured_ms,
                         predicted_alone_ms=alone, predicted_calibrated_ms=calibrated,
                         error_alone=abs(alone - obs.measured_ms) / obs.measured_ms,
                         error_calibrated=abs(calibrated - obs.measured_ms) / obs.measured_ms,
                         fitted_without_it=asdict(fitted)))
    mape = {key: float(np.mean([r[f"error_{key}"] for r in rows])) for key in ("alone", "calibrated")}
    per_set = {name: {key: float(np.mean([r[f"error_{key}"] for r in rows if r["stages"] == name]))
                      for key in ("alone", "calibrated")} for name in infos}
    return dict(raw, fitted_on_all=asdict(fitted_all),
                mape_fitted_on_all=float(relative_errors(observations, hardware, fitted_all).mean()),
                mape=mape, mape_per_stage_set=per_set, rows=rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="multiexit")
    parser.add_argument("--size", default="128x128")
    parser.add_argument("--frames", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default=None)
    parser.add_argument("--reuse", default=None, metavar="JSON",
                        help="analyse the measurements of an earlier --json instead of measuring again")
    parser.add_argument("--keep", action="store_true",
                        help="keep the costs fitted on all mappings for later `dynnet map search` runs on "
                             "this machine (DYNNET_MAP_DIR)")
    args = parser.parse_args()
    if args.reuse:
        with open(args.reuse) as f:
            raw = json.load(f)
        model = onnx.load(ensure_model(raw["model"]))
        height, width = (int(v) for v in raw["size"].split("x"))
        frames = list(scene_feeds(model, raw["frames"], height, width))
        result = analyse(raw, {name: part_info(s, frames[0]) for name, s in stage_sets(model, frames).items()})
    else:
        result = run_bench(args)
    print(f"{'stages':>12} {'mapping':>26} {'measured':>9} {'alone':>9} {'err':>6} {'calibrated':>10} {'err':>6}")
    for r in result["rows"]:
        print(f"{r['stages']:>12} {r['mapping']:>26} {r['measured_ms']:9.2f} {r['predicted_alone_ms']:9.2f} "
              f"{r['error_alone']:6.1%} {r['predicted_calibrated_ms']:10.2f} {r['error_calibrated']:6.1%}")
    print(f"MAPE: alone {result['mape']['alone']:.1%}, calibrated (leave one out) {result['mape']['calibrated']:.1%}; "
          f"per stage set {json.dumps(result['mape_per_stage_set'])}")
    print(f"fitted on all: {result['fitted_on_all']}; load average {result['load_average_before'][0]:.1f} -> "
          f"{result['load_average_after'][0]:.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    if args.keep:
        hardware = load_hardware("this-machine")
        path = costs_file(settings().cache.map_dir, hardware)
        write_costs(path, KeptCosts(RuntimeCosts(**result["fitted_on_all"]), hardware.name,
                                    f"bench/mapper_accuracy.py, {len(result['rows'])} mappings of {result['model']}",
                                    len(result["rows"]), result["mape_fitted_on_all"]))
        print(f"kept the costs fitted on all mappings for later searches on this machine: {path}")


if __name__ == "__main__":
    main()
