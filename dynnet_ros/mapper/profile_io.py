"""Per-layer measurements as files: the profile CSV and TensorRT's ``trtexec --exportProfile`` JSON.

Why files: a robot profiles its own units (GPU, DLAs, CPU groups) and a laptop searches mappings;
the two meet in a profile. The CSV is this package's exchange format, documented in
docs/mapper.md and here:

    layer,unit,dvfs,latency_ms,power_w[,transition_ms]

* one row per layer (or layer group) and unit (and DVFS level); the rows of one unit list its
  layers in execution order, and every unit agrees on that order (a unit may skip a layer it
  cannot run, e.g. a DLA without that layer type);
* ``unit`` names a unit of the hardware file; ``dvfs`` names one of its DVFS levels, empty = the
  unit's default level;
* ``latency_ms`` > 0; ``power_w`` >= 0 or empty (then energy is the hardware file's power at that
  level × time, labelled *modelled*);
* ``transition_ms`` (optional column, may be empty): the cost of handing this layer's output to a
  different unit, as measured (e.g. a TensorRT reformat layer); empty = the hardware file's
  exchange cost.

Extra columns are allowed and ignored (the profiler writes its layer features there). Every error
is a ValueError naming the file and line.
"""
from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dynnet_ros.mapper.hardware import Hardware

REQUIRED_COLUMNS: tuple[str, ...] = ("layer", "unit", "dvfs", "latency_ms", "power_w")
OPTIONAL_COLUMNS: tuple[str, ...] = ("transition_ms",)
#: Name prefixes of the layers TensorRT inserts to move a tensor between formats or devices; their
#: time is the previous layer's transition cost, not a layer of the network.
TRT_TRANSITION_PREFIXES: tuple[str, ...] = ("Reformatting CopyNode", "reformatter", "Reformat")


@dataclass(frozen=True)
class Measurement:
    """One layer (or layer group) on one unit at one DVFS level."""

    layer: str
    unit: str
    dvfs: str                         # "" = the unit's default level
    latency_ms: float
    power_w: float | None = None      # None: not measured (energy is modelled)
    transition_ms: float | None = None
    features: Mapping[str, Any] = field(default_factory=dict)   # profiler extras (op, FLOPs, ...)
    line: int = 0                     # source line (1 = header) for messages

    def energy_mj(self, hardware: Hardware | None) -> tuple[float, bool]:
        """(energy in mJ, measured?) — W × ms = mJ; the hardware file's power where none was measured."""
        if self.power_w is not None:
            return self.power_w * self.latency_ms, True
        if hardware is None:
            raise ValueError(f"layer {self.layer!r} on {self.unit}: no power measured and no hardware file "
                             "to model it from")
        return hardware.unit(self.unit).level(self.dvfs or None).power_w * self.latency_ms, False


@dataclass(frozen=True)
class Profile:
    """Measurements of a chain of layers, in execution order, on one or more units."""

    measurements: tuple[Measurement, ...]
    source: str = ""

    @property
    def layers(self) -> tuple[str, ...]:
        """Layer names in execution order (ValueError when the units disagree on it)."""
        return chain_order(self.measurements, self.source)

    @property
    def units(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(m.unit for m in self.measurements))

    def lookup(self) -> dict[tuple[str, str, str], Measurement]:
        """(layer, unit, dvfs) -> measurement."""
        return {(m.layer, m.unit, m.dvfs): m for m in self.measurements}

    def power_label(self) -> str:
        """``measured``, ``modelled`` or ``mixed``: where the energies come from."""
        measured = {m.power_w is not None for m in self.measurements}
        return "measured" if measured == {True} else "modelled" if measured == {False} else "mixed"

    def merged(self, other: Profile) -> Profile:
        """This profile's rows, replaced or extended by ``other``'s (same key: ``other`` wins)."""
        rows = {(m.layer, m.unit, m.dvfs): m for m in self.measurements}
        rows.update({(m.layer, m.unit, m.dvfs): m for m in other.measurements})
        return Profile(tuple(rows.values()), source=f"{self.source}+{other.source}")


def _where(source: str, line: int) -> str:
    return f"{source} line {line}"


def _number(text: str, column: str, where: str, *, positive: bool, optional: bool) -> float | None:
    text = text.strip()
    if not text:
        if optional:
            return None
        raise ValueError(f"{where}: {column} is empty")
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{where}: {column} {text!r} is not a number") from None
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise ValueError(f"{where}: {column} must be a finite number {'> 0' if positive else '>= 0'}, got {text}")
    return value


