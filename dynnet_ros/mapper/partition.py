"""Partition files: how a model is cut into stages (``dynnet map stages --partition P.yaml``).

Why a file: the cut is a choice (by a user, or by the search) that the CLI, the mapping file and
the node must all read the same way. Two forms, YAML::

    # depth-wise: one stage per exit, in this order (default: the model's own exits)
    exits: [exit0, exit1, exit2]

    # width-wise (Map-and-Conquer's P and I): every Conv/Gemm layer's output channels split
    # between `stages` stages by the fractions P; I says which earlier stages' features a
    # stage's next layer reuses.
    width:
      stages: 2
      P: {default: [0.5, 0.5], layers: {conv_3: [0.25, 0.75]}}   # each row sums to 1
      I: {default: [1, 0]}      # per producing stage: 1 = later stages reuse its features
      # or per reading stage, a matrix: I: {default: [[0, 0], [1, 0]]}  (row i reads column k < i)
      output: exit2             # the output the split serves (default: the last exit's first output)

An I entry that makes a stage read a *later* stage is refused: stages run concurrently and a
stage may wait only for earlier ones.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

SUM_TOLERANCE = 1e-6


@dataclass(frozen=True)
class WidthSpec:
    """P and I of a width-wise split, rows per layer (``layers``) over a default row."""

    stages: int
    p_default: tuple[float, ...]
    p_layers: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    reads_default: tuple[tuple[int, ...], ...] = ()                       # [reader][source] 0/1
    reads_layers: Mapping[str, tuple[tuple[int, ...], ...]] = field(default_factory=dict)
    output: str | None = None

    def fractions(self, layer: str) -> tuple[float, ...]:
        return self.p_layers.get(layer, self.p_default)

    def reads(self, layer: str) -> tuple[tuple[int, ...], ...]:
        return self.reads_layers.get(layer, self.reads_default)

    def to_json(self) -> dict[str, Any]:
        return {"stages": self.stages, "P": {"default": list(self.p_default),
                                             "layers": {k: list(v) for k, v in self.p_layers.items()}},
                "I": {"default": [list(r) for r in self.reads_default],
                      "layers": {k: [list(r) for r in v] for k, v in self.reads_layers.items()}},
                "output": self.output}


@dataclass(frozen=True)
class Partition:
    """A depth-wise cut (``exits``; None: the model's own) or a width-wise split (``width``)."""

    exits: tuple[Any, ...] | None = None
    width: WidthSpec | None = None

    @property
    def kind(self) -> str:
        return "width" if self.width is not None else "depth"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.exits is not None:
            out["exits"] = list(self.exits)
        if self.width is not None:
            out["width"] = self.width.to_json()
        return out


def load_partition(path: str | Path) -> Partition:
    """Read a partition YAML file; ValueError naming the file and the field."""
    where = Path(path)
    try:
        data = yaml.safe_load(where.read_text())
    except OSError as exc:
        raise ValueError(f"partition file {where}: cannot read it ({exc.strerror or exc})") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"partition file {where}: not valid YAML ({' '.join(str(exc).split())})") from None
    return parse_partition(data, f"partition file {where}")


def parse_partition(data: Any, where: str = "partition") -> Partition:
    if data is None:
        return Partition()
    if not isinstance(data, Mapping) or set(data) - {"exits", "width"}:
        raise ValueError(f"{where}: expected a mapping with 'exits' and/or 'width'")
    exits = data.get("exits")
    if exits is not None and (not isinstance(exits, list) or not exits):
        raise ValueError(f"{where}: 'exits' must be a non-empty list of output names")
    width = _parse_width(data["width"], f"{where}: width") if data.get("width") is not None else None
    if width is not None and exits is not None:
        raise ValueError(f"{where}: give 'exits' (depth-wise) or 'width' (width-wise), not both")
    return Partition(tuple(exits) if exits is not None else None, width)


