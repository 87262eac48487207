"""NSGA-II over mappings: which unit runs each stage (or layer group), at which DVFS level, with
which exit thresholds — a Pareto set of expected latency, energy and accuracy.

Why NSGA-II (pymoo): Map-and-Conquer's search is evolutionary and multi-objective (200 generations
× 60); pymoo's NSGA-II is the well-kept implementation. Every genome is a vector in [0, 1); a
*space* decodes it into a candidate that is valid by construction (each gene picks from the
choices its stage may take — a DLA only where the DLA pre-screen passes, a DVFS level the unit
has, a threshold among the exit's observed confidences) and repairs what the genes alone cannot
guarantee (stages moved off a unit whose memory they overflow). What still breaks a constraint
(the latency deadline, memory no move can fix) is a pymoo inequality constraint, and only
feasible candidates reach the result. Like the paper, the Pareto set is taken over *every*
candidate evaluated, not just the last population. The run is seeded and reproducible.

Two spaces:

* ``StageSpace``: the stages of a multi-exit model (``mapper.stages``), a unit and DVFS level
  per stage, a threshold per early exit; accuracy from a calibration set (``ExitTable``).
* ``ChainSpace``: a chain of layer groups measured on a board (profile CSV / trtexec) without
  the model: a unit per group (depth-wise), transitions where the unit changes.

The pick among the Pareto set follows a stated rule: ``latency`` (least expected latency),
``energy`` (least expected energy) or ``balanced`` (least latency/best-latency +
energy/best-energy), among candidates whose accuracy is within ``max_accuracy_drop`` of the
model's final exit.

The NSGA-II run itself (``run_search``) is in ``mapper.nsga``, so a node that picks among cached
candidates imports the spaces and rules here without pymoo's optimiser.
"""
from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from dynnet_ros.mapper.hardware import Hardware
from dynnet_ros.mapper.profile_io import Profile
from dynnet_ros.mapper.system_model import RuntimeCosts, Task, TaskGraph, chain_graph, evaluate

PREFER: tuple[str, ...] = ("latency", "energy", "balanced")
#: Threshold choices per early exit: this many quantiles of its calibration confidences, plus "never".
THRESHOLD_LEVELS = 24
NEVER = math.inf


# ------------------------------------------------------------------------------------ candidates
@dataclass(frozen=True)
class Candidate:
    """One valid mapping and what the system model predicts for it."""

    assignment: tuple[tuple[str, str], ...]     # (stage or layer group, unit), in execution order
    dvfs: tuple[tuple[str, str], ...]           # (unit, level) of every unit used
    thresholds: tuple[float, ...] = ()          # per early exit (inf: never exits there)
    latency_ms: float = 0.0                     # expected over the exit rates
    energy_mj: float = 0.0
    accuracy: float = 1.0                       # agreement with the reference (final exit or labels)
    worst_latency_ms: float = 0.0               # a frame that runs to the last exit
    exit_rates: tuple[float, ...] = (1.0,)
    memory_mb: tuple[tuple[str, float], ...] = ()
    label: str = ""
    partition: str | None = None                # width split: the partition's JSON (P and I)
    reuse: float | None = None                  # width split: share of the reusable features reused

    def key(self) -> tuple:
        return (self.assignment, self.dvfs, self.thresholds, self.partition)

    def to_json(self) -> dict[str, Any]:
        return {"assignment": dict(self.assignment), "dvfs": dict(self.dvfs),
                "thresholds": [None if math.isinf(t) else round(t, 6) for t in self.thresholds],
                "latency_ms": round(self.latency_ms, 6), "energy_mj": round(self.energy_mj, 6),
                "accuracy": round(self.accuracy, 6), "worst_latency_ms": round(self.worst_latency_ms, 6),
                "exit_rates": [round(r, 6) for r in self.exit_rates],
                "memory_mb": {u: round(m, 3) for u, m in self.memory_mb},
                **({"label": self.label} if self.label else {}),
                **({"partition": {"width": json.loads(self.partition)}, "reuse": round(self.reuse or 0.0, 4)}
                   if self.partition is not None else {})}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Candidate:
        """The candidate ``to_json`` wrote (a cached search result); ValueError naming a bad field."""
        try:
            thresholds = tuple(NEVER if t is None else float(t) for t in data["thresholds"])
            width = data.get("partition", {}).get("width") if isinstance(data.get("partition"), Mapping) else None
            return cls(tuple((str(k), str(v)) for k, v in data["assignment"].items()),
                       tuple((str(k), str(v)) for k, v in data["dvfs"].items()), thresholds,
                       float(data["latency_ms"]), float(data["energy_mj"]), float(data["accuracy"]),
                       float(data["worst_latency_ms"]), tuple(float(r) for r in data["exit_rates"]),
                       tuple((str(u), float(m)) for u, m in data["memory_mb"].items()), str(data.get("label", "")),
                       None if width is None else json.dumps(width, sort_keys=True),
                       None if data.get("reuse") is None else float(data["reuse"]))
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise ValueError(f"not a search candidate ({type(exc).__name__}: {exc})") from None

    def memory_need(self, unit: str) -> float:
        """MB of stage weights this candidate puts on ``unit`` (0 for a unit it does not use)."""
        return dict(self.memory_mb).get(unit, 0.0)


