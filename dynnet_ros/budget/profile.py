"""What a model node tells the budget manager about its engine (no ROS; the node publishes it).

An engine reports its smallest budget and a latency table (``BudgetedModel``); where the table
is empty (no frame measured yet, or a model that runs only in memory) the model is reported
honestly as a single point: it needs what it holds now, and is as fast as it last ran.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Protocol

from dynnet_ros.budget.protocol import ModelProfile

NO_SWAP_QUANTUM_MB = 8.0


class BudgetedModel(Protocol):
    """What a profile reads from an engine (``dynnet_ros.engine.Engine`` provides both)."""

    def latency_table(self) -> list[tuple[float, float]]:
        """(budget MB, predicted ms) per level, increasing budget; empty when none is known."""

    def min_budget_mb(self) -> float | None:
        """The smallest budget the model runs in (None: the engine cannot tell)."""


def _number(value: Any) -> float | None:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) and out >= 0 else None


def engine_profile(node: str, engine: BudgetedModel, *, rss_mb: float | None, held_mb: float | None,
                   budget_mb: float | None, fallback_ms: float | None = None,
                   anon_held_mb: float | None = None) -> ModelProfile:
    """Profile of ``engine`` as seen from its node.

    ``held_mb`` is the node's RSS growth since before the model loaded (what a budget bounds),
    ``anon_held_mb`` its anonymous part; ``budget_mb`` is the budget in force (None = unlimited).
    """
    table: list[tuple[float, float]] = []
    for point in engine.latency_table():
        mb, ms = (_number(v) for v in point)
        if mb is not None and ms is not None:
            table.append((mb, ms))
    min_mb = _number(engine.min_budget_mb())
    full_mb: float | None
    if table:
        full_mb = max(mb for mb, _ in table)
        if min_mb is None:
            min_mb = min(mb for mb, _ in table)
    else:
        # no swapping: the model needs its whole footprint, at the latency it last ran; rounded
        # up to NO_SWAP_QUANTUM_MB so allocator noise does not chase every page of RSS drift
        need = None if held_mb is None else math.ceil(held_mb / NO_SWAP_QUANTUM_MB) * NO_SWAP_QUANTUM_MB
        full_mb = need
        if min_mb is None:
            min_mb = need
        if need is not None and fallback_ms is not None:
            table.append((need, fallback_ms))
    if min_mb is not None and full_mb is not None and full_mb < min_mb:
        full_mb = min_mb
    return ModelProfile(node=node, min_mb=min_mb, full_mb=full_mb, table=tuple(sorted(table)),
                        rss_mb=rss_mb, held_mb=held_mb, budget_mb=budget_mb, anon_held_mb=anon_held_mb)


class ProfileHold:
    """A node's budget bounds over every input size class it served in the last ``window_s``.

    Why: an engine's table, minimum and full footprint are per input size, and a camera that
    cycles resolutions (the sensor simulator does, every few seconds) moved them every cycle:
    the manager re-pushed a budget on almost every evaluation, and a budget that fit the small
    size was below the node's minimum when the large one came back. So the hold keeps the
    latest profile of each size class (the model-input "HxW") and publishes every class's
    minimum (``min_by_size``) with the bounds and table of the most demanding class (largest
    minimum; ties: the largest full footprint); the memory readings stay current. A class not
    seen for ``window_s`` is dropped. Minimums *announced* for size classes not run yet (the
    engine's minimum at that input size plus the node's frame buffers) join ``min_by_size``, so
    the manager's budget fits a resolution switch before it arrives. Before the engine ran a
    frame (``size`` None) nothing is held and the profile goes out as ``measured: false``.
    Bounds are rounded up to ``quantum_mb`` so sub-MB estimate noise is not a change.
    """

    def __init__(self, window_s: float = 30.0, quantum_mb: float = 0.5) -> None:
        if not (math.isfinite(window_s) and window_s >= 0):
            raise ValueError(f"window_s must be a finite number >= 0, got {window_s!r}")
        if not (math.isfinite(quantum_mb) and quantum_mb > 0):
            raise ValueError(f"quantum_mb must be a finite number > 0, got {quantum_mb!r}")
        self.window_s, self.quantum_mb = window_s, quantum_mb
        self._seen: dict[str, tuple[float, ModelProfile]] = {}

    def _round_up(self, value: float | None) -> float | None:
        return None if value is None else math.ceil(value / self.quantum_mb - 1e-9) * self.quantum_mb

    def update(self, profile: ModelProfile, now_s: float, size: str | None,
               announced: dict[str, float] | None = None) -> ModelProfile:
        """Record ``profile`` (the engine's view now, at input size class ``size``; None before
        its first frame) and return the one to publish. ``announced``: minimums per size class
        known before such a frame arrives; each class publishes the larger of it and the measured."""
        self._seen = {k: (t, p) for k, (t, p) in self._seen.items() if now_s - t <= self.window_s}
        announced_up = {k: mb for k, v in (announced or {}).items() if (mb := self._round_up(v)) is not None}
        if size is None and not self._seen:
            return replace(profile, min_mb=self._round_up(profile.min_mb), full_mb=self._round_up(profile.full_mb),
                           size=None, min_by_size=dict(sorted(announced_up.items())), measured=False)
        if size is not None:
            self._seen[size] = (now_s, profile)
        held = [p for _, p in self._seen.values()]
        worst = max(held, key=lambda p: (p.min_mb if p.min_mb is not None else -1.0,
                                         p.full_mb if p.full_mb is not None else -1.0))
        full = max((p.full_mb for p in held if p.full_mb is not None), default=None)
        by_size = dict(announced_up)
        for k, (_, p) in self._seen.items():
            if (mb := self._round_up(p.min_mb)) is not None:
                by_size[k] = max(mb, by_size.get(k, 0.0))
        return replace(profile, min_mb=self._round_up(worst.min_mb), full_mb=self._round_up(full),
                       table=worst.table, size=size, min_by_size=dict(sorted(by_size.items())), measured=True)

    def sizes(self) -> list[str]:
        """The size classes held now."""
        return list(self._seen)

    def reset(self) -> None:
        """Forget what was seen (a new model: the old sizes say nothing about it)."""
        self._seen = {}
