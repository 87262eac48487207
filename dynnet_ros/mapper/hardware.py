"""Compute units of a machine: what stages can be mapped to, at which DVFS level and power.

Why a file format and a discovered machine: the search (cost model, NSGA-II) and the stage
runtime must agree on unit names, and a Jetson's units (GPU, two DLAs, a CPU complex) and their
published DVFS tables are facts of the board, not of this process. A YAML file carries them
(``config/hardware/*.yaml``, figures cited there); ``this-machine`` describes the computer this
runs on: its CPU cores (those this process may use) split into groups, one unit per group, so two
stages can run side by side on disjoint cores.

    hw = load_hardware("this-machine")        # cpu0, cpu1, ... (CPU core groups)
    hw = load_hardware("jetson-agx-orin")     # a preset in config/hardware/
    hw = load_hardware("my-board.yaml")       # any file in the same schema
    hw.unit("dla0").dvfs, hw.exchange_cost("gpu", "dla0").ms_per_mb

The YAML schema::

    name: TEXT
    units:
      - name: gpu                  # unique; [A-Za-z][A-Za-z0-9_-]*
        kind: gpu                  # cpu | gpu | dla
        cores: [0, 1]              # cpu only: the cores its sessions are pinned to (optional)
        memory_mb: null            # memory the unit may hold; null: shared, the model's budget bounds it
        idle_power_w: 1.0
        default_dvfs: MAXN         # names one of dvfs (default: the first)
        dvfs:
          - {name: MAXN, frequency_mhz: 1300.5, power_w: 20.0, tops: 85.5}   # frequency null: the unit's default;
                                   # tops (optional): peak tera-ops/s, for simulated costs (mapper/simulate.py)
    exchange:
      default: {latency_ms: 0.1, ms_per_mb: 0.01}               # every pair of distinct units
      pairs:                                                     # overrides, both directions
        - {between: [gpu, dla0], latency_ms: 0.2, ms_per_mb: 0.02}
"""
from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

#: Kinds of compute unit the stage runtime knows how to drive.
UNIT_KINDS: tuple[str, ...] = ("cpu", "gpu", "dla")
#: The discovered description of the computer this process runs on.
THIS_MACHINE = "this-machine"
#: Presets in the source checkout (``config/hardware/<name>.yaml``); installed, they live in the
#: package's share directory (``preset_dir``).
PRESET_DIR = Path(__file__).resolve().parents[2] / "config" / "hardware"
#: Active power of one busy core of this machine, when no sensor says otherwise: a modelled figure
#: (a server core's share of a typical 150-200 W package over 32-48 cores), labelled as such in
#: the discovered description, so energies computed from it are comparable but not measured.
MODELLED_CORE_W = 4.0
MODELLED_CORE_IDLE_W = 0.5
#: Handing features between two CPU groups of this machine: both read the same DRAM, so the cost
#: is a thread handoff plus a copy through the caches (modelled: about 10 GB/s effective).
THIS_MACHINE_EXCHANGE = (0.02, 0.1)

_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]*\Z")


@dataclass(frozen=True)
class DvfsLevel:
    """One frequency setting of a unit and the unit's active power there."""

    name: str
    frequency_mhz: float | None   # None: the unit's default clock (not settable or not known)
    power_w: float                # active power at this level
    tops: float | None = None     # peak throughput at this level, tera-ops/s (simulated costs only)


@dataclass(frozen=True)
class ComputeUnit:
    """A unit a stage can be mapped to."""

    name: str
    kind: str                      # "cpu" | "gpu" | "dla"
    dvfs: tuple[DvfsLevel, ...]
    default_dvfs: str
    idle_power_w: float
    cores: tuple[int, ...] = ()    # cpu: the cores its sessions are pinned to (empty: not pinned)
    memory_mb: float | None = None  # None: shared memory, bounded by the model's budget

    def level(self, name: str | None = None) -> DvfsLevel:
        """The DVFS level ``name`` (None or "": the default); ValueError naming the known ones."""
        wanted = name or self.default_dvfs
        for level in self.dvfs:
            if level.name == wanted:
                return level
        raise ValueError(f"unit {self.name!r} has no DVFS level {wanted!r}; "
                         f"its levels: {', '.join(lv.name for lv in self.dvfs)}")


@dataclass(frozen=True)
class Exchange:
    """Cost of handing features from one unit to another: fixed latency + per-megabyte time."""

    latency_ms: float
    ms_per_mb: float

    def cost_ms(self, nbytes: int) -> float:
        """Time to hand ``nbytes`` over (zero bytes cost nothing)."""
        return 0.0 if nbytes <= 0 else self.latency_ms + self.ms_per_mb * nbytes / (1 << 20)