class Space(Protocol):
    """A search space: genome length, decoding (valid by construction) and evaluation."""

    n_var: int

    def decode(self, x: np.ndarray) -> Candidate: ...

    def encode(self, candidate: Candidate) -> np.ndarray: ...

    def violations(self, candidate: Candidate) -> tuple[float, ...]: ...

    def baselines(self) -> list[Candidate]: ...


def _index(x: float, n: int) -> int:
    return min(n - 1, max(0, int(x * n)))


def _centre(i: int, n: int) -> float:
    return (i + 0.5) / n


# ------------------------------------------------------------------------------------ exits
@dataclass(frozen=True)
class ExitTable:
    """Per calibration frame and exit: the exit's confidence and whether its answer is right
    (agrees with the model's final exit, or with the label where labels are given)."""

    confidence: np.ndarray      # (frames, exits)
    correct: np.ndarray         # (frames, exits) bool

    def __post_init__(self) -> None:
        if self.confidence.ndim != 2 or self.confidence.shape != self.correct.shape or not len(self.confidence):
            raise ValueError("exit table: confidence and correct must be (frames, exits) arrays of one shape")

    @property
    def exits(self) -> int:
        return int(self.confidence.shape[1])

    @property
    def base_accuracy(self) -> float:
        """Accuracy of the final exit (1.0 when the reference is the final exit itself)."""
        return float(self.correct[:, -1].mean())

    def outcome(self, thresholds: Sequence[float]) -> tuple[np.ndarray, float]:
        """(exit rates, accuracy) when early exit s is taken at confidence >= thresholds[s]."""
        if len(thresholds) != self.exits - 1:
            raise ValueError(f"{len(thresholds)} thresholds for {self.exits - 1} early exits")
        frames = len(self.confidence)
        taken = np.full(frames, self.exits - 1)
        open_ = np.ones(frames, dtype=bool)
        for s, threshold in enumerate(thresholds):
            hit = open_ & (self.confidence[:, s] >= threshold)
            taken[hit] = s
            open_ &= ~hit
        rates = np.bincount(taken, minlength=self.exits) / frames
        return rates, float(self.correct[np.arange(frames), taken].mean())

    def threshold_choices(self, exit_index: int, levels: int = THRESHOLD_LEVELS) -> tuple[float, ...]:
        """Quantiles of an exit's confidences (distinct, ascending), then "never"."""
        values = np.quantile(self.confidence[:, exit_index], np.linspace(0.0, 1.0, levels))
        return tuple(float(v) for v in np.unique(values)) + (NEVER,)


# ------------------------------------------------------------------------------------ stage space
@dataclass(frozen=True)
class StageCosts:
    """What the search knows about each stage of a model."""

    names: tuple[str, ...]
    sources: tuple[tuple[int, ...], ...]          # per stage: earlier stages it reads
    out_bytes: tuple[int, ...]                    # per stage: bytes later stages read from it
    weight_mb: tuple[float, ...]
    allowed: tuple[tuple[str, ...], ...]          # per stage: units it may run on
    why_not: Mapping[tuple[int, str], str]        # (stage, unit) -> why it may not run there
    cost: Callable[[int, str, str], tuple[float, float]]   # (stage, unit, dvfs) -> (latency_ms, energy_mj)


