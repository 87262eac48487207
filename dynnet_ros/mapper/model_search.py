"""From a multi-exit model to a StageSpace: calibration exits, stage costs, and the mapping file.

Why separate from ``search``: the search is model-agnostic; this module binds it to the stage
graph (``stages.depth_stages``), the profile (``profiler``), the cost model (``surrogate``), the
DLA pre-screen (``engine.backends.trt_dla``) and the runtime's mapping file (``mapping``).
"""
from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import onnxruntime as ort

from dynnet_ros.engine.backends.trt_dla import MAX_LOADABLES_PER_CORE, NO_OPS, count_loadables, op_verdicts
from dynnet_ros.mapper.hardware import Hardware
from dynnet_ros.mapper.mapping import StageAssignment, StageMapping
from dynnet_ros.mapper.partition import Partition, WidthSpec, parse_partition
from dynnet_ros.mapper.profile_io import Profile
from dynnet_ros.mapper.profiler import MEASURED_OPS, node_features, shapes_at, stage_row_name
from dynnet_ros.mapper.runtime import StageExecutor
from dynnet_ros.mapper.search import Candidate, ExitTable, StageCosts, StageSpace
from dynnet_ros.mapper.stages import StageSet
from dynnet_ros.mapper.surrogate import LayerFeatures, Surrogate, samples_from_profile
from dynnet_ros.mapper.system_model import RuntimeCosts

#: Least share of a stage's layers that must pass the DLA pre-screen to map it to a DLA (the rest
#: falls back to the GPU), as the TensorRT backend's own placement rule.
MIN_DLA_FRACTION = 0.5


@dataclass(frozen=True)
class Calibration:
    """What the calibration frames tell the search: exits, and the bytes each stage hands on."""

    exits: ExitTable
    out_bytes: tuple[int, ...]


def calibrate(stage_set: StageSet, frames: Sequence[Mapping[str, np.ndarray]],
              labels: Sequence[int] | None = None,
              agree: Callable[[np.ndarray, np.ndarray], bool] | None = None) -> Calibration:
    """Run every stage on every frame (in order, onnxruntime) and record each exit's confidence
    and whether its argmax matches the final exit's (or the label); with ``agree`` (an exit's
    answer, the final output -> whether it stands for it: learned exits' own rule), that instead."""
    if not frames:
        raise ValueError("no calibration frames")
    sessions = [ort.InferenceSession(s.model.SerializeToString(), providers=["CPUExecutionProvider"])
                for s in stage_set.stages]
    confidence, answers, agreed = [], [], []
    handed = [0] * len(stage_set.stages)
    final = stage_set.final_outputs[0]
    for feeds in frames:
        values: dict[str, np.ndarray] = dict(feeds)
        row_conf, row_answer = [], []
        for k, (stage, session) in enumerate(zip(stage_set.stages, sessions)):
            names = [o.name for o in session.get_outputs()]
            values.update(zip(names, session.run(names, {n: values[n] for n in stage.inputs})))
            row_conf.append(stage.exit.confidence(values))
            row_answer.append(int(np.argmax(values[stage.exit.outputs[0]])))
            handed[k] = max(handed[k], sum(values[n].nbytes for n in stage.outputs if n not in stage.exit.tensors))
        confidence.append(row_conf)
        answers.append(row_answer)
        if agree is not None:
            agreed.append([agree(values[stage.exit.outputs[0]], values[final]) for stage in stage_set.stages])
    if agree is not None:
        return Calibration(ExitTable(np.array(confidence, dtype=float), np.array(agreed, dtype=bool)), tuple(handed))
    answer = np.array(answers)
    reference = answer[:, -1] if labels is None else np.asarray(labels)
    if len(reference) != len(answer):
        raise ValueError(f"{len(reference)} labels for {len(answer)} calibration frames")
    return Calibration(ExitTable(np.array(confidence, dtype=float), answer == reference[:, None]), tuple(handed))