def chain_order(measurements: Sequence[Measurement], source: str) -> tuple[str, ...]:
    """The execution order every unit's rows agree on (ties: first appearance in the file).

    Each unit (at each DVFS level) lists its layers in order and may skip some, so the order is
    the merge of those sequences; ValueError naming the line when two units disagree."""
    first = {name: i for i, name in enumerate(dict.fromkeys(m.layer for m in measurements))}
    after: dict[str, set[str]] = {name: set() for name in first}
    indegree = dict.fromkeys(first, 0)
    edges: list[tuple[Measurement, Measurement]] = []
    last: dict[tuple[str, str], Measurement] = {}
    for m in measurements:
        previous = last.get((m.unit, m.dvfs))
        if previous is not None:
            if previous.layer == m.layer:
                raise ValueError(f"{_where(source, m.line)}: layer {m.layer!r} on {m.unit} twice in a row; "
                                 "rows of a unit list its layers once each, in execution order")
            edges.append((previous, m))
            if m.layer not in after[previous.layer]:
                after[previous.layer].add(m.layer)
                indegree[m.layer] += 1
        last[(m.unit, m.dvfs)] = m
    ready = sorted((name for name, d in indegree.items() if d == 0), key=first.__getitem__)
    order: list[str] = []
    while ready:
        name = ready.pop(0)
        order.append(name)
        for nxt in after[name]:
            indegree[nxt] -= 1
            if indegree[nxt] == 0:
                ready.append(nxt)
        ready.sort(key=first.__getitem__)
    if len(order) < len(first):
        stuck = set(first) - set(order)
        previous, m = max(((p, m) for p, m in edges if p.layer in stuck and m.layer in stuck), key=lambda e: e[1].line)
        raise ValueError(f"{_where(source, m.line)}: layer {m.layer!r} on {m.unit} follows {previous.layer!r} "
                         f"(line {previous.line}), but another unit runs them the other way round; every "
                         "unit must list the layers in one execution order")
    return tuple(order)


def _check_hardware(measurements: Sequence[Measurement], hardware: Hardware, source: str) -> None:
    for m in measurements:
        try:
            hardware.unit(m.unit).level(m.dvfs or None)
        except ValueError as exc:
            raise ValueError(f"{_where(source, m.line)}: {exc}") from None


def parse_csv(text: str, source: str = "<csv>", hardware: Hardware | None = None) -> Profile:
    """A profile from CSV text (contract in the module docstring); ValueError naming the line."""
    reader = csv.reader(io.StringIO(text))
    try:
        header = [h.strip() for h in next(reader)]
    except StopIteration:
        raise ValueError(f"{source}: empty file; expected the header {','.join(REQUIRED_COLUMNS)}") from None
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    if missing:
        raise ValueError(f"{_where(source, 1)}: header lacks {', '.join(missing)}; expected "
                         f"{','.join(REQUIRED_COLUMNS)}[,transition_ms]")
    if len(set(header)) != len(header):
        raise ValueError(f"{_where(source, 1)}: a column name repeats")
    index = {name: i for i, name in enumerate(header)}
    extras = [c for c in header if c not in REQUIRED_COLUMNS + OPTIONAL_COLUMNS]
    rows: list[Measurement] = []
    seen: dict[tuple[str, str, str], int] = {}
    for line, row in enumerate(reader, start=2):
        if not row or all(not cell.strip() for cell in row):
            continue
        where = _where(source, line)
        if len(row) != len(header):
            raise ValueError(f"{where}: {len(row)} fields, the header has {len(header)}")
        cell = {name: row[i] for name, i in index.items()}
        layer, unit, dvfs = cell["layer"].strip(), cell["unit"].strip(), cell["dvfs"].strip()
        if not layer or not unit:
            raise ValueError(f"{where}: layer and unit must not be empty")
        key = (layer, unit, dvfs)
        if key in seen:
            raise ValueError(f"{where}: layer {layer!r} on {unit}{'@' + dvfs if dvfs else ''} repeats line "
                             f"{seen[key]}")
        seen[key] = line
        latency = _number(cell["latency_ms"], "latency_ms", where, positive=True, optional=False)
        power = _number(cell["power_w"], "power_w", where, positive=False, optional=True)
        transition = (_number(cell["transition_ms"], "transition_ms", where, positive=False, optional=True)
                      if "transition_ms" in cell else None)
        features = {name: _feature(cell[name]) for name in extras if cell[name].strip()}
        assert latency is not None
        rows.append(Measurement(layer, unit, dvfs, latency, power, transition, features, line))
    if not rows:
        raise ValueError(f"{source}: no measurements after the header")
    chain_order(rows, source)
    if hardware is not None:
        _check_hardware(rows, hardware, source)
    return Profile(tuple(rows), source=source)


def _feature(text: str) -> Any:
    try:
        return float(text)
    except ValueError:
        return text.strip()