def _row(value: Any, stages: int, field_name: str) -> tuple[float, ...]:
    if not isinstance(value, list) or len(value) != stages:
        raise ValueError(f"{field_name}: expected {stages} fractions (one per stage), got {value!r}")
    row = []
    for v in value:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= v <= 1.0:
            raise ValueError(f"{field_name}: fractions must be numbers in [0, 1], got {v!r}")
        row.append(float(v))
    total = sum(row)
    if abs(total - 1.0) > SUM_TOLERANCE:
        raise ValueError(f"{field_name}: P's fractions must sum to 1, got {total:g} ({row})")
    if row[0] == 0.0:
        raise ValueError(f"{field_name}: the first stage needs a share of every layer (> 0)")
    return tuple(row)


def _reads(value: Any, stages: int, field_name: str) -> tuple[tuple[int, ...], ...]:
    """I as per-producer flags (the paper's form) or a reader x source matrix -> the matrix."""
    def flag(v: Any) -> int:
        if v not in (0, 1) or isinstance(v, float) and v not in (0.0, 1.0):
            raise ValueError(f"{field_name}: entries must be 0 or 1, got {v!r}")
        return int(v)

    if isinstance(value, list) and len(value) == stages and all(not isinstance(v, list) for v in value):
        flags = [flag(v) for v in value]
        return tuple(tuple(flags[k] if k < i else 0 for k in range(stages)) for i in range(stages))
    if not isinstance(value, list) or len(value) != stages or not all(isinstance(r, list) and len(r) == stages
                                                                     for r in value):
        raise ValueError(f"{field_name}: expected {stages} flags or a {stages}x{stages} matrix, got {value!r}")
    matrix = tuple(tuple(flag(v) for v in row) for row in value)
    for i, row in enumerate(matrix):
        for k, v in enumerate(row):
            if v and k >= i:
                what = "itself" if k == i else f"later stage {k}"
                raise ValueError(f"{field_name}: stage {i} would need features from {what}; a stage may "
                                 "reuse only earlier stages' features (row i, column k < i)")
    return matrix


def _parse_width(raw: Any, where: str) -> WidthSpec:
    if not isinstance(raw, Mapping) or set(raw) - {"stages", "P", "I", "output"}:
        raise ValueError(f"{where}: expected a mapping with stages, P, I, output")
    stages = raw.get("stages")
    if isinstance(stages, bool) or not isinstance(stages, int) or stages < 1:
        raise ValueError(f"{where}: 'stages' must be an integer >= 1, got {stages!r}")
    p_raw = raw.get("P")
    if isinstance(p_raw, list):
        p_raw = {"default": p_raw}
    if not isinstance(p_raw, Mapping) or "default" not in p_raw or set(p_raw) - {"default", "layers"}:
        raise ValueError(f"{where}: 'P' must be a row of fractions or {{default: [...], layers: {{name: [...]}}}}")
    p_default = _row(p_raw["default"], stages, f"{where}: P.default")
    p_layers = {str(k): _row(v, stages, f"{where}: P.layers.{k}") for k, v in (p_raw.get("layers") or {}).items()}
    i_raw = raw.get("I", [1] * stages)
    if isinstance(i_raw, list):
        i_raw = {"default": i_raw}
    if not isinstance(i_raw, Mapping) or "default" not in i_raw or set(i_raw) - {"default", "layers"}:
        raise ValueError(f"{where}: 'I' must be a row of flags or {{default: [...], layers: {{name: [...]}}}}")
    reads_default = _reads(i_raw["default"], stages, f"{where}: I.default")
    reads_layers = {str(k): _reads(v, stages, f"{where}: I.layers.{k}") for k, v in (i_raw.get("layers") or {}).items()}
    output = raw.get("output")
    if output is not None and not isinstance(output, str):
        raise ValueError(f"{where}: 'output' must be an output name")
    return WidthSpec(stages, p_default, p_layers, reads_default, reads_layers, output)