def dla_screen(stage_set: StageSet, feeds: Sequence[Mapping[str, np.ndarray]]) -> list[str | None]:
    """Per stage: None when a DLA may run it at these static shapes (the backend's pre-screen:
    enough layers DLA-capable, few enough loadables), else why not."""
    out: list[str | None] = []
    for stage, inputs in zip(stage_set.stages, feeds):
        shapes = {name: tuple(array.shape) for name, array in inputs.items()}
        verdicts = op_verdicts(stage.model, shapes)
        real = [v for v in verdicts if v.op_type not in NO_OPS]
        bad = [v for v in real if not v.supported]
        loadables = count_loadables(stage.model, verdicts)
        fraction = 1 - len(bad) / len(real) if real else 0.0
        if fraction < MIN_DLA_FRACTION:
            first = bad[0] if bad else None
            out.append(f"only {fraction:.0%} of its layers pass the DLA pre-screen"
                       + (f" (e.g. {first.node}: {first.why})" if first else ""))
        elif loadables > MAX_LOADABLES_PER_CORE:
            out.append(f"{loadables} DLA loadables (at most {MAX_LOADABLES_PER_CORE})")
        else:
            out.append(None)
    return out


def screened_units(stage_set: StageSet, stage_inputs: Sequence[Mapping[str, np.ndarray]], units: Sequence[str],
                   hardware: Hardware) -> tuple[tuple[tuple[str, ...], ...], dict[tuple[int, str], str]]:
    """Per stage, the ``units`` it may run on: each of them but a DLA that ``dla_screen`` rules out
    for the stage; and (stage, DLA) -> why not, for those."""
    screen = dla_screen(stage_set, stage_inputs)
    allowed: list[tuple[str, ...]] = []
    why_not: dict[tuple[int, str], str] = {}
    for k in range(len(stage_set.stages)):
        ok = []
        for name in units:
            if hardware.unit(name).kind == "dla" and screen[k] is not None:
                why_not[(k, name)] = str(screen[k])
            else:
                ok.append(name)
        allowed.append(tuple(ok))
    return tuple(allowed), why_not


def costs_of(stage_set: StageSet, calibration: Calibration, allowed: Sequence[tuple[str, ...]],
             why_not: Mapping[tuple[int, str], str], cost: Callable[[int, str, str], tuple[float, float]]
             ) -> StageCosts:
    """The search's StageCosts: the stage set's structure (names, earlier stages each reads,
    weights) and the calibration's output sizes, with where each stage may run and what it costs
    there, which the estimators (profile, measurement, simulation) differ in."""
    stages = stage_set.stages
    sources = tuple(tuple(sorted({src for src in s.sources.values() if src >= 0})) for s in stages)
    return StageCosts(tuple(f"stage{k}" for k in range(len(stages))), sources, calibration.out_bytes,
                      tuple(s.weight_bytes / 2**20 for s in stages), tuple(allowed), why_not, cost)


def fit_surrogate(profile: Profile, hardware: Hardware, seed: int = 0) -> Surrogate | None:
    """The cost model over every profile row that carries layer features (None: fewer than 5)."""
    rows = [m for m in profile.measurements if "flops" in m.features]
    if len(rows) < 5:
        return None
    model = Surrogate(hardware, seed=seed)
    model.fit(samples_from_profile(rows, hardware))
    return model


def stage_costs(stage_set: StageSet, profile: Profile, hardware: Hardware, size: str,
                calibration: Calibration, stage_inputs: Sequence[Mapping[str, np.ndarray]],
                surrogate: Surrogate | None) -> StageCosts:
    """StageCosts at input ``size``: a stage may go to a unit with a profile row for it (and, for a
    DLA, passing the pre-screen); its cost is the surrogate's (the measured row where it matches)."""
    rows = profile.lookup()
    screen = dla_screen(stage_set, stage_inputs)
    allowed: list[tuple[str, ...]] = []
    why_not: dict[tuple[int, str], str] = {}
    features: dict[tuple[int, str], LayerFeatures] = {}
    for k in range(len(stage_set.stages)):
        units = []
        for unit in hardware.units:
            row = next((m for (layer, u, _), m in rows.items()
                        if layer == stage_row_name(k, size) and u == unit.name), None)
            if row is None:
                why_not[(k, unit.name)] = f"no profile row {stage_row_name(k, size)} on {unit.name}"
            elif unit.kind == "dla" and screen[k] is not None:
                why_not[(k, unit.name)] = str(screen[k])
            else:
                units.append(unit.name)
                features[(k, unit.name)] = LayerFeatures.from_mapping(row.features, row.layer)
        allowed.append(tuple(units))

    table = {(layer, unit, dvfs): m for (layer, unit, dvfs), m in rows.items()}

    def cost(stage: int, unit: str, dvfs: str) -> tuple[float, float]:
        level = dvfs or hardware.unit(unit).default_dvfs
        if surrogate is not None:
            return surrogate.predict_one(features[(stage, unit)], unit, level)
        m = table[(stage_row_name(stage, size), unit, level)]
        return m.latency_ms, m.energy_mj(hardware)[0]

    return costs_of(stage_set, calibration, allowed, why_not, cost)


