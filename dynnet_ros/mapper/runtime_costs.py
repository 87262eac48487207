"""Predicting the stage runtime: part-level task graphs, part timings and fitted runtime costs.

Why: the system model prices stages measured alone, but the stage runtime (``runtime.py``) runs
each stage as its *parts* (cut before the layers that read earlier stages' features), hands every
part to its unit's worker thread, judges exits in Python and lets two CPU groups that share
memory bandwidth run side by side. So a prediction that matches the runtime

* builds the task graph from the runtime's own parts (``part_graph``): one task per part on its
  stage's unit, needing the parts that produce the tensors it reads, exits at each stage's last
  part;
* times those parts as the runtime runs them (``time_parts``: the runtime's pinned sessions,
  min of N runs, the same statistic the measurement of a mapping uses);
* adds what a part's time alone does not contain (``system_model.RuntimeCosts``): a per-task
  dispatch cost, a contention factor while two units run, a slowdown of the parts' own times and
  a handoff cost when a part reads another unit's output, fitted to a few measured mappings
  (``fit_runtime_costs``: least squared relative error, a grid of contention factors and linear
  least squares for the rest, so the fit is deterministic).
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from dynnet_ros.mapper.hardware import Hardware
from dynnet_ros.mapper.stages import Part, StageSet, stage_parts
from dynnet_ros.mapper.system_model import RuntimeCosts, Task, TaskGraph, schedule
from dynnet_ros.mapper.units import open_stage, pin_current_thread, plan_unit, trt_reason

#: Contention factors the fit tries.
CONTENTION_GRID = np.round(np.arange(1.0, 3.001, 0.05), 3)

#: (stage, part index, unit) -> ms of that part alone on that unit.
PartTimes = Mapping[tuple[int, int, str], float]


@dataclass(frozen=True)
class PartInfo:
    """What the graph needs of a stage set's parts: their tensors and the bytes they hand on."""

    parts: tuple[tuple[Part, ...], ...]                  # per stage, in run order
    out_bytes: Mapping[tuple[int, int], int]             # (stage, part) -> bytes other stages read from it


def part_info(stage_set: StageSet, feeds: Mapping[str, np.ndarray]) -> PartInfo:
    """The stages' parts and, from one frame run through them in order, the bytes each part's
    outputs hand to other stages."""
    parts = tuple(tuple(stage_parts(stage, stage_set.kind)) for stage in stage_set.stages)
    values: dict[str, np.ndarray] = dict(feeds)
    produced_by: dict[str, tuple[int, int]] = {}
    for k, stage_parts_ in enumerate(parts):
        for j, part in enumerate(stage_parts_):
            session = ort.InferenceSession(part.model.SerializeToString(), providers=["CPUExecutionProvider"])
            names = [o.name for o in session.get_outputs()]
            values.update(zip(names, session.run(names, {n: values[n] for n in part.inputs})))
            for name in names:
                produced_by.setdefault(name, (k, j))
    out_bytes: dict[tuple[int, int], int] = {}
    for k, stage_parts_ in enumerate(parts):
        for part in stage_parts_:
            for name in part.inputs:
                source = produced_by.get(name)
                if source is not None and source[0] != k:
                    out_bytes[source] = out_bytes.get(source, 0) + int(values[name].nbytes)
    return PartInfo(parts, out_bytes)


def part_graph(info: PartInfo, units: Sequence[str], part_ms: PartTimes, hardware: Hardware,
               dvfs: Mapping[str, str] | None = None) -> TaskGraph:
    """The runtime's task graph for stage k on ``units[k]``: a task per part in stage order
    (the order the runtime submits them), each needing the parts that produce what it reads (its
    own stage's earlier part included); energy is the unit level's power × time."""
    if len(units) != len(info.parts):
        raise ValueError(f"{len(units)} units for {len(info.parts)} stages")
    tasks: list[Task] = []
    exits: list[int] = []
    index_of: dict[tuple[int, int], int] = {}
    producer: dict[str, int] = {}
    for k, (parts, unit) in enumerate(zip(info.parts, units)):
        level = hardware.unit(unit).level((dvfs or {}).get(unit) or None)
        for j, part in enumerate(parts):
            key = (k, j, unit)
            if key not in part_ms:
                raise ValueError(f"no timing of stage {k} part {j} on {unit}")
            needs = tuple(sorted({producer[name] for name in part.inputs if name in producer}))
            ms = float(part_ms[key])
            index_of[(k, j)] = len(tasks)
            tasks.append(Task(k, f"stage{k}.{j}", unit, ms, ms * level.power_w, info.out_bytes.get((k, j), 0), needs))
            for name in part.outputs:
                producer.setdefault(name, index_of[(k, j)])
        exits.append(len(tasks) - 1)
    return TaskGraph(tuple(tasks), tuple(exits))


