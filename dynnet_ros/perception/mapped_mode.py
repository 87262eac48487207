"""A serving core's mapped stages: which run, and the ``mapping: auto`` re-pick on a new budget.

Why a module: the stages change from three places (a parameter change, a new per-unit budget
from the budget manager, closing) while the worker runs frames through them. Every swap happens
under the core's frame lock, between two frames, and bumps a generation, so a re-pick that raced
a parameter change is recognised as stale and thrown away (``mapped`` holds the pieces).
"""
from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import Any

from dynnet_ros.mapper.runtime import StageExecutor
from dynnet_ros.perception.core import PerceptionCore
from dynnet_ros.perception.mapped import (
    AutoPick,
    MappedSettings,
    Rerun,
    auto_hardware,
    choose_auto,
    mapped_diagnostics,
    open_auto,
    open_mapped,
)
from dynnet_ros.settings import settings


def open_stages(core: PerceptionCore, params: dict[str, Any],
                unit_limits: dict[str, float]) -> tuple[StageExecutor | None, AutoPick | None]:
    """Mapped mode for ``core``'s model (None: unmapped) and, for ``mapping: auto``, what was
    picked and why; ValueError with the reason."""
    mapped = MappedSettings.from_params(params)
    budget = params["memory_budget_mb"] or None
    if auto_hardware(mapped.mapping) is None:
        return open_mapped(core.model_path, mapped, budget), None
    chosen = choose_auto(core.model_path, mapped.mapping, dict(unit_limits), settings().cache.map_dir)
    return open_auto(core.model_path, chosen, mapped, budget), chosen


class MappedMode:
    """The stages that run a core's frames (None: the engine does) and what ``auto`` picked."""

    def __init__(self, lock: AbstractContextManager[Any], current: Callable[[], tuple[PerceptionCore, dict[str, Any]]],
                 stopped: Callable[[], bool], info: Callable[[str], None], error: Callable[[str], None],
                 changed: Callable[[], None], name: str) -> None:
        """``lock``: the core's frame lock; ``current``: its core and parameters now; ``changed``:
        called after a re-pick (the status changed)."""
        self._lock, self._current, self._stopped = lock, current, stopped
        self._info, self._error, self._changed = info, error, changed
        self.executor: StageExecutor | None = None
        self.auto: AutoPick | None = None
        self.unit_limits: dict[str, float] = {}   # per-unit memory from the budget manager
        self._generation = 0                      # bumped by every swap of the stages
        self._repicks = Rerun(self._repick, f"{name}-repick", stopped,
                              lambda trace: error(f"mapping auto: re-pick failed: {trace}"))

    def open(self, core: PerceptionCore, params: dict[str, Any]) -> tuple[StageExecutor | None, AutoPick | None]:
        return open_stages(core, params, self.unit_limits)

    def install(self, core: PerceptionCore, executor: StageExecutor | None,
                auto: AutoPick | None) -> StageExecutor | None:
        """Run ``core``'s frames through ``executor`` from the next frame on; the caller holds the
        frame lock and closes the stages returned (the previous ones)."""
        old, self.executor, self.auto = self.executor, executor, auto
        self._generation += 1
        core.runner = None if executor is None else executor.run
        return old

    def claimed_units(self) -> tuple[str, ...]:
        """The units whose memory the core asks the budget manager for (``mapping: auto``)."""
        auto = self.auto
        return () if auto is None else auto.hardware.unit_names

    def log_auto(self) -> None:
        auto = self.auto
        if auto is None:
            return
        if auto.error:
            self._error(auto.error)
        elif auto.pick is not None:
            self._info(f"mapping auto: running {dict(auto.pick.candidate.assignment)} ({auto.pick.reason})")

    def set_unit_limits(self, limits: dict[str, float]) -> None:
        """Per-unit memory for this core from the budget manager; a change re-picks beside the
        frame loop under ``mapping: auto``."""
        if limits == self.unit_limits:
            return
        self.unit_limits = limits
        if auto_hardware(self._current()[1]["mapping"]) is not None:
            self._repicks.request()

    def _repick(self) -> None:
        """The cached candidate under the current per-unit limits; new stages are built here and
        swapped in between two frames (the previous ones serve meanwhile)."""
        core, params = self._current()
        with self._lock:
            generation, current = self._generation, self.auto
        if auto_hardware(params["mapping"]) is None:
            return
        chosen = choose_auto(core.model_path, params["mapping"], dict(self.unit_limits), settings().cache.map_dir)
        executor = None
        if not chosen.same_choice(current):
            try:
                executor = open_auto(core.model_path, chosen, MappedSettings.from_params(params),
                                     params["memory_budget_mb"] or None)
            except ValueError as exc:
                chosen = replace(chosen, pick=None, error=f"mapping auto: the pick does not run: {exc}; serving "
                                 "unmapped")
        old, stale = None, False
        with self._lock:
            if generation != self._generation or self._stopped():
                old, stale = executor, True   # the mapping changed meanwhile: this pick is stale
            elif chosen.same_choice(current):
                self.auto = chosen
            else:
                old = self.install(self._current()[0], executor, chosen)
        if old is not None:
            old.close()
        if not stale:
            if not chosen.same_choice(current):
                self.log_auto()
            self._changed()

    def diagnostics(self, mapping: str) -> dict[str, Any]:
        return mapped_diagnostics(self.executor, mapping, self.auto)

    def close(self) -> None:
        """Close the stages (the caller holds the frame lock)."""
        if self.executor is not None:
            self.executor.close()