def to_mapping(candidate: Candidate, stage_set: StageSet, hardware: Hardware) -> StageMapping:
    """The runtime's mapping for a candidate (exits as the stage set was cut)."""
    levels = dict(candidate.dvfs)
    entries = []
    for k, (_, unit) in enumerate(candidate.assignment):
        last = k == len(candidate.assignment) - 1
        threshold = None if last else candidate.thresholds[k]
        if threshold is not None and math.isinf(threshold):
            threshold = 2.0   # above any confidence: this exit never stops a frame
        entries.append(StageAssignment(unit, levels.get(unit) or None, threshold))
    if candidate.partition is not None:
        return StageMapping(hardware, Partition(width=_spec_from_json(candidate.partition)), tuple(entries))
    exits = [s.exit.to_json() for s in stage_set.stages]
    return StageMapping(hardware, Partition(exits=tuple(exits)), tuple(entries))


def measure_mappings(runs: Sequence[tuple[StageSet, StageMapping]], frames: Sequence[Mapping[str, np.ndarray]],
                     rounds: int = 5) -> list[dict[str, Any]]:
    """Latency and exit histogram of each (stages, mapping) in the stage runtime over ``frames``.

    Each round runs every mapping over all frames in turn (after one warm-up frame, so its
    weights are in the caches as in a node that runs one mapping), the order rotating between
    rounds, so a change in the machine's load falls on all of them alike. ``mean_ms``: over every
    run; ``min_ms``: the mean over frames of each frame's fastest round — what the machine's load
    added least to, the figure to compare a prediction with."""
    executors = []
    try:
        for stage_set, mapping in runs:
            executors.append(StageExecutor(stage_set, mapping))
        latencies: list[list[float]] = [[] for _ in runs]
        best = np.full((len(runs), len(frames)), np.inf)
        exits: list[list[int]] = [[] for _ in runs]
        for round_ in range(rounds):
            for i in [(round_ + k) % len(runs) for k in range(len(runs))]:
                executor = executors[i]
                executor.run(frames[-1])
                for f, feeds in enumerate(frames):
                    began = time.perf_counter()
                    executor.run(feeds)
                    ms = (time.perf_counter() - began) * 1000.0
                    latencies[i].append(ms)
                    best[i, f] = min(best[i, f], ms)
                    assert executor.last_result is not None
                    exits[i].append(executor.last_result.exit_index)
    finally:
        for executor in executors:
            executor.close()
    out = []
    for (stage_set, _), times, taken, fastest in zip(runs, latencies, exits, best):
        counts = np.bincount(taken, minlength=len(stage_set.stages))
        out.append({"mean_ms": float(np.mean(times)), "min_ms": float(np.mean(fastest)),
                    "p95_ms": float(np.percentile(times, 95)), "exit_rates": (counts / counts.sum()).tolist(),
                    "frames": len(times)})
    return out


# ------------------------------------------------------------------------------------ width-wise
#: Channel shares a stage may get in a width split (the paper's discrete partitioning ratios).
SHARE_STEPS = 8


def split_layers(stage_set: StageSet) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """From a trial width split: (the first layer of every split channel space — P's rows, the
    Conv/Gemm layers whose input is split — I's rows)."""
    spaces = stage_set.notes.get("spaces", {})
    p_layers = tuple(name for name, info in spaces.items() if any(info["bounds"][1:-1]))
    last = stage_set.stages[-1]
    model_inputs = {name for name, src in last.sources.items() if src < 0}
    splits = [n for n in last.model.graph.node if n.op_type in ("Conv", "Gemm")]
    readers = []
    for node in splits[:-1]:          # the last is the head: it reads every stage's features anyway
        base = node.name.split("__")[0]
        if node.input[0] not in model_inputs and base not in readers:
            readers.append(base)
    return p_layers, tuple(readers)


