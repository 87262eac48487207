"""A serving core's mapped mode: its model's stages on compute units, answering at the first
confident exit (dynnet_ros.mapper), behind the ``mapping``, ``exit_threshold`` and
``deadline_ms`` parameters of a model node.

Why a module: this turns the three parameters into a running ``StageExecutor`` (or None:
unmapped, the Engine runs frames) and its diagnostics; the serving core (``mapped_mode``) swaps
it in between two frames, so a change drops at most the frame in flight, and a mapping that does
not load is refused with its reason while the previous one keeps serving.

``mapping: auto`` (or ``auto:HARDWARE``) runs the pick of the search cached for the model and the
hardware (``mapper.choices``, written by ``dynnet map search``) under the per-unit memory the
budget manager gives the node; a new budget re-picks from the cached candidates (a lookup, no
search) and the core swaps the stages outside its frame loop.
"""
from __future__ import annotations

import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dynnet_ros.bytesize import MB
from dynnet_ros.mapper.build import build_stages
from dynnet_ros.mapper.choices import Pick, cache_file, load_choices, pick_within
from dynnet_ros.mapper.hardware import Hardware, load_hardware
from dynnet_ros.mapper.mapping import load_mapping
from dynnet_ros.mapper.model_search import to_mapping
from dynnet_ros.mapper.partition import Partition
from dynnet_ros.mapper.runtime import StageExecutor

AUTO = "auto"

MAPPING_PARAMS = ("mapping", "exit_threshold", "deadline_ms")


@dataclass(frozen=True)
class MappedSettings:
    """The node parameters of mapped mode."""

    mapping: str            # mapping file; "" = unmapped
    exit_threshold: float   # < 0: the mapping file's thresholds; else every early exit's
    deadline_ms: float      # 0: the mapping file's (off when it has none); > 0: anytime mode

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> MappedSettings:
        return cls(str(params["mapping"]), float(params["exit_threshold"]), float(params["deadline_ms"]))


def auto_hardware(mapping: str) -> str | None:
    """The hardware spec of ``auto`` (this machine) or ``auto:SPEC``; None for a mapping file."""
    if mapping == AUTO:
        return "this-machine"
    if mapping.startswith(AUTO + ":"):
        return mapping[len(AUTO) + 1:].strip()
    return None


def check_mapping(value: str) -> str | None:
    """The ``mapping`` parameter's check: ``auto[:SPEC]`` must name hardware that loads (a mapping
    file is checked when it loads)."""
    spec = auto_hardware(value)
    if spec is None:
        return None
    if not spec:
        return "mapping 'auto:' needs a hardware spec after the colon (auto:jetson-agx-orin), or plain 'auto'"
    try:
        load_hardware(spec)
    except ValueError as exc:
        return f"mapping {value!r}: {exc}"
    return None


@dataclass(frozen=True)
class AutoPick:
    """What ``mapping: auto`` chose and why, or why it runs nothing (``error``)."""

    hardware: Hardware
    cache: Path
    limits: dict[str, float] = field(default_factory=dict)   # per-unit memory from the budget manager
    pick: Pick | None = None
    error: str | None = None

    def same_choice(self, other: AutoPick | None) -> bool:
        """Whether ``other`` runs the same candidate (so no stages need building)."""
        return (other is not None and self.pick is not None and other.pick is not None
                and self.pick.candidate.key() == other.pick.candidate.key())

    def diagnostics(self) -> dict[str, Any]:
        chosen = self.pick.candidate if self.pick is not None else None
        return {"mapped.auto.hardware": self.hardware.name, "mapped.auto.cache": str(self.cache),
                "mapped.auto.unit_limits_mb": ",".join(f"{u}={mb:g}" for u, mb in sorted(self.limits.items())),
                "mapped.auto.candidate": "" if chosen is None else
                ",".join(f"{stage}={unit}" for stage, unit in chosen.assignment),
                "mapped.auto.reason": self.pick.reason if self.pick is not None else "",
                "mapped.auto.error": self.error or ""}


def choose_auto(model_path: str, mapping: str, limits: dict[str, float], map_dir: Path) -> AutoPick:
    """The cached candidate for ``model_path`` under per-unit memory ``limits`` (a lookup over the
    stored candidates; no search). No cache, a damaged one or no candidate within the limits:
    ``error`` says so, naming the command that makes one."""
    spec = auto_hardware(mapping)
    if spec is None:
        raise ValueError(f"mapping {mapping!r} is not auto")
    hardware = load_hardware(spec)
    cache = cache_file(map_dir, Path(model_path).read_bytes(), hardware)
    command = f"`dynnet map search {model_path} --hw {spec}`"
    try:
        choices = load_choices(cache)
    except FileNotFoundError:
        return AutoPick(hardware, cache, limits, error=f"mapping auto: no search result cached for "
                        f"{model_path} on {hardware.name} ({cache}); run {command}; serving unmapped")
    except ValueError as exc:
        return AutoPick(hardware, cache, limits, error=f"mapping auto: {exc}; run {command} again; "
                        "serving unmapped")
    merged = dict(choices.rule.unit_memory_mb)
    for unit, mb in limits.items():
        merged[unit] = min(mb, merged.get(unit, mb))
    try:
        pick = pick_within(choices, replace(choices.rule, unit_memory_mb=merged))
    except ValueError as exc:
        return AutoPick(hardware, cache, limits, error=f"mapping auto: {exc}; serving unmapped")
    return AutoPick(hardware, cache, limits, pick)