def time_parts(info: PartInfo, hardware: Hardware, units: Sequence[str], feeds: Mapping[str, np.ndarray],
               repeats: int = 5) -> dict[tuple[int, int, str], float]:
    """Min ms of every part on every unit in ``units`` over ``repeats`` runs (after one warm-up),
    the calling thread pinned as the runtime pins a unit's worker."""
    values: dict[str, np.ndarray] = dict(feeds)
    inputs: dict[tuple[int, int], dict[str, np.ndarray]] = {}
    for k, parts in enumerate(info.parts):
        for j, part in enumerate(parts):
            session = ort.InferenceSession(part.model.SerializeToString(), providers=["CPUExecutionProvider"])
            names = [o.name for o in session.get_outputs()]
            inputs[(k, j)] = {n: values[n] for n in part.inputs}
            values.update(zip(names, session.run(names, inputs[(k, j)])))
    dla_units = [u.name for u in hardware.units if u.kind == "dla"]
    reason = trt_reason() if any(hardware.unit(u).kind != "cpu" for u in units) else None
    plans = {u: plan_unit(hardware.unit(u), dla_units=dla_units, trt_reason=reason) for u in units}
    out: dict[tuple[int, int, str], float] = {}
    original = os.sched_getaffinity(threading.get_native_id())
    try:
        for unit, plan in plans.items():
            pin_current_thread(plan.cores)
            for (k, j), feed in inputs.items():
                runner = open_stage(info.parts[k][j].model, plan)
                try:
                    runner.run(feed)
                    best = float("inf")
                    for _ in range(repeats):
                        began = time.perf_counter()
                        runner.run(feed)
                        best = min(best, (time.perf_counter() - began) * 1000.0)
                finally:
                    runner.close()
                out[(k, j, unit)] = best
    finally:
        os.sched_setaffinity(threading.get_native_id(), original)
    return out


@dataclass(frozen=True)
class Observation:
    """One measured mapping: its task graph, the exit rates it ran with, its measured mean ms."""

    graph: TaskGraph
    exit_rates: tuple[float, ...]
    measured_ms: float


def predict(observation: Observation, hardware: Hardware, runtime: RuntimeCosts | None = None) -> float:
    """The system model's expected latency for an observation's graph and exit rates."""
    return float(np.asarray(observation.exit_rates) @ schedule(observation.graph, hardware, runtime).exit_latency())


def relative_errors(observations: Sequence[Observation], hardware: Hardware,
                    runtime: RuntimeCosts | None = None) -> np.ndarray:
    """|predicted - measured| / measured per observation."""
    return np.array([abs(predict(o, hardware, runtime) - o.measured_ms) / o.measured_ms for o in observations])


def fit_runtime_costs(observations: Sequence[Observation], hardware: Hardware,
                      contention: Sequence[float] | None = None, slowdown: bool = True) -> RuntimeCosts:
    """The runtime costs that minimise the squared relative error of the predictions over
    ``observations``. For each contention factor (``CONTENTION_GRID``, or ``contention``:
    ``[1.0]`` when no observation runs two units at once), a prediction is linear in the slowdown
    s, the dispatch cost d and the handoff cost h while its critical path stays put —
    L = a + b s + c d + e h, the coefficients read off four schedules — so (s, d, h) is a linear
    least-squares solution (d, h >= 0; s fixed at 1 without ``slowdown``); the factor whose exact
    predictions err least wins. Deterministic; ValueError without observations."""
    if not observations:
        raise ValueError("no measured mappings to fit the runtime costs to")
    factors = CONTENTION_GRID if contention is None else np.asarray(contention, dtype=float)
    measured = np.array([o.measured_ms for o in observations])
    best = (float("inf"), RuntimeCosts())
    for factor in (float(f) for f in factors):
        def at(runtime: RuntimeCosts) -> np.ndarray:
            return np.array([predict(o, hardware, runtime) for o in observations])
        base = at(RuntimeCosts(0.0, factor))
        columns = np.stack([at(RuntimeCosts(0.0, factor, 2.0)) - base, at(RuntimeCosts(1.0, factor)) - base,
                            at(RuntimeCosts(0.0, factor, 1.0, 1.0)) - base], axis=1)
        intercept = base - columns[:, 0]
        s_fit, d_fit, h_fit = _relative_lstsq(intercept, columns, measured, slowdown)
        runtime = RuntimeCosts(d_fit, factor, s_fit, h_fit)
        loss = float((relative_errors(observations, hardware, runtime) ** 2).sum())
        if loss < best[0] - 1e-12:
            best = (loss, runtime)
    return best[1]


def _relative_lstsq(intercept: np.ndarray, columns: np.ndarray, measured: np.ndarray,
                    slowdown: bool) -> tuple[float, float, float]:
    """(s, d, h) minimising sum(((intercept + columns @ (s, d, h)) / m - 1)^2) with d, h >= 0 and
    s > 0 (s = 1 unless ``slowdown``): the least-error solution over the ways of holding the
    non-negative ones at zero."""
    target = 1.0 - intercept / measured
    scaled = columns / measured[:, None]
    best: tuple[float, tuple[float, float, float]] = (float("inf"), (1.0, 0.0, 0.0))
    for free_d, free_h in ((True, True), (True, False), (False, True), (False, False)):
        free = [slowdown, free_d, free_h]
        x = np.array([1.0, 0.0, 0.0])
        rest = target - scaled[:, 0] * (0.0 if slowdown else 1.0)
        index = [i for i, f in enumerate(free) if f]
        if index:
            solution, *_ = np.linalg.lstsq(scaled[:, index], rest, rcond=None)
            x[index] = solution
        if x[1] < 0 or x[2] < 0 or x[0] <= 0:
            continue
        error = float(((scaled @ x - target) ** 2).sum())
        if error < best[0]:
            best = (error, (float(x[0]), float(x[1]), float(x[2])))
    return best[1]


def contention_matters(observations: Sequence[Observation], hardware: Hardware) -> bool:
    """Whether any observation's prediction depends on the contention factor (some of its tasks
    on two units can run at once); without one, the factor cannot be fitted."""
    return any(abs(predict(o, hardware, RuntimeCosts(0.0, 2.0)) - predict(o, hardware)) > 1e-9 for o in observations)