def measured_costs(stage_set: StageSet, calibration: Calibration, stage_inputs: Sequence[Mapping[str, np.ndarray]],
                   hardware: Hardware, measured: Mapping[tuple[int, str], float], surrogate: Surrogate | None
                   ) -> StageCosts:
    """StageCosts of stages measured as wholes at their units' default levels (``measured``:
    (stage, unit) -> ms, e.g. ``profiler.measure_stages``); energy is the level's power × time. At
    another DVFS level the measurement is scaled by the surrogate's ratio for the stage's layers
    between that level and the default (the only part the model predicts)."""
    units = sorted({u for _, u in measured}, key=hardware.unit_names.index)
    per_stage: list[list[LayerFeatures]] = []
    for stage, inputs in zip(stage_set.stages, stage_inputs):
        shapes = shapes_at(stage.model, inputs)
        features = [node_features(n, shapes) for n in stage.model.graph.node if n.op_type in MEASURED_OPS]
        per_stage.append([f for f in features if f is not None])
    allowed, why_not = screened_units(stage_set, stage_inputs, units, hardware)

    def cost(stage: int, unit: str, dvfs: str) -> tuple[float, float]:
        default = hardware.unit(unit).default_dvfs
        level = dvfs or default
        latency = measured[(stage, unit)]
        if level != default and surrogate is not None and per_stage[stage]:
            at_level = surrogate.predict([(f, unit, level) for f in per_stage[stage]])[0].sum()
            at_default = surrogate.predict([(f, unit, default) for f in per_stage[stage]])[0].sum()
            latency *= float(at_level / at_default)
        return latency, latency * hardware.unit(unit).level(level).power_w

    return costs_of(stage_set, calibration, allowed, why_not, cost)


