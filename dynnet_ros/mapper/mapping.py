"""Mapping files: which unit runs each stage, at which DVFS level, with which exit threshold.

Why a file: the search (``dynnet map search``) writes one, the runtime, ``dynnet map run`` and
the model nodes' ``mapping`` parameter read it, so a mapping chosen on a laptop runs on the robot.
YAML::

    hardware: this-machine          # load_hardware spec: this-machine[:N], a preset, a YAML path
    partition: {exits: [exit0, exit1, exit2]}    # a partition (partition.py), inline or a file path
    stages:                         # one entry per stage, in exit order
      - {unit: cpu0, threshold: 0.9}          # threshold: the exit's confidence to stop there
      - {unit: cpu1, threshold: 0.8, dvfs: default}
      - {unit: cpu0}                          # the last exit always answers: no threshold
    criterion: max_softmax          # optional: overrides every early exit's own criterion
    deadline_ms: null               # optional: anytime mode, the deepest exit done by then
    predicted_latency_ms: 12.5      # optional: the search's prediction (nodes report it beside the measured)

A relative partition path is relative to the mapping file. Errors name the file and the field: a
unit the hardware lacks, a DVFS level the unit lacks, a threshold on the last stage.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .exits import CRITERIA
from .hardware import Hardware, load_hardware
from .partition import Partition, load_partition, parse_partition


@dataclass(frozen=True)
class StageAssignment:
    """Where one stage runs and when its exit stops the frame."""

    unit: str
    dvfs: str | None = None          # None: the unit's default level
    threshold: float | None = None   # None on the last stage (its exit always answers)


@dataclass(frozen=True)
class StageMapping:
    """A parsed mapping file."""

    hardware: Hardware
    partition: Partition
    stages: tuple[StageAssignment, ...]
    criterion: str | None = None
    deadline_ms: float | None = None
    source: str = "<memory>"
    predicted_latency_ms: float | None = None   # what the search predicted for this mapping

    @property
    def thresholds(self) -> tuple[float | None, ...]:
        return tuple(s.threshold for s in self.stages)

    def to_json(self) -> dict[str, Any]:
        return {"hardware": self.hardware.source if self.hardware.source != "discovered" else self.hardware.name,
                "partition": self.partition.to_json(),
                "stages": [{"unit": s.unit, "dvfs": s.dvfs, "threshold": s.threshold} for s in self.stages],
                "criterion": self.criterion, "deadline_ms": self.deadline_ms,
                **({} if self.predicted_latency_ms is None else {"predicted_latency_ms": self.predicted_latency_ms})}


def load_mapping(path: str | Path) -> StageMapping:
    """Read a mapping YAML file; ValueError naming the file and the field."""
    where = Path(path)
    try:
        data = yaml.safe_load(where.read_text())
    except OSError as exc:
        raise ValueError(f"mapping file {where}: cannot read it ({exc.strerror or exc})") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"mapping file {where}: not valid YAML ({' '.join(str(exc).split())})") from None
    return parse_mapping(data, source=str(where), base=where.parent)


def _threshold(value: Any, field: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{field}: threshold must be a finite number, got {value!r}")
    return float(value)


def parse_mapping(data: Any, source: str = "<memory>", base: Path | None = None,
                  hardware: Hardware | None = None) -> StageMapping:
    """A StageMapping from the YAML mapping (``hardware``: use this instead of the file's)."""
    where = f"mapping file {source}"
    if not isinstance(data, Mapping):
        raise ValueError(f"{where}: expected a mapping with hardware, partition, stages")
    unknown = set(data) - {"hardware", "partition", "stages", "criterion", "deadline_ms", "predicted_latency_ms"}
    if unknown:
        raise ValueError(f"{where}: unknown keys {sorted(unknown)} (expected hardware, partition, stages, "
                         "criterion, deadline_ms, predicted_latency_ms)")
    if hardware is None:
        spec = data.get("hardware", "this-machine")
        if not isinstance(spec, str):
            raise ValueError(f"{where}: 'hardware' must be a name or a path")
        if base is not None and (spec.endswith(".yaml") or spec.endswith(".yml")) and not Path(spec).is_absolute():
            spec = str(base / spec)
        try:
            hardware = load_hardware(spec)
        except ValueError as exc:
            raise ValueError(f"{where}: hardware: {exc}") from None
    raw_partition = data.get("partition")
    if isinstance(raw_partition, str):
        path = Path(raw_partition)
        partition = load_partition(path if path.is_absolute() or base is None else base / path)
    else:
        partition = parse_partition(raw_partition, f"{where}: partition")
    raw_stages = data.get("stages")
    if not isinstance(raw_stages, list) or not raw_stages:
        raise ValueError(f"{where}: 'stages' must be a non-empty list (one entry per stage)")
    stages = []
    for i, item in enumerate(raw_stages):
        field = f"{where}: stages[{i}]"
        if isinstance(item, str):
            item = {"unit": item}
        if not isinstance(item, Mapping) or set(item) - {"unit", "dvfs", "threshold"}:
            raise ValueError(f"{field}: expected a unit name or a mapping with unit, dvfs, threshold")
        unit_name = item.get("unit")
        if not isinstance(unit_name, str):
            raise ValueError(f"{field}: 'unit' must be a unit name")
        try:
            unit = hardware.unit(unit_name)
            dvfs = item.get("dvfs")
            if dvfs is not None:
                unit.level(str(dvfs))
        except ValueError as exc:
            raise ValueError(f"{field}: {exc}") from None
        threshold = _threshold(item.get("threshold"), field)
        stages.append(StageAssignment(unit_name, None if dvfs is None else str(dvfs), threshold))
    if stages[-1].threshold is not None:
        raise ValueError(f"{where}: stages[{len(stages) - 1}] is the last stage: its exit always answers, "
                         "so it takes no threshold")
    criterion = data.get("criterion")
    if criterion is not None and criterion not in CRITERIA:
        raise ValueError(f"{where}: unknown criterion {criterion!r}; choose one of {', '.join(CRITERIA)}")
    deadline = data.get("deadline_ms")
    if deadline is not None and (isinstance(deadline, bool) or not isinstance(deadline, (int, float))
                                 or not 0 < deadline < math.inf):
        raise ValueError(f"{where}: deadline_ms must be a positive number or null, got {deadline!r}")
    predicted = data.get("predicted_latency_ms")
    if predicted is not None and (isinstance(predicted, bool) or not isinstance(predicted, (int, float))
                                  or not 0 <= predicted < math.inf):
        raise ValueError(f"{where}: predicted_latency_ms must be a number >= 0 or null, got {predicted!r}")
    return StageMapping(hardware, partition, tuple(stages), criterion,
                        None if deadline is None else float(deadline), source,
                        None if predicted is None else float(predicted))


def check_stage_count(mapping: StageMapping, stages: int) -> None:
    """ValueError unless the mapping has one entry per stage."""
    if len(mapping.stages) != stages:
        raise ValueError(f"mapping file {mapping.source}: {len(mapping.stages)} stage entries for a model cut into "
                         f"{stages} stages; give one entry per stage")