def open_auto(model_path: str, chosen: AutoPick, settings: MappedSettings,
              budget_mb: float | None) -> StageExecutor | None:
    """The stage runtime for the picked candidate (None when nothing was picked)."""
    if chosen.pick is None:
        return None
    stage_set = build_stages(model_path, Partition())
    mapping = to_mapping(chosen.pick.candidate, stage_set, chosen.hardware)
    mapping = replace(mapping, source=f"auto ({chosen.cache})", predicted_latency_ms=chosen.pick.candidate.latency_ms)
    return _started(StageExecutor(stage_set, mapping, budget_bytes=None if not budget_mb else int(budget_mb * MB)),
                    settings)


def open_mapped(model_path: str, settings: MappedSettings, budget_mb: float | None) -> StageExecutor | None:
    """The mapped executor for ``model_path`` (None when ``settings.mapping`` is empty); ValueError
    with the reason when the mapping file, its partition or its units do not fit the model."""
    if not settings.mapping:
        return None
    mapping = load_mapping(settings.mapping)
    stage_set = build_stages(model_path, mapping.partition)
    return _started(StageExecutor(stage_set, mapping, budget_bytes=None if not budget_mb else int(budget_mb * MB)),
                    settings)


def _started(executor: StageExecutor, settings: MappedSettings) -> StageExecutor:
    """``executor`` tuned to ``exit_threshold`` and ``deadline_ms`` (closed if they do not apply)."""
    try:
        tune(executor, settings)
    except ValueError:
        executor.close()
        raise
    return executor


def tune(executor: StageExecutor, settings: MappedSettings) -> None:
    """Apply ``exit_threshold`` and ``deadline_ms`` to a running executor (from the next frame)."""
    file_thresholds = executor.mapping.thresholds
    if settings.exit_threshold >= 0:
        executor.set_thresholds([settings.exit_threshold] * (len(file_thresholds) - 1) + [None])
    else:
        executor.set_thresholds(list(file_thresholds))
    executor.set_deadline(settings.deadline_ms if settings.deadline_ms > 0 else executor.mapping.deadline_ms)


def mapped_diagnostics(executor: StageExecutor | None, mapping: str, auto: AutoPick | None = None) -> dict[str, Any]:
    """The /diagnostics values of mapped mode: the exit histogram, each unit's busy fraction, the
    stages' times, measured mean latency beside the mapping file's prediction (0: none given) and
    whether the last published output came from an early exit; with ``mapping: auto``, which
    cached candidate runs and why."""
    extra = auto.diagnostics() if auto is not None else {}
    if executor is None:
        return {"mapping": mapping, "mapped": False, **extra}
    details = executor.details()
    values: dict[str, Any] = {"mapping": mapping, "mapped": True, **extra,
                              "mapped.units": ",".join(details["mapping"]),
                              "mapped.thresholds": ",".join("-" if t is None else f"{t:g}"
                                                            for t in details["thresholds"]),
                              "mapped.deadline_ms": details["deadline_ms"] or 0.0,
                              "mapped.frames": details["frames"],
                              "mapped.measured_latency_ms": details["mean_latency_ms"] or 0.0,
                              "mapped.predicted_latency_ms": details["predicted_latency_ms"] or 0.0,
                              "mapped.last_exit": -1 if details["last_exit"] is None else details["last_exit"],
                              "mapped.last_early_exit": bool(details["last_early"]),
                              "mapped.last_deadline_hit": bool(details["last_deadline_hit"])}
    for index, count in details["exit_histogram"].items():
        values[f"mapped.exit_histogram.{index}"] = count
    for unit, busy in details["busy_fraction"].items():
        values[f"mapped.busy_fraction.{unit}"] = busy
    for index, ms in details["stage_ms"].items():
        values[f"mapped.stage_ms.{index}"] = ms
    return values


class Rerun:
    """Runs ``work`` on a thread of its own when asked. Asking while it runs makes it run once
    more afterwards — never two at once, never a queue — so a re-pick always ends on the newest
    budget however many reports arrived meanwhile. ``stopped``: the node is closing, run no more;
    ``on_error``: the traceback of a failed run (the node keeps serving)."""

    def __init__(self, work: Callable[[], None], name: str, stopped: Callable[[], bool],
                 on_error: Callable[[str], object]) -> None:
        self._work, self._name, self._stopped, self._on_error = work, name, stopped, on_error
        self._guard = threading.Lock()
        self._pending = False
        self._running = False

    def request(self) -> None:
        with self._guard:
            self._pending = True
            if self._running:
                return
            self._running = True
        threading.Thread(target=self._loop, name=self._name, daemon=True).start()

    def _loop(self) -> None:
        while True:
            with self._guard:
                if not self._pending or self._stopped():
                    self._running = False
                    return
                self._pending = False
            try:
                self._work()
            except Exception:  # noqa: BLE001 — reported; the caller's state stays as it was
                if not self._stopped():
                    self._on_error(traceback.format_exc())