_NO_EXCHANGE = Exchange(0.0, 0.0)


@dataclass(frozen=True)
class Hardware:
    """A machine's compute units and the exchange costs between every ordered pair of them."""

    name: str
    units: tuple[ComputeUnit, ...]
    exchange: dict[tuple[str, str], Exchange]
    source: str = ""   # the file it was read from, or "discovered"

    def unit(self, name: str) -> ComputeUnit:
        """The unit called ``name``; ValueError naming the known units."""
        for unit in self.units:
            if unit.name == name:
                return unit
        raise ValueError(f"hardware {self.name!r} has no unit {name!r}; "
                         f"its units: {', '.join(self.unit_names)}")

    @property
    def unit_names(self) -> tuple[str, ...]:
        return tuple(unit.name for unit in self.units)

    def exchange_cost(self, src: str, dst: str) -> Exchange:
        """Cost of handing features from ``src`` to ``dst`` (the same unit: free)."""
        self.unit(src)
        self.unit(dst)
        if src == dst:
            return _NO_EXCHANGE
        return self.exchange[(src, dst)]

    def to_json(self) -> dict[str, Any]:
        """A JSON-able description (the YAML schema, with every pair spelled out)."""
        return {
            "name": self.name, "source": self.source,
            "units": [{"name": u.name, "kind": u.kind, "cores": list(u.cores), "memory_mb": u.memory_mb,
                       "idle_power_w": u.idle_power_w, "default_dvfs": u.default_dvfs,
                       "dvfs": [{"name": lv.name, "frequency_mhz": lv.frequency_mhz, "power_w": lv.power_w,
                                 **({"tops": lv.tops} if lv.tops is not None else {})}
                                for lv in u.dvfs]} for u in self.units],
            "exchange": [{"src": s, "dst": d, "latency_ms": e.latency_ms, "ms_per_mb": e.ms_per_mb}
                         for (s, d), e in sorted(self.exchange.items())],
        }


def preset_dir() -> Path:
    """The source checkout's ``config/hardware``, else the installed ``share/dynnet_ros/config/hardware``
    (beside the install prefix's ``lib/`` for colcon, under ``sys.prefix`` for pip)."""
    installed = [Path(__file__).resolve().parents[5] / "share" / "dynnet_ros" / "config" / "hardware"
                 if len(Path(__file__).resolve().parents) > 5 else PRESET_DIR,
                 Path(sys.prefix) / "share" / "dynnet_ros" / "config" / "hardware"]
    for candidate in (PRESET_DIR, *installed):
        if candidate.is_dir():
            return candidate
    return PRESET_DIR


def preset_names() -> tuple[str, ...]:
    """Names of the shipped presets (``config/hardware/*.yaml``)."""
    return tuple(sorted(p.stem for p in preset_dir().glob("*.yaml")))


def load_hardware(spec: str | Path) -> Hardware:
    """``"this-machine"`` (or ``"this-machine:N"`` for N core groups), a preset name, or a YAML path.

    ValueError with the reason on an unknown name, an unreadable file or a file that breaks the
    schema (the message names the file and the field)."""
    text = str(spec)
    if text == THIS_MACHINE or text.startswith(THIS_MACHINE + ":"):
        groups_text = text[len(THIS_MACHINE) + 1:]
        if groups_text and not groups_text.isdigit():
            raise ValueError(f"{text!r}: expected {THIS_MACHINE} or {THIS_MACHINE}:N (N core groups)")
        return discover_this_machine(int(groups_text) if groups_text else 2)
    path = Path(text)
    if not path.suffix and not path.exists():
        if text not in preset_names():
            raise ValueError(f"unknown hardware {text!r}: give {THIS_MACHINE}, a YAML file, or a preset "
                             f"({', '.join(preset_names())})")
        path = preset_dir() / f"{text}.yaml"
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ValueError(f"hardware file {path}: cannot read it ({exc.strerror or exc})") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"hardware file {path}: not valid YAML ({' '.join(str(exc).split())})") from None
    return parse_hardware(data, source=str(path))


