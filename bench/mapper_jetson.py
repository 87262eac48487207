"""SIMULATED Jetson AGX Xavier / Orin: the search's pick vs GPU-only and DLA-only (the paper's comparison).

    python bench/mapper_jetson.py [--models multiexit,lane] [--size 224x320] [--frames 16]
                                  [--generations 30] [--population 40] [--json FILE]

No board is involved: stage costs come from ``mapper/simulate.py`` (the hardware file's peak
throughput, power and exchange costs per unit and DVFS level over each stage's layers, DLA
restrictions from the DLA pre-screen with GPU fallback). Exit rates and accuracy come from running
the model's exits on synthetic road scenes (onnxruntime, this machine). Per board and model: the
NSGA-II picks (balanced and latency rules, accuracy drop <= 1 %), GPU-only and DLA-only (each at its default level,
no early exit; a stage the DLA pre-screen refuses stays on the GPU in DLA-only), and the ratios
the paper reports: energy of GPU-only / pick (paper: 2.1x) and latency of DLA-only / pick (1.7x).
"""
from __future__ import annotations

import argparse
import json
import math
from typing import Any

import onnx

from dynnet_ros.commands.map_inputs import scene_feeds
from dynnet_ros.mapper.hardware import load_hardware
from dynnet_ros.mapper.model_search import calibrate
from dynnet_ros.mapper.nsga import run_search
from dynnet_ros.mapper.profiler import stage_feeds
from dynnet_ros.mapper.search import NEVER, Candidate, StageSpace, pick
from dynnet_ros.mapper.simulate import simulated_costs
from dynnet_ros.mapper.stages import depth_stages
from dynnet_ros.zoo import ensure_model

PAPER = {"energy_gpu_only_over_pick": 2.1, "latency_dla_only_over_pick": 1.7}


def dla_only(space: StageSpace, dla: str) -> Candidate:
    """Every stage on ``dla`` where its pre-screen allows, else on the GPU; default levels, no early exit."""
    units = [dla if dla in allowed else "gpu" for allowed in space.stages.allowed]
    levels = {u: space.hardware.unit(u).default_dvfs for u in units}
    return space.score(units, levels, [NEVER] * (len(units) - 1), label=f"{dla}-only")


def bench(board: str, name: str, args: argparse.Namespace) -> dict[str, Any]:
    hardware = load_hardware(board)
    model = onnx.load(ensure_model(name))
    height, width = (int(v) for v in args.size.split("x"))
    frames = list(scene_feeds(model, args.frames, height, width))
    stage_set = depth_stages(model)
    calibration = calibrate(stage_set, frames)
    costs = simulated_costs(stage_set, calibration, stage_feeds(stage_set, frames[0]), hardware)
    space = StageSpace(hardware, costs, calibration.exits)
    result = run_search(space, generations=args.generations, population=args.population, seed=args.seed)
    gpu = next(b for b in result.baselines if b.label == "gpu-only")
    dla = dla_only(space, "dla0")
    picks = {}
    for prefer in ("balanced", "latency"):
        chosen = pick(result, prefer, 0.01, calibration.exits.base_accuracy)
        picks[prefer] = {"pick": chosen.to_json(), "energy_gpu_only_over_pick": gpu.energy_mj / chosen.energy_mj,
                         "latency_dla_only_over_pick": dla.latency_ms / chosen.latency_ms}
    return {"board": board, "model": name, "size": args.size, "simulated": True, "picks": picks,
            "gpu_only": gpu.to_json(), "dla_only": dla.to_json(),
            "dla_refused": {f"stage{k}": why for (k, unit), why in costs.why_not.items() if unit == "dla0"},
            "search": {"evaluated": result.evaluated, "feasible": result.feasible, "seconds": round(result.seconds, 2)}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--boards", default="jetson-agx-xavier,jetson-agx-orin")
    parser.add_argument("--models", default="multiexit,lane")
    parser.add_argument("--size", default="224x320")
    parser.add_argument("--frames", type=int, default=16)
    parser.add_argument("--generations", type=int, default=30)
    parser.add_argument("--population", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    rows = [bench(board, name, args) for board in args.boards.split(",") for name in args.models.split(",")]
    print("SIMULATED (hardware-file roofline, mapper/simulate.py); energies modelled")
    print(f"{'board':>18} {'model':>10} {'rule':>8} {'pick':>40} {'pick ms/mJ':>16} {'GPU-only ms/mJ':>16} "
          f"{'DLA-only ms/mJ':>16} {'E gpu/pick':>10} {'L dla/pick':>10}")
    for r in rows:
        g, d = r["gpu_only"], r["dla_only"]
        for rule, entry in r["picks"].items():
            p = entry["pick"]
            where = ",".join(f"{u}@{p['dvfs'][u]}" for u in dict.fromkeys(p["assignment"].values()))
            exits = "/".join(f"{x:.2f}" for x in p["exit_rates"])
            print(f"{r['board']:>18} {r['model']:>10} {rule:>8} {where + ' exits ' + exits:>40} "
                  f"{p['latency_ms']:7.3f}/{p['energy_mj']:7.2f} {g['latency_ms']:7.3f}/{g['energy_mj']:7.2f} "
                  f"{d['latency_ms']:7.3f}/{d['energy_mj']:7.2f} {entry['energy_gpu_only_over_pick']:9.2f}x "
                  f"{entry['latency_dla_only_over_pick']:9.2f}x")
    print(f"paper (measured on the boards): {PAPER['energy_gpu_only_over_pick']}x energy vs GPU-only, "
          f"{PAPER['latency_dla_only_over_pick']}x latency vs DLA-only")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"simulated": True, "paper": PAPER, "rows": rows}, f, indent=1,
                      default=lambda v: None if isinstance(v, float) and math.isinf(v) else v)


if __name__ == "__main__":
    main()
