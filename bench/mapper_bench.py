"""Map-and-Conquer on this machine: plain onnxruntime vs stages mapped on two CPU groups.

    python bench/mapper_bench.py [--models multiexit,lane,pedestrian,depth] [--frames N]
                                 [--calibration N] [--size HxW] [--json FILE]

Per model, over synthetic road scenes of mixed difficulty (commands/map_inputs.py), in one
process with frames interleaved across the configurations (so load on the machine hits them
alike): (a) plain onnxruntime, 2 threads; (b) the whole model as one stage on one group (one pinned
thread); (c) the depth-wise stages (the model's own exits) over both groups with early exit;
(d) a width split (2 stages, P = 0.5/0.5, no reuse, probe exits) over both groups, where the
model's width can be split; (e) the depth-wise stages with early exit on one group of both cores
(two threads per stage, one after the other). Each row: mean and p95 latency, the exit histogram, and the share of
frames whose answer agrees with the full model's final output.

The exit threshold is chosen on separate calibration scenes: the lowest confidence at which the
frames that would exit early agree with the final output on >= 99 % of them (none: never early).
Agreement per task: classifier — same argmax; lane — >= 99 % of mask pixels (p >= 0.5) equal;
pedestrian — the same number of boxes; depth — mean relative difference < 10 %.
"""
from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from dynnet_ros.commands.map_inputs import scene_feeds
from dynnet_ros.mapper.build import build_stages
from dynnet_ros.mapper.mapping import parse_mapping
from dynnet_ros.mapper.partition import Partition, parse_partition
from dynnet_ros.mapper.runtime import StageExecutor
from dynnet_ros.mapper.stages import StageSet
from dynnet_ros.mapper.width import run_chain
from dynnet_ros.zoo import ensure_model

TARGET_AGREEMENT = 0.99
Outputs = Mapping[str, np.ndarray]


def _agrees(model: str) -> Callable[[Outputs, Outputs], bool]:
    if model == "lane":
        return lambda got, ref: float(np.mean((got["lane_prob"] >= 0.5) == (ref["lane_prob"] >= 0.5))) >= 0.99
    if model == "pedestrian":
        return lambda got, ref: len(got["scores"]) == len(ref["scores"])
    if model == "depth":
        return lambda got, ref: float(np.mean(np.abs(got["depth"] - ref["depth"]) / ref["depth"])) < 0.10
    return lambda got, ref: all(int(np.argmax(got[k])) == int(np.argmax(ref[k])) for k in ref)


def _session(model: onnx.ModelProto, threads: int) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def choose_threshold(stage_set: StageSet, frames: list[dict], agrees) -> float | None:
    """The lowest exit-0 confidence at which early answers agree on >= 99 % of calibration frames."""
    sessions = [_session(s.model, 1) for s in stage_set.stages]
    early = stage_set.stages[0].exit
    final = stage_set.final_outputs
    rows = []
    for feed in frames:
        values = run_chain(stage_set, sessions, feed)
        confidence = early.confidence(values)
        if early.answer == "empty":
            answer = {name: np.zeros((0,) + values[name].shape[1:], values[name].dtype) for name in final}
        else:
            answer = {name: values[src] for name, src in zip(final, early.outputs)}
        rows.append((confidence, agrees(answer, {name: values[name] for name in final})))
    for threshold in sorted({c for c, _ in rows}):
        taken = [ok for c, ok in rows if c >= threshold]
        if taken and sum(taken) / len(taken) >= TARGET_AGREEMENT:
            return float(threshold)
    return None