def read_csv(path: str | Path, hardware: Hardware | None = None) -> Profile:
    """``parse_csv`` of a file; ValueError naming the file when it cannot be read."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"profile {path}: cannot read it ({getattr(exc, 'strerror', None) or exc})") from None
    return parse_csv(text, source=str(path), hardware=hardware)


def to_csv(profile: Profile | Iterable[Measurement]) -> str:
    """The CSV text of a profile (feature columns after the contract's, sorted)."""
    rows = list(profile.measurements if isinstance(profile, Profile) else profile)
    extras = sorted({k for m in rows for k in m.features})
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(list(REQUIRED_COLUMNS) + ["transition_ms"] + extras)

    def fmt(value: float | None) -> str:
        return "" if value is None else f"{value:.6g}"
    for m in rows:
        writer.writerow([m.layer, m.unit, m.dvfs, fmt(m.latency_ms), fmt(m.power_w), fmt(m.transition_ms)]
                        + [m.features.get(k, "") for k in extras])
    return out.getvalue()


def parse_trtexec_profile(data: Any, unit: str, dvfs: str = "", source: str = "<json>",
                          power_w: float | None = None, hardware: Hardware | None = None) -> Profile:
    """Rows for ``unit`` from ``trtexec --exportProfile=FILE`` output.

    TensorRT's format (``samples/common/sampleReporting.cpp``, ``Profiler::exportJSONProfile``) is a
    JSON array: ``[{"count": N}, {"name": L, "timeMs": total, "averageMs": avg, "medianMs": med,
    "percentage": p}, ...]`` — one entry per engine layer in execution order, times summed over N
    profiled runs (``medianMs`` since TensorRT 8). ``averageMs`` is used (``timeMs / count`` where
    it is absent). Layers TensorRT inserted to reformat a tensor between devices or formats
    (``Reformatting CopyNode …``) become the previous layer's ``transition_ms``; one at the start is
    dropped (input formatting, not a layer's output). ``power_w`` applies to every row (e.g. the
    average rail power measured during the run), None: modelled."""
    if not isinstance(data, list) or not data or not isinstance(data[0], Mapping) or "count" not in data[0]:
        raise ValueError(f"{source}: not a trtexec --exportProfile file (expected a JSON array starting "
                         "with {\"count\": N})")
    count = data[0]["count"]
    if isinstance(count, bool) or not isinstance(count, (int, float)) or count <= 0:
        raise ValueError(f"{source}: entry 0: count must be a positive number, got {count!r}")
    rows: list[Measurement] = []
    for i, entry in enumerate(data[1:], start=1):
        where = f"{source} entry {i}"
        if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str):
            raise ValueError(f"{where}: expected an object with a string 'name'")
        name = entry["name"].strip()
        if "averageMs" in entry:
            latency = entry["averageMs"]
        elif "timeMs" in entry:
            latency = entry["timeMs"] / count if isinstance(entry["timeMs"], (int, float)) else entry["timeMs"]
        else:
            raise ValueError(f"{where} ({name}): neither averageMs nor timeMs")
        if isinstance(latency, bool) or not isinstance(latency, (int, float)) or not math.isfinite(latency) \
                or latency < 0:
            raise ValueError(f"{where} ({name}): latency must be a finite number >= 0, got {latency!r}")
        if name.startswith(TRT_TRANSITION_PREFIXES):
            if rows:
                previous = rows[-1]
                rows[-1] = replace(previous, transition_ms=(previous.transition_ms or 0.0) + float(latency))
            continue
        if latency == 0:
            continue   # a layer TensorRT fused away reports 0 ms; it costs nothing on its own
        if any(r.layer == name for r in rows):
            raise ValueError(f"{where}: layer {name!r} appears twice")
        rows.append(Measurement(name, unit, dvfs, float(latency), power_w, None, {}, i))
    if not rows:
        raise ValueError(f"{source}: no layer timings")
    if hardware is not None:
        _check_hardware(rows, hardware, source)
    return Profile(tuple(rows), source=source)


def read_trtexec_profile(path: str | Path, unit: str, dvfs: str = "", power_w: float | None = None,
                         hardware: Hardware | None = None) -> Profile:
    """``parse_trtexec_profile`` of a file; ValueError naming the file when it is unreadable or not JSON."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"profile {path}: cannot read it ({getattr(exc, 'strerror', None) or exc})") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"profile {path}: not JSON (line {exc.lineno}: {exc.msg})") from None
    return parse_trtexec_profile(data, unit, dvfs, source=str(path), power_w=power_w, hardware=hardware)


def read_profile(spec: str, hardware: Hardware | None = None) -> Profile:
    """A CSV path, or ``UNIT[@DVFS]=trtexec.json`` for a trtexec profile of one unit."""
    if "=" in spec and spec.split("=", 1)[1].endswith(".json"):
        target, path = spec.split("=", 1)
        unit, _, dvfs = target.partition("@")
        return read_trtexec_profile(path, unit.strip(), dvfs.strip(), hardware=hardware)
    if spec.endswith(".json"):
        raise ValueError(f"{spec}: a trtexec profile needs its unit: UNIT[@DVFS]={spec}")
    return read_csv(spec, hardware=hardware)


def combine(profiles: Sequence[Profile], hardware: Hardware | None = None) -> Profile:
    """One chain from several files (e.g. one trtexec JSON per unit), order checked again."""
    if not profiles:
        raise ValueError("no profiles given")
    merged = profiles[0]
    for other in profiles[1:]:
        merged = merged.merged(other)
    chain_order(merged.measurements, merged.source)
    if hardware is not None:
        _check_hardware(merged.measurements, hardware, merged.source)
    return merged