@dataclass
class StageSpace:
    """Units, DVFS levels and exit thresholds for the stages of a multi-exit model."""

    hardware: Hardware
    stages: StageCosts
    exits: ExitTable
    deadline_ms: float | None = None
    memory_mb: Mapping[str, float] = field(default_factory=dict)   # per-unit limits (else the unit's own)
    accounting: str = "speculative"
    distinct_units: bool = False    # the paper's rule for width stages: no two stages on one unit
    runtime: RuntimeCosts | None = None   # the stage runtime's fitted costs (None: the paper's model)

    def __post_init__(self) -> None:
        count = len(self.stages.names)
        if self.exits.exits != count:
            raise ValueError(f"the calibration set has {self.exits.exits} exits, the model {count} stages")
        for s, allowed in enumerate(self.stages.allowed):
            if not allowed:
                raise ValueError(f"stage {s} may run on no unit of {self.hardware.name}: "
                                 + "; ".join(f"{u}: {why}" for (k, u), why in self.stages.why_not.items() if k == s))
        self._units = self.hardware.unit_names
        self._levels = [tuple(lv.name for lv in self.hardware.unit(u).dvfs) for u in self._units]
        self._thresholds = [self.exits.threshold_choices(s) for s in range(count - 1)]
        self.n_var = count + len(self._units) + count - 1

    def _limit(self, unit: str) -> float | None:
        return self.memory_mb.get(unit, self.hardware.unit(unit).memory_mb)

    def _repair_distinct(self, units: list[str]) -> list[str]:
        """A stage on a unit an earlier stage took moves to the first free unit it may use."""
        taken: set[str] = set()
        for s, unit in enumerate(units):
            if unit in taken:
                units[s] = next((u for u in self.stages.allowed[s] if u not in taken), unit)
            taken.add(units[s])
        return units

    def _repair_memory(self, units: list[str]) -> list[str]:
        """Move stages (heaviest first) off a unit over its memory to an allowed unit with room."""
        load: dict[str, float] = {}
        for s, unit in enumerate(units):
            load[unit] = load.get(unit, 0.0) + self.stages.weight_mb[s]
        for s in sorted(range(len(units)), key=lambda k: -self.stages.weight_mb[k]):
            unit = units[s]
            limit = self._limit(unit)
            if limit is None or load[unit] <= limit:
                continue
            for other in self.stages.allowed[s]:
                room = self._limit(other)
                if other != unit and (room is None or load.get(other, 0.0) + self.stages.weight_mb[s] <= room):
                    load[unit] -= self.stages.weight_mb[s]
                    load[other] = load.get(other, 0.0) + self.stages.weight_mb[s]
                    units[s] = other
                    break
        return units

    def decode(self, x: np.ndarray) -> Candidate:
        count = len(self.stages.names)
        units = [self.stages.allowed[s][_index(x[s], len(self.stages.allowed[s]))] for s in range(count)]
        if self.distinct_units:
            units = self._repair_distinct(units)
        units = self._repair_memory(units)
        levels = {u: self._levels[i][_index(x[count + i], len(self._levels[i]))] for i, u in enumerate(self._units)}
        thresholds = tuple(self._thresholds[s][_index(x[count + len(self._units) + s], len(self._thresholds[s]))]
                           for s in range(count - 1))
        return self.score(units, levels, thresholds)

    def graph(self, units: Sequence[str], levels: Mapping[str, str]) -> TaskGraph:
        """The task graph of one mapping: a task per stage on its unit, at its unit's level."""
        tasks = []
        for s, unit in enumerate(units):
            latency, energy = self.stages.cost(s, unit, levels.get(unit, ""))
            tasks.append(Task(s, self.stages.names[s], unit, latency, energy, self.stages.out_bytes[s],
                              self.stages.sources[s]))
        return TaskGraph(tuple(tasks), tuple(range(len(tasks))))

    def score(self, units: Sequence[str], levels: Mapping[str, str], thresholds: Sequence[float],
              label: str = "") -> Candidate:
        """The system model's prediction for one mapping."""
        graph = self.graph(units, levels)
        rates, accuracy = self.exits.outcome(thresholds)
        outcome = evaluate(graph, self.hardware, rates.tolist(), self.accounting, self.runtime)
        used = tuple(dict.fromkeys(units))
        memory: dict[str, float] = {}
        for s, unit in enumerate(units):
            memory[unit] = memory.get(unit, 0.0) + self.stages.weight_mb[s]
        return Candidate(tuple(zip(self.stages.names, units)), tuple((u, levels.get(u, "")) for u in used),
                         tuple(thresholds), outcome.latency_ms, outcome.energy_mj, accuracy,
                         outcome.exit_latency_ms[-1], tuple(float(r) for r in rates), tuple(memory.items()), label)

    def encode(self, candidate: Candidate) -> np.ndarray:
        count = len(self.stages.names)
        x = np.zeros(self.n_var)
        for s, (_, unit) in enumerate(candidate.assignment):
            x[s] = _centre(self.stages.allowed[s].index(unit), len(self.stages.allowed[s]))
        levels = dict(candidate.dvfs)
        for i, unit in enumerate(self._units):
            level = levels.get(unit, self.hardware.unit(unit).default_dvfs)
            x[count + i] = _centre(self._levels[i].index(level), len(self._levels[i]))
        for s, threshold in enumerate(candidate.thresholds):
            x[count + len(self._units) + s] = _centre(self._thresholds[s].index(threshold), len(self._thresholds[s]))
        return x

    def violations(self, candidate: Candidate) -> tuple[float, ...]:
        """<= 0 when satisfied: the deadline on a frame that runs to the last exit, each unit's memory."""
        deadline = candidate.worst_latency_ms - self.deadline_ms if self.deadline_ms is not None else -1.0
        over = max([load - limit for unit, load in candidate.memory_mb
                    if (limit := self._limit(unit)) is not None] + [-1.0])
        return (deadline, over)

    def baselines(self) -> list[Candidate]:
        """Every stage on one unit (each unit every stage may use), at its default level, no early exit."""
        count = len(self.stages.names)
        out = []
        for unit in self._units:
            if all(unit in allowed for allowed in self.stages.allowed):
                out.append(self.score([unit] * count, {unit: self.hardware.unit(unit).default_dvfs},
                                      [NEVER] * (count - 1), label=f"{unit}-only"))
        return out

    def static(self, candidate: Candidate) -> Candidate:
        """The same mapping without early exits (the static split)."""
        return self.score([u for _, u in candidate.assignment], dict(candidate.dvfs),
                          [NEVER] * (len(self.stages.names) - 1), label="static-split")