def parse_hardware(data: Any, source: str = "<memory>") -> Hardware:
    """Build a Hardware from the YAML schema's mapping; ValueError naming ``source`` and the field."""
    where = f"hardware file {source}"
    if not isinstance(data, Mapping):
        raise ValueError(f"{where}: expected a mapping with 'name' and 'units'")
    unknown = set(data) - {"name", "units", "exchange"}
    if unknown:
        raise ValueError(f"{where}: unknown keys {sorted(unknown)} (expected name, units, exchange)")
    name = data.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"{where}: 'name' must be a non-empty string")
    raw_units = data.get("units")
    if not isinstance(raw_units, list) or not raw_units:
        raise ValueError(f"{where}: 'units' must be a non-empty list")
    units = tuple(_parse_unit(item, f"{where}: units[{i}]") for i, item in enumerate(raw_units))
    names = [u.name for u in units]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"{where}: unit names must be unique, repeated: {', '.join(duplicates)}")
    cores = [c for u in units for c in u.cores]
    if len(cores) != len(set(cores)):
        raise ValueError(f"{where}: two CPU units share a core; core groups must be disjoint")
    exchange = _parse_exchange(data.get("exchange"), names, where)
    return Hardware(name=name.strip(), units=units, exchange=exchange, source=source)


def _number(value: Any, field: str, *, low: float = 0.0, allow_none: bool = False) -> float | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value < low \
            or value == float("inf"):
        raise ValueError(f"{field} must be a finite number >= {low:g}, got {value!r}")
    return float(value)


def _parse_unit(item: Any, where: str) -> ComputeUnit:
    if not isinstance(item, Mapping):
        raise ValueError(f"{where}: expected a mapping (name, kind, dvfs, ...)")
    unknown = set(item) - {"name", "kind", "cores", "memory_mb", "idle_power_w", "default_dvfs", "dvfs"}
    if unknown:
        raise ValueError(f"{where}: unknown keys {sorted(unknown)}")
    name = item.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"{where}: 'name' must match {_NAME.pattern[:-2]}, got {name!r}")
    where = f"{where} ({name})"
    kind = item.get("kind")
    if kind not in UNIT_KINDS:
        raise ValueError(f"{where}: 'kind' must be one of {', '.join(UNIT_KINDS)}, got {kind!r}")
    cores_raw = item.get("cores") or []
    if not isinstance(cores_raw, list) or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0
                                                  for c in cores_raw):
        raise ValueError(f"{where}: 'cores' must be a list of core numbers >= 0")
    if cores_raw and kind != "cpu":
        raise ValueError(f"{where}: only a cpu unit has 'cores'")
    if len(set(cores_raw)) != len(cores_raw):
        raise ValueError(f"{where}: 'cores' repeats a core")
    levels_raw = item.get("dvfs")
    if not isinstance(levels_raw, list) or not levels_raw:
        raise ValueError(f"{where}: 'dvfs' must be a non-empty list of levels")
    levels = tuple(_parse_level(lv, f"{where}: dvfs[{i}]") for i, lv in enumerate(levels_raw))
    level_names = [lv.name for lv in levels]
    if len(set(level_names)) != len(level_names):
        raise ValueError(f"{where}: DVFS level names must be unique")
    default = item.get("default_dvfs", level_names[0])
    if default not in level_names:
        raise ValueError(f"{where}: default_dvfs {default!r} is not one of its levels ({', '.join(level_names)})")
    idle = _number(item.get("idle_power_w", 0.0), f"{where}: idle_power_w")
    memory = _number(item.get("memory_mb"), f"{where}: memory_mb", low=1e-9, allow_none=True)
    return ComputeUnit(name=name, kind=kind, dvfs=levels, default_dvfs=default, idle_power_w=float(idle or 0.0),
                       cores=tuple(cores_raw), memory_mb=memory)


def _parse_level(item: Any, where: str) -> DvfsLevel:
    if not isinstance(item, Mapping) or set(item) - {"name", "frequency_mhz", "power_w", "tops"}:
        raise ValueError(f"{where}: expected a mapping with name, frequency_mhz, power_w (and optional tops)")
    name = item.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"{where}: 'name' must be a non-empty string")
    frequency = _number(item.get("frequency_mhz"), f"{where}: frequency_mhz", low=1e-9, allow_none=True)
    power = _number(item.get("power_w"), f"{where}: power_w")
    tops = _number(item.get("tops"), f"{where}: tops", low=1e-9, allow_none=True)
    return DvfsLevel(name=name.strip(), frequency_mhz=frequency, power_w=float(power or 0.0), tops=tops)


