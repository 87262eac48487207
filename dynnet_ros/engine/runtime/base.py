"""The executor protocol every backend implements, and the typed statistics it reports.

Why a protocol: the Engine, its budget policy (swap/budget_policy.py) and the nodes call exactly these
methods and read exactly these fields, so a new backend (TensorRT, the mapper's stages) knows
what it must provide and nothing is discovered at run time.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

#: what an engine does with a frame whose input size needs more than its budget (Engine(over_budget=...))
OVER_BUDGET_POLICIES = ("raise", "run")


@dataclass(frozen=True)
class OverBudget:
    """An input size the budget in force cannot hold: the engine's minimum there is above it."""

    shapes: str          # the input shapes ("name=1x3x480x640;...")
    minimum_mb: float    # the smallest budget the engine runs in at these shapes
    budget_mb: float     # the budget in force

    @property
    def overshoot_mb(self) -> float:
        """How far above its budget the engine runs at these shapes (in its smallest window)."""
        return self.minimum_mb - self.budget_mb

    def describe(self) -> str:
        return (f"memory budget {self.budget_mb:.1f} MB is below this model's minimum {self.minimum_mb:.1f} MB "
                f"at input {self.shapes}")


class BudgetExceeded(ValueError):
    """A frame refused before it ran: its input size needs more than the engine's budget
    (``Engine(over_budget="raise")``). The budget and everything else stay as they were; a
    budget of at least ``over.minimum_mb`` (or a smaller input) runs it."""

    def __init__(self, over: OverBudget) -> None:
        super().__init__(f"{over.describe()}: frame not run (over_budget='raise'); raise the budget to at least "
                         f"{over.minimum_mb:.1f} MB or feed a smaller input")
        self.over = over

    @property
    def shapes(self) -> str:
        return self.over.shapes

    @property
    def minimum_mb(self) -> float:
        return self.over.minimum_mb


@dataclass(frozen=True)
class WindowStats:
    """The streamed weights window of an executor running under a budget (swap/streamed.py)."""

    layout: str                  # graph the weights belong to: "nchwc" or "as-given"
    store: str                   # directory of the weight file
    weight_bytes: int            # bytes of all weights in the file
    weight_span_bytes: int       # the same in whole pages (what the window holds when all are resident)
    allowance_bytes: int         # weight bytes the budget leaves the window
    pinned_bytes: int            # weights never dropped (latest-used, when the allowance has room)
    resident_weight_bytes: int   # weights resident now
    peak_resident_bytes: int     # most weights resident at once
    nonweight_bytes: int         # the engine's footprint besides weights at the input size (swap/footprint.py)
    min_budget_bytes: int        # smallest budget the window accepts now
    budget_bytes: int | None     # the budget in force (None: every weight resident)
    predicted_peak_bytes: int    # non-weight footprint + allowance
    io_mode: str                 # "direct" (O_DIRECT) or "buffered"
    frames: int
    last_frame_read_bytes: int   # weight bytes read during the last frame
    last_frame_stall_ms: float   # time the last frame waited for weights
    read_mb_s: float | None      # measured read rate
    split_bytes: int             # largest piece a fully-connected weight was split into
    rebuilt_reason: str | None   # why the weight file was rebuilt when it was opened (None: it was current)
    #: the input size now run above the budget (over_budget="run"; None: the budget holds)
    over_budget: OverBudget | None = None
    over_budget_frames: int = 0  # frames run above the budget so far


@dataclass(frozen=True)
class ExecutorStats:
    """What an executor reports about itself; ``Engine.engine_stats()`` adds the engine's part."""

    arena_bytes: int | None = None            # activation arena (planned engine)
    blocks: int = 1                           # units of weight residency (segments that read weights)
    resident_weight_bytes: int | None = None  # weights resident now, where they can be swapped
    window: WindowStats | None = None         # the streamed weights window, when there is one
    #: backend-specific details for diagnostics (plans, kernel versions, TensorRT engine state)
    details: Mapping[str, Any] = field(default_factory=dict)


class Executor(Protocol):
    """Runs one model; what every backend provides."""

    name: str

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the model on validated feeds; outputs in graph order, keyed by name."""

    def close(self) -> None:
        """Release sessions and buffers (idempotent)."""

    def executor_stats(self) -> ExecutorStats:
        """Typed statistics for Engine.engine_stats() and the nodes."""

    def arena_bytes_at(self, shapes: Mapping[str, tuple[int, ...]]) -> int | None:
        """Activation memory at these input shapes where the executor plans it (None: unknown)."""


class BudgetedExecutor(Executor, Protocol):
    """An executor that runs inside a memory budget it can be given and changed between frames."""

    def set_budget(self, budget_bytes: int | None) -> None:
        """Hold at most ``budget_bytes`` (resident weights + its footprint besides them; None:
        unlimited); ValueError below the minimum, the previous budget then stays in force."""

    def min_budget_bytes(self, shapes: Mapping[str, tuple[int, ...]] | None = None) -> int:
        """The smallest budget it accepts at ``shapes`` (default: the input shapes in force)."""

    def lowest_level_bytes(self) -> int:
        """The lowest budget a latency table offers."""

    def inmemory_bytes(self, shapes: Mapping[str, tuple[int, ...]] | None = None) -> int:
        """Its footprint with every weight resident."""

    @property
    def compute_ms(self) -> float | None:
        """Smoothed frame time without waits for weights (None before the first frame)."""

    def latency_table(self, top_bytes: int, compute_ms: float | None = None) -> list[tuple[float, float]]:
        """(budget MB, predicted ms) from the lowest level up to ``top_bytes``; ``compute_ms`` is
        assumed until the executor has measured its own."""

    def calibrate(self, shapes: Mapping[str, tuple[int, ...]]) -> None:
        """Judge budgets at ``shapes`` from now on (the footprint there is measured once per model
        and shapes, in a child process)."""