# ------------------------------------------------------------------------------------ chain space
@dataclass
class ChainSpace:
    """Depth-wise assignment of a measured chain of layer groups to units (no model needed).

    A group may go to a unit that has a measurement for it (at the unit's chosen DVFS level);
    consecutive groups on different units pay the first group's measured ``transition_ms``, else
    the hardware file's exchange latency (the profile holds no tensor sizes). Energy: measured power
    × time where the profile has it, else the hardware file's power (modelled)."""

    hardware: Hardware
    profile: Profile
    deadline_ms: float | None = None
    accounting: str = "oracle"
    runtime: RuntimeCosts | None = None   # runtime costs on top of the measured groups (None: none)

    def __post_init__(self) -> None:
        self._layers = self.profile.layers
        rows = self.profile.lookup()
        self._rows = rows
        units = [u for u in self.hardware.unit_names if u in self.profile.units]
        if not units:
            raise ValueError(f"the profile's units ({', '.join(self.profile.units)}) are not in hardware "
                             f"{self.hardware.name} ({', '.join(self.hardware.unit_names)})")
        # a DVFS level of a unit is usable when the unit has every one of its measured groups at it
        self._levels: dict[str, tuple[str, ...]] = {}
        self._runs: dict[str, set[str]] = {}
        for unit in units:
            measured = {(m.layer, m.dvfs) for m in self.profile.measurements if m.unit == unit}
            layers = {layer for layer, _ in measured}
            levels = sorted({d for _, d in measured}, key=lambda d: d or "")
            full = tuple(d for d in levels if all((layer, d) in measured for layer in layers))
            if full:
                self._levels[unit] = full
                self._runs[unit] = layers
        self._units = tuple(self._levels)
        self._allowed = []
        for layer in self._layers:
            allowed = tuple(u for u in self._units if layer in self._runs[u])
            if not allowed:
                raise ValueError(f"layer group {layer!r} has no unit measured at a complete DVFS level")
            self._allowed.append(allowed)
        self.n_var = len(self._layers) + len(self._units)

    def decode(self, x: np.ndarray) -> Candidate:
        n = len(self._layers)
        units = [self._allowed[j][_index(x[j], len(self._allowed[j]))] for j in range(n)]
        levels = {u: self._levels[u][_index(x[n + i], len(self._levels[u]))] for i, u in enumerate(self._units)}
        return self.score(units, levels)

    def score(self, units: Sequence[str], levels: Mapping[str, str], label: str = "") -> Candidate:
        costs = []
        for layer, unit in zip(self._layers, units):
            m = self._rows[(layer, unit, levels[unit])]
            energy, _ = m.energy_mj(self.hardware)
            costs.append((layer, unit, m.latency_ms, energy, 0, m.transition_ms))
        graph = chain_graph(costs)
        outcome = evaluate(graph, self.hardware, [1.0], self.accounting, self.runtime)
        used = tuple(dict.fromkeys(units))
        return Candidate(tuple(zip(self._layers, units)), tuple((u, levels[u]) for u in used), (),
                         outcome.latency_ms, outcome.energy_mj, 1.0, outcome.latency_ms, (1.0,), (), label)

    def encode(self, candidate: Candidate) -> np.ndarray:
        n = len(self._layers)
        x = np.zeros(self.n_var)
        for j, (_, unit) in enumerate(candidate.assignment):
            x[j] = _centre(self._allowed[j].index(unit), len(self._allowed[j]))
        levels = dict(candidate.dvfs)
        for i, unit in enumerate(self._units):
            level = levels.get(unit, self._levels[unit][0])
            x[n + i] = _centre(self._levels[unit].index(level), len(self._levels[unit]))
        return x

    def violations(self, candidate: Candidate) -> tuple[float, ...]:
        return (candidate.latency_ms - self.deadline_ms if self.deadline_ms is not None else -1.0,)

    def baselines(self) -> list[Candidate]:
        """Every group on one unit, for each unit measured on every group (its first complete level)."""
        out = []
        for unit in self._units:
            if all(unit in allowed for allowed in self._allowed):
                default = self.hardware.unit(unit).default_dvfs
                level = default if default in self._levels[unit] else self._levels[unit][0]
                out.append(self.score([unit] * len(self._layers), {unit: level}, label=f"{unit}-only"))
        return out


