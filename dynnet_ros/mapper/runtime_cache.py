"""Fitted runtime costs kept per hardware description, so every later search predicts with them.

Why a cache: the runtime costs (``system_model.RuntimeCosts``) are what turns the paper's model
into predictions that match the stage runtime on a machine (a hand-off between two CPU groups
costs milliseconds there, which the paper's model prices at the exchange cost alone). They can
only be fitted from measured runs (``dynnet map search --measure``), which a plain search does
not make; keeping the last fit lets every later search on the same hardware rank its candidates,
and ``mapping: auto`` pick among them, by calibrated predictions.

One file per hardware description under ``DYNNET_MAP_DIR`` (``costs_file``: the digest of the
description's JSON, since ``this-machine`` is discovered rather than named by a file). The costs
belong to the machine and the runtime, not to a model, so a fit made on one model serves the
searches of all of them. The newest fit replaces the older one.
"""
from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from .cache_files import read_json, write_json_atomic
from .hardware import Hardware
from .system_model import RuntimeCosts

COSTS_VERSION = 1
COST_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(RuntimeCosts))


@dataclass(frozen=True)
class KeptCosts:
    """Runtime costs with where they came from: the hardware they were fitted on, what fitted
    them, over how many measured mappings and how far those fitted predictions erred."""

    costs: RuntimeCosts
    hardware: str
    source: str
    observations: int = 0
    fit_mape: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"version": COSTS_VERSION, "hardware": self.hardware, "runtime_costs": asdict(self.costs),
                "source": self.source, "observations": self.observations, "fit_mape": self.fit_mape}


def costs_from_json(data: Any, where: str) -> RuntimeCosts:
    """RuntimeCosts from a JSON object of its fields (``dispatch_ms``, ``contention``,
    ``slowdown``, ``handoff_ms``; a missing one takes the paper's value) or from one that holds
    them under ``runtime_costs`` (a kept costs file, a search's JSON); ValueError naming the fault."""
    if isinstance(data, Mapping) and isinstance(data.get("runtime_costs"), Mapping):
        data = data["runtime_costs"]
    if not isinstance(data, Mapping):
        raise ValueError(f"{where}: expected a JSON object of {', '.join(COST_FIELDS)}")
    unknown = sorted(set(data) - set(COST_FIELDS))
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {', '.join(map(str, unknown))} "
                         f"(expected {', '.join(COST_FIELDS)})")
    values: dict[str, float] = {}
    for name, value in data.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"{where}: {name} must be a finite number, got {value!r}")
        values[name] = float(value)
    try:
        return RuntimeCosts(**values)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


def costs_file(map_dir: Path, hardware: Hardware) -> Path:
    """Where the runtime costs fitted on this hardware description are kept."""
    digest = hashlib.sha256(repr(hardware.to_json()).encode())
    return map_dir / f"runtime-{digest.hexdigest()[:20]}.json"


def write_costs(path: Path, kept: KeptCosts) -> None:
    """Write atomically (a search may be reading the previous fit)."""
    write_json_atomic(path, kept.to_json())


def load_costs(path: Path) -> KeptCosts:
    """Kept runtime costs; FileNotFoundError when there are none, ValueError when damaged."""
    data = read_json(path, "runtime costs")
    if not isinstance(data, Mapping) or data.get("version") != COSTS_VERSION:
        raise ValueError(f"runtime costs {path}: not a version-{COSTS_VERSION} costs file")
    costs = costs_from_json(data, f"runtime costs {path}")
    try:
        mape = data.get("fit_mape")
        return KeptCosts(costs, str(data["hardware"]), str(data["source"]), int(data.get("observations", 0)),
                         None if mape is None else float(mape))
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"runtime costs {path}: {type(exc).__name__}: {exc}") from None


def read_costs_file(path: Path) -> RuntimeCosts:
    """The runtime costs a user names (``--runtime-costs FILE``): a kept costs file, a search's
    JSON, or a plain object of the four fields; ValueError naming the fault."""
    try:
        data = read_json(path, "runtime costs")
    except FileNotFoundError as exc:
        raise ValueError(f"runtime costs {path}: cannot read it ({exc.strerror or exc})") from None
    return costs_from_json(data, f"runtime costs {path}")


@dataclass(frozen=True)
class SearchCosts:
    """The runtime costs a search predicts with and why: named by the user, kept for the
    hardware, or none (the paper's model); ``warning``: a kept file that was ignored."""

    costs: RuntimeCosts | None
    source: str
    warning: str | None = None

    @property
    def calibrated(self) -> bool:
        return self.costs is not None and not self.costs.ideal

    def to_json(self) -> dict[str, Any]:
        return {"runtime_costs": asdict(self.costs or RuntimeCosts()), "calibrated": self.calibrated,
                "runtime_costs_source": self.source}


def search_costs(map_dir: Path, hardware: Hardware, named: tuple[str, RuntimeCosts] | None = None) -> SearchCosts:
    """The costs for a search on ``hardware``: ``named`` (source, costs) when the user gave them,
    else those kept under ``map_dir`` for the hardware; a missing file means the paper's model,
    a damaged one the same with a warning (a later ``--measure`` run writes it afresh)."""
    if named is not None:
        source, costs = named
        return SearchCosts(None if costs.ideal else costs, source)
    path = costs_file(map_dir, hardware)
    try:
        kept = load_costs(path)
    except FileNotFoundError:
        return SearchCosts(None, f"none kept for {hardware.name} (a `dynnet map search --measure` run fits them)")
    except ValueError as exc:
        return SearchCosts(None, f"none: the kept file was ignored ({path})",
                           f"ignoring the kept runtime costs: {exc}")
    return SearchCosts(None if kept.costs.ideal else kept.costs, f"{path} ({kept.source})")