def bench_model(name: str, frames: int, calibration: int, height: int, width: int) -> dict:
    model = onnx.load(ensure_model(name))
    outputs = [o.name for o in model.graph.output]
    feeds = list(scene_feeds(model, calibration + frames, height, width))
    calib, tests = feeds[:calibration], feeds[calibration:]
    agrees = _agrees(name)
    full = _session(model, 2)
    depth = build_stages(model, Partition())
    finals = list(depth.final_outputs)   # the answer's names (multiexit: its last exit)
    threshold = choose_threshold(depth, calib, agrees)
    never = 2.0   # above every confidence: the early exit never answers
    configs: dict[str, StageExecutor | None] = {"a_ort_2_threads": None}
    configs["b_one_group"] = StageExecutor(build_stages(model, Partition(exits=({"outputs": outputs},))),
                                           parse_mapping({"stages": ["cpu0"]}))
    stages = [{"unit": "cpu0" if i % 2 == 0 else "cpu1", "threshold": never if threshold is None else threshold}
              for i in range(len(depth.stages))]
    stages[-1].pop("threshold")
    configs["c_depth_early_exit"] = StageExecutor(depth, parse_mapping({"stages": stages}))
    whole = [dict(stage, unit="cpu0") for stage in stages]
    configs["e_early_exit_one_2core_group"] = StageExecutor(depth, parse_mapping({"hardware": "this-machine:1",
                                                                                  "stages": whole}))
    width_note = None
    try:
        split = build_stages(model, parse_partition({"width": {"stages": 2, "P": [0.5, 0.5], "I": [0, 0]}}), calib)
        width_threshold = choose_threshold(split, calib, agrees)
        configs["d_width_split"] = StageExecutor(split, parse_mapping({"stages": [
            {"unit": "cpu0", "threshold": never if width_threshold is None else width_threshold}, "cpu1"]}))
        width_note = {"threshold": width_threshold, "calibration_agreement": split.notes.get("agreement")}
    except ValueError as exc:
        width_note = {"not_split": str(exc)}
    reference = [dict(zip(finals, full.run(finals, f))) for f in tests]
    times: dict[str, list[float]] = {k: [] for k in configs}
    exits: dict[str, list[int]] = {k: [] for k in configs}
    agree = {k: 0 for k in configs}
    for executor in configs.values():
        if executor is None:
            full.run(finals, tests[0])
        else:
            executor.run(tests[0])
            executor.reset_counters()
    for index, feed in enumerate(tests):
        for key, executor in configs.items():
            start = time.perf_counter()
            if executor is None:
                answer = dict(zip(finals, full.run(finals, feed)))
                taken = len(depth.stages) - 1
            else:
                answer = executor.run(feed)
                taken = executor.last_result.exit_index if executor.last_result else -1
            times[key].append((time.perf_counter() - start) * 1e3)
            exits[key].append(taken)
            agree[key] += int(agrees(answer, reference[index]))
    busy = {}
    for key, executor in configs.items():
        if executor is not None:
            busy[key] = executor.busy_fractions()
            executor.close()
    rows: dict[str, dict[str, Any]] = {}
    for key in configs:
        t = np.array(times[key])
        rows[key] = {"mean_ms": round(float(t.mean()), 2), "p95_ms": round(float(np.percentile(t, 95)), 2),
                     "exit_histogram": {str(k): exits[key].count(k) for k in sorted(set(exits[key]))},
                     "final_agreement": round(agree[key] / len(tests), 4), "busy_fraction": busy.get(key)}
    base = rows["a_ort_2_threads"]["mean_ms"]
    for row in rows.values():
        row["speedup_vs_a"] = round(base / row["mean_ms"], 3)
    return {"model": name, "frames": len(tests), "calibration_frames": len(calib), "threshold": threshold,
            "width": width_note, "configs": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="multiexit,lane,pedestrian,depth")
    parser.add_argument("--frames", type=int, default=24)
    parser.add_argument("--calibration", type=int, default=24)
    parser.add_argument("--size", default="224x320")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    height, width = (int(v) for v in args.size.split("x"))
    results = []
    for name in args.models.split(","):
        result = bench_model(name, args.frames, args.calibration, height, width)
        results.append(result)
        print(json.dumps(result, indent=1), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"size": args.size, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