@dataclass(frozen=True)
class SearchResult:
    pareto: tuple[Candidate, ...]          # feasible, non-dominated over every evaluated candidate
    baselines: tuple[Candidate, ...]
    evaluated: int
    feasible: int
    seconds: float
    generations: int
    population: int
    seed: int
    everything: tuple[Candidate, ...] = ()  # every feasible candidate evaluated (for the plot)


def pareto_front(candidates: Sequence[Candidate]) -> list[Candidate]:
    """The non-dominated candidates under (latency, energy, -accuracy), in latency order."""
    if not candidates:
        return []
    # pymoo: the mapper's search stack, which a node serving a mapping never needs to load
    from pymoo.util.nds.non_dominated_sorting import NonDominatedSorting
    f = np.array([(c.latency_ms, c.energy_mj, -c.accuracy) for c in candidates])
    front = NonDominatedSorting().do(f, only_non_dominated_front=True)
    distinct: dict[tuple, Candidate] = {}   # one candidate per point: equal objectives are one choice
    for i in sorted(front):
        distinct.setdefault(tuple(np.round(f[i], 9)), candidates[i])
    return sorted(distinct.values(), key=lambda c: (c.latency_ms, c.energy_mj))


def pick(result: SearchResult, prefer: str = "balanced", max_accuracy_drop: float = 0.01,
         base_accuracy: float = 1.0) -> Candidate:
    """The Pareto candidate the rule chooses (module docstring); ValueError when none qualifies."""
    if not result.pareto:
        raise ValueError(f"no candidate meets every constraint ({result.evaluated} evaluated); relax the "
                         "deadline or the memory limits")
    return choose(result.pareto, prefer, max_accuracy_drop, base_accuracy)


def choose(pareto: Sequence[Candidate], prefer: str = "balanced", max_accuracy_drop: float = 0.01,
           base_accuracy: float = 1.0) -> Candidate:
    """The candidate of a non-empty Pareto set the rule chooses; ValueError when none qualifies."""
    if prefer not in PREFER:
        raise ValueError(f"--prefer must be one of {', '.join(PREFER)}, got {prefer!r}")
    allowed = [c for c in pareto if base_accuracy - c.accuracy <= max_accuracy_drop + 1e-12]
    if not allowed:
        best = max(c.accuracy for c in pareto)
        raise ValueError(f"no Pareto candidate within {max_accuracy_drop:.1%} of the final exit's accuracy "
                         f"({base_accuracy:.1%}); the best reaches {best:.1%}")
    if prefer == "latency":
        return min(allowed, key=lambda c: (c.latency_ms, c.energy_mj))
    if prefer == "energy":
        return min(allowed, key=lambda c: (c.energy_mj, c.latency_ms))
    lat = min(c.latency_ms for c in allowed)
    en = min(c.energy_mj for c in allowed)
    return min(allowed, key=lambda c: (c.latency_ms / lat + c.energy_mj / en, c.latency_ms))