def _parse_exchange(raw: Any, names: list[str], where: str) -> dict[tuple[str, str], Exchange]:
    raw = raw or {}
    if not isinstance(raw, Mapping) or set(raw) - {"default", "pairs"}:
        raise ValueError(f"{where}: 'exchange' must be a mapping with 'default' and/or 'pairs'")
    default = _parse_cost(raw.get("default", {"latency_ms": 0.0, "ms_per_mb": 0.0}), f"{where}: exchange.default")
    table = {(s, d): default for s in names for d in names if s != d}
    pairs = raw.get("pairs") or []
    if not isinstance(pairs, list):
        raise ValueError(f"{where}: exchange.pairs must be a list")
    for i, pair in enumerate(pairs):
        field = f"{where}: exchange.pairs[{i}]"
        if not isinstance(pair, Mapping):
            raise ValueError(f"{field}: expected a mapping with between, latency_ms, ms_per_mb")
        between = pair.get("between")
        if not isinstance(between, list) or len(between) != 2 or between[0] == between[1]:
            raise ValueError(f"{field}: 'between' must name two different units")
        for unit in between:
            if unit not in names:
                raise ValueError(f"{field}: unknown unit {unit!r}; units: {', '.join(names)}")
        cost = _parse_cost({k: v for k, v in pair.items() if k != "between"}, field)
        table[(between[0], between[1])] = table[(between[1], between[0])] = cost
    return table


def _parse_cost(item: Any, where: str) -> Exchange:
    if not isinstance(item, Mapping) or set(item) - {"latency_ms", "ms_per_mb"}:
        raise ValueError(f"{where}: expected a mapping with latency_ms and ms_per_mb")
    latency = _number(item.get("latency_ms", 0.0), f"{where}: latency_ms")
    per_mb = _number(item.get("ms_per_mb", 0.0), f"{where}: ms_per_mb")
    return Exchange(latency_ms=float(latency or 0.0), ms_per_mb=float(per_mb or 0.0))


def usable_cores() -> tuple[int, ...]:
    """The cores this process may run on (its affinity mask), sorted."""
    return tuple(sorted(os.sched_getaffinity(0)))


def split_cores(cores: tuple[int, ...], groups: int) -> list[tuple[int, ...]]:
    """``cores`` in ``groups`` contiguous, disjoint groups as equal as possible (fewer groups when
    there are fewer cores); ValueError below one group."""
    if groups < 1:
        raise ValueError(f"the number of core groups must be >= 1, got {groups}")
    groups = min(groups, len(cores))
    size, extra = divmod(len(cores), groups)
    out, start = [], 0
    for g in range(groups):
        end = start + size + (1 if g < extra else 0)
        out.append(tuple(cores[start:end]))
        start = end
    return out


def _cpu_frequencies_mhz(core: int) -> list[float]:
    """Frequencies cpufreq offers for ``core`` (MHz, ascending); empty where it is not exposed."""
    base = Path(f"/sys/devices/system/cpu/cpu{core}/cpufreq")
    try:
        table = (base / "scaling_available_frequencies").read_text().split()
        return sorted(float(khz) / 1000.0 for khz in table)
    except (OSError, ValueError):
        return []


def discover_this_machine(groups: int = 2) -> Hardware:
    """This computer's usable CPU cores split into ``groups`` units ``cpu0``, ``cpu1``, …

    DVFS levels are cpufreq's table where the kernel exposes one (power scaled with frequency,
    modelled), else one ``default`` level at the unit's own clock; power figures are modelled
    (``MODELLED_CORE_W`` per busy core) since no power sensor is read here."""
    units = []
    for index, cores in enumerate(split_cores(usable_cores(), groups)):
        freqs = _cpu_frequencies_mhz(cores[0])
        busy_w = MODELLED_CORE_W * len(cores)
        if freqs:
            top = freqs[-1]
            levels = tuple(DvfsLevel(f"{f:g}MHz", f, round(busy_w * (f / top) ** 2, 3)) for f in freqs)
            default = levels[-1].name
        else:
            levels = (DvfsLevel("default", None, busy_w),)
            default = "default"
        units.append(ComputeUnit(name=f"cpu{index}", kind="cpu", dvfs=levels, default_dvfs=default,
                                 idle_power_w=MODELLED_CORE_IDLE_W * len(cores), cores=cores))
    cost = Exchange(*THIS_MACHINE_EXCHANGE)
    names = [u.name for u in units]
    exchange = {(s, d): cost for s in names for d in names if s != d}
    return Hardware(name=THIS_MACHINE, units=tuple(units), exchange=exchange, source="discovered")
