"""A model search's result kept for later picks: re-choosing a mapping under a new budget is a
lookup over stored candidates, never a new search.

Why a set wider than the Pareto front: the front is non-dominated in (latency, energy,
accuracy) only, so a candidate that is slower but needs less of a unit's memory may be missing
from it — exactly the one a shrunken memory budget calls for. The cache keeps every evaluated
candidate that no other beats on those three *and* on the worst-case latency (the deadline's
measure) *and* on the memory it needs on each unit (``covering_set``). For any per-unit memory
limits and deadline, the best candidate under the pick rule among everything the search
evaluated is then one of the stored ones: a candidate left out is beaten on every one of those
measures by a stored one, which fits the same limits and is no worse under any rule.

A cache file is JSON under ``DYNNET_MAP_DIR``, one per model digest + hardware description
(``cache_file``): ``dynnet map search MODEL --hw SPEC`` writes it (depth-wise searches), and a
node with ``mapping: auto`` reads it (docs/mapper.md, "mapping: auto"). The newest search of a
model on a hardware replaces the older one.
"""
from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .advice import one_stage_guard
from .cache_files import read_json, write_json_atomic
from .hardware import Hardware
from .search import PREFER, Candidate, choose, pareto_front

CACHE_VERSION = 1


@dataclass(frozen=True)
class Constraints:
    """What a pick must respect: per-unit memory (MB of stage weights), the latency of a frame
    that runs to the last exit, and the rule (``search.choose``)."""

    unit_memory_mb: Mapping[str, float] = field(default_factory=dict)
    deadline_ms: float | None = None
    prefer: str = "balanced"
    max_accuracy_drop: float = 0.01
    #: keep the rule's choice even where one stage on the fastest unit is faster (``advice.one_stage_guard``)
    allow_slower_than_one_stage: bool = False

    def __post_init__(self) -> None:
        if self.prefer not in PREFER:
            raise ValueError(f"prefer must be one of {', '.join(PREFER)}, got {self.prefer!r}")
        if not 0 <= self.max_accuracy_drop <= 1:
            raise ValueError(f"max_accuracy_drop must be in [0, 1], got {self.max_accuracy_drop!r}")
        if self.deadline_ms is not None and not 0 < self.deadline_ms < math.inf:
            raise ValueError(f"deadline_ms must be a positive number, got {self.deadline_ms!r}")
        for unit, mb in self.unit_memory_mb.items():
            if isinstance(mb, bool) or not isinstance(mb, (int, float)) or not 0 <= mb < math.inf:
                raise ValueError(f"memory limit of {unit}: expected a finite number of MB >= 0, got {mb!r}")

    def describe(self) -> str:
        limits = ", ".join(f"{u} <= {mb:g} MB" for u, mb in sorted(self.unit_memory_mb.items()))
        parts = [f"prefer {self.prefer}", f"accuracy drop <= {self.max_accuracy_drop:g}"]
        if self.deadline_ms is not None:
            parts.append(f"deadline {self.deadline_ms:g} ms")
        if limits:
            parts.append(limits)
        return ", ".join(parts)


@dataclass(frozen=True)
class SearchChoices:
    """The stored candidates of one model search and what they were searched under."""

    model_digest: str
    hardware: str                  # the hardware description's name
    size: str                      # the input size the costs were predicted at ("HxW")
    base_accuracy: float           # the final exit's accuracy on the calibration set
    rule: Constraints              # the search's own rule, deadline and memory limits
    candidates: tuple[Candidate, ...]
    pick: Candidate | None = None  # what the search itself picked under ``rule``
    #: the runtime costs the candidates were predicted with (``runtime_cache.SearchCosts.to_json``)
    runtime_costs: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        if not self.candidates:
            raise ValueError("a search result without candidates")

    def to_json(self) -> dict[str, Any]:
        return {"version": CACHE_VERSION, "model_digest": self.model_digest, "hardware": self.hardware,
                "size": self.size, "base_accuracy": self.base_accuracy,
                "rule": {"prefer": self.rule.prefer, "max_accuracy_drop": self.rule.max_accuracy_drop,
                         "deadline_ms": self.rule.deadline_ms, "memory_mb": dict(self.rule.unit_memory_mb),
                         "allow_slower_than_one_stage": self.rule.allow_slower_than_one_stage},
                "pick": None if self.pick is None else self.pick.to_json(),
                **({} if self.runtime_costs is None else {"runtime_costs": dict(self.runtime_costs)}),
                "candidates": [c.to_json() for c in self.candidates]}

    @classmethod
    def from_json(cls, data: Any, source: str = "<memory>") -> SearchChoices:
        where = f"search cache {source}"
        if not isinstance(data, Mapping) or data.get("version") != CACHE_VERSION:
            raise ValueError(f"{where}: not a version-{CACHE_VERSION} search result; run the search again")
        try:
            rule = data["rule"]
            constraints = Constraints(dict(rule["memory_mb"]), rule["deadline_ms"], rule["prefer"],
                                      float(rule["max_accuracy_drop"]),
                                      bool(rule.get("allow_slower_than_one_stage", False)))
            candidates = tuple(Candidate.from_json(c) for c in data["candidates"])
            chosen = None if data.get("pick") is None else Candidate.from_json(data["pick"])
            costs = data.get("runtime_costs")
            if costs is not None and not isinstance(costs, Mapping):
                raise ValueError(f"runtime_costs: expected an object, got {costs!r}")
            return cls(str(data["model_digest"]), str(data["hardware"]), str(data["size"]),
                       float(data["base_accuracy"]), constraints, candidates, chosen,
                       None if costs is None else dict(costs))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{where}: {exc}") from None