@dataclass
class WidthSpace:
    """The paper's full space: P (shares per layer, in eighths), I (reuse per reading layer and
    pair of stages), a unit per stage, DVFS levels and exit thresholds; each distinct (P, I) is
    built into stages (``width.width_stages``, linear-probe exits fitted on the calibration
    frames), calibrated and priced once (memoized).

    ``build(spec) -> (StageCosts, ExitTable)`` does the building; ``reuse_cap`` bounds the share
    of the reusable features (earlier stages' channels at each reading layer) that are reused."""

    hardware: Hardware
    p_layers: tuple[str, ...]
    i_layers: tuple[str, ...]
    stages: int
    build: Callable[[WidthSpec], tuple[StageCosts, ExitTable]]
    reuse_cap: float | None = None
    deadline_ms: float | None = None
    memory_mb: Mapping[str, float] = field(default_factory=dict)
    runtime: RuntimeCosts | None = None   # the stage runtime's fitted costs (None: the paper's model)

    def __post_init__(self) -> None:
        if self.stages < 2:
            raise ValueError("a width split needs >= 2 stages")
        if self.reuse_cap is not None and not 0 <= self.reuse_cap <= 1:
            raise ValueError(f"the feature-reuse cap must be in [0, 1], got {self.reuse_cap}")
        self._units = self.hardware.unit_names
        self._pairs = [(i, k) for i in range(self.stages) for k in range(i)]
        self._memo: dict[str, tuple[StageCosts, ExitTable]] = {}
        s, n_p, n_i = self.stages, len(self.p_layers), len(self.i_layers)
        self._offsets = (n_p * (s - 1), n_p * (s - 1) + n_i * len(self._pairs))
        self.n_var = self._offsets[1] + s + len(self._units) + (s - 1)

    # genes -> (P, I)
    def _shares(self, genes: np.ndarray) -> tuple[float, ...]:
        """S-1 cut genes -> S shares in eighths, each >= 1/8 (so no stage is empty)."""
        s = self.stages
        cuts = sorted(1 + int(g * (SHARE_STEPS - s + 1)) for g in genes)     # 1 .. SHARE_STEPS - s + 1
        points = [c + i for i, c in enumerate(cuts)]                         # strictly increasing
        edges = [0] + points + [SHARE_STEPS]
        return tuple((edges[i + 1] - edges[i]) / SHARE_STEPS for i in range(s))

    def _reuse_ratio(self, reads: Mapping[str, Any]) -> float:
        """Share of the (reading layer, earlier stage) feature maps that are reused."""
        possible = len(self.i_layers) * len(self._pairs)
        used = sum(int(reads[layer][i][k]) for layer in self.i_layers for i, k in self._pairs)
        return used / possible if possible else 0.0

    def spec(self, x: np.ndarray) -> WidthSpec:
        s = self.stages
        p = {layer: self._shares(x[j * (s - 1):(j + 1) * (s - 1)]) for j, layer in enumerate(self.p_layers)}
        reads = {}
        for j, layer in enumerate(self.i_layers):
            matrix = np.zeros((s, s), dtype=int)
            for q, (i, k) in enumerate(self._pairs):
                matrix[i, k] = int(x[self._offsets[0] + j * len(self._pairs) + q] >= 0.5)
            reads[layer] = matrix
        default = tuple([1.0 / s] * s)
        if self.reuse_cap is not None:
            for layer in reversed(self.i_layers):           # drop the deepest reuse first
                for i, k in reversed(self._pairs):
                    if self._reuse_ratio(reads) <= self.reuse_cap + 1e-12:
                        break
                    reads[layer][i, k] = 0
        zero = tuple(tuple(0 for _ in range(s)) for _ in range(s))
        return WidthSpec(s, default, p, zero, {k: tuple(tuple(int(v) for v in row) for row in m)
                                               for k, m in reads.items()})

    def _built(self, spec: WidthSpec) -> tuple[StageCosts, ExitTable]:
        key = json.dumps(spec.to_json(), sort_keys=True)
        if key not in self._memo:
            self._memo[key] = self.build(spec)
        return self._memo[key]

    def _inner(self, spec: WidthSpec) -> StageSpace:
        costs, exits = self._built(spec)
        return StageSpace(self.hardware, costs, exits, deadline_ms=self.deadline_ms, memory_mb=self.memory_mb,
                          distinct_units=True, runtime=self.runtime)

    def decode(self, x: np.ndarray) -> Candidate:
        spec = self.spec(x)
        inner = self._inner(spec)
        tail = np.concatenate([x[self._offsets[1]:], np.zeros(0)])
        candidate = inner.decode(tail)
        return replace(candidate, partition=json.dumps(spec.to_json(), sort_keys=True),
                       reuse=self._reuse_ratio(spec.reads_layers))

    def encode(self, candidate: Candidate) -> np.ndarray:
        spec = _spec_from_json(candidate.partition)
        x = np.zeros(self.n_var)
        s = self.stages
        for j, layer in enumerate(self.p_layers):
            shares = spec.fractions(layer)
            edges = np.cumsum([round(v * SHARE_STEPS) for v in shares])[:-1]
            for q, edge in enumerate(edges):
                cut = int(edge) - q                                  # 1 .. SHARE_STEPS - s + 1
                x[j * (s - 1) + q] = (cut - 1 + 0.5) / (SHARE_STEPS - s + 1)
        for j, layer in enumerate(self.i_layers):
            matrix = spec.reads(layer)
            for q, (i, k) in enumerate(self._pairs):
                x[self._offsets[0] + j * len(self._pairs) + q] = 0.75 if matrix[i][k] else 0.25
        x[self._offsets[1]:] = self._inner(spec).encode(candidate)
        return x

    def violations(self, candidate: Candidate) -> tuple[float, ...]:
        return self._inner(_spec_from_json(candidate.partition)).violations(candidate)

    def baselines(self) -> list[Candidate]:
        """The even split with no reuse on each unit alone is not a mapping (stages need distinct
        units to run side by side), so the baselines are the even split's best spread."""
        return []


def _spec_from_json(text: str | None) -> WidthSpec:
    if text is None:
        raise ValueError("a width candidate without its partition")
    spec = parse_partition({"width": json.loads(text)}).width
    assert spec is not None
    return spec