@dataclass(frozen=True)
class Pick:
    """The candidate a budget allows and why: how many were stored, how many each limit excluded."""

    candidate: Candidate
    constraints: Constraints
    stored: int
    excluded: Mapping[str, int]

    @property
    def reason(self) -> str:
        left_out = ", ".join(f"{n} over {what}" for what, n in sorted(self.excluded.items()) if n)
        return (f"{self.constraints.describe()}: best of {self.stored - sum(self.excluded.values())} of "
                f"{self.stored} cached candidates" + (f" ({left_out})" if left_out else ""))


def covering_set(candidates: Sequence[Candidate]) -> list[Candidate]:
    """The candidates no other beats on latency, energy, accuracy, worst-case latency and the
    memory needed on every unit (module docstring); one per distinct point, in latency order."""
    if not candidates:
        return []
    units = sorted({u for c in candidates for u, _ in c.memory_mb})
    f = np.array([(c.latency_ms, c.energy_mj, -c.accuracy, c.worst_latency_ms, *(c.memory_need(u) for u in units))
                  for c in candidates])
    # pymoo: the mapper's search stack, loaded only where a node re-picks among its candidates
    from pymoo.util.nds.non_dominated_sorting import NonDominatedSorting
    front = NonDominatedSorting().do(f, only_non_dominated_front=True)
    distinct: dict[tuple, Candidate] = {}
    for i in sorted(front):
        distinct.setdefault(tuple(np.round(f[i], 9)), candidates[i])
    return sorted(distinct.values(), key=lambda c: (c.latency_ms, c.energy_mj))


def pick_within(choices: SearchChoices, constraints: Constraints) -> Pick:
    """The stored candidate the rule chooses among those meeting ``constraints`` (a pure lookup);
    ValueError saying which limit left nothing."""
    excluded: dict[str, int] = {}
    fitting = []
    for candidate in choices.candidates:
        over = next((f"{unit}'s {limit:g} MB" for unit, limit in sorted(constraints.unit_memory_mb.items())
                     if candidate.memory_need(unit) > limit + 1e-9), None)
        deadline = constraints.deadline_ms
        if over is None and deadline is not None and candidate.worst_latency_ms > deadline:
            over = f"the {deadline:g} ms deadline"
        if over is None:
            fitting.append(candidate)
        else:
            excluded[over] = excluded.get(over, 0) + 1
    if not fitting:
        why = "; ".join(f"{n} over {what}" for what, n in sorted(excluded.items()))
        raise ValueError(f"none of the {len(choices.candidates)} cached candidates meets {constraints.describe()} "
                         f"({why})")
    front = pareto_front(fitting)
    chosen = choose(front, constraints.prefer, constraints.max_accuracy_drop, choices.base_accuracy)
    if not constraints.allow_slower_than_one_stage:
        chosen = one_stage_guard(chosen, front, choices.base_accuracy, constraints.max_accuracy_drop)[0]
    return Pick(chosen, constraints, len(choices.candidates), excluded)


def cache_file(map_dir: Path, model_bytes: bytes, hardware: Hardware) -> Path:
    """Where the search result of this model (its bytes) on this hardware description is kept."""
    digest = hashlib.sha256(model_bytes)
    digest.update(repr(hardware.to_json()).encode())
    return map_dir / f"search-{digest.hexdigest()[:20]}.json"


def write_choices(path: Path, choices: SearchChoices) -> None:
    """Write atomically (a node may be reading the previous result)."""
    write_json_atomic(path, choices.to_json())


def load_choices(path: Path) -> SearchChoices:
    """A cached search result; FileNotFoundError when there is none, ValueError when damaged."""
    data = read_json(path, "search cache")
    return SearchChoices.from_json(data, str(path))
