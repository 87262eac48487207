"""The largest batch a serving core runs inside its node's memory budget.

Why: a batch of N frames needs the engine's minimum at N frames (its activations grow with the
batch) plus N frames' buffers. Under a budget that cannot hold the largest batch the node forms,
the core runs smaller batches, the largest that fits, rather than run above its budget, and says
so (WARN). Sizing a batch may first measure the engine at that input in a child process
(seconds), so it runs on a thread of its own; until it is known the core runs one frame at a
time, which never needs more than the single frames it ran before.
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from dynnet_ros.perception.budget_split import FrameCosts
from dynnet_ros.perception.core import PerceptionCore


@dataclass(frozen=True)
class BatchNeed:
    """What a batch size needs: the engine's minimum plus the frame buffers, MB."""

    batch: int
    need_mb: float


def batch_need(core: PerceptionCore, costs: FrameCosts, batch: int, height: int, width: int, cameras: int,
               message_bytes: int) -> BatchNeed:
    """The budget a batch of ``batch`` ``height x width`` frames needs, with every one of
    ``cameras`` cameras' ``message_bytes`` messages in flight."""
    box = core.preprocess.plan(height, width)
    frames = costs.batch_bytes([message_bytes] * cameras, [box] * batch).total_mb
    return BatchNeed(batch, core.min_budget_mb_at(height, width, batch) + frames)


def largest_fitting(core: PerceptionCore, costs: FrameCosts, budget_mb: float, limit: int, height: int, width: int,
                    cameras: int, message_bytes: int) -> tuple[int, BatchNeed]:
    """The largest batch up to ``limit`` whose need fits in ``budget_mb`` (0: not even one
    frame), and the need of ``limit`` frames."""
    full = batch_need(core, costs, limit, height, width, cameras, message_bytes)
    if full.need_mb <= budget_mb:
        return limit, full
    for batch in range(limit - 1, 0, -1):
        if batch_need(core, costs, batch, height, width, cameras, message_bytes).need_mb <= budget_mb:
            return batch, full
    return 0, full


def lowered(fits: int, limit: int, budget_mb: float, full: BatchNeed, width: int, height: int) -> str:
    """The WARN message of a batch lowered to ``fits`` frames from ``limit``."""
    return (f"batches of {fits}, not {limit}: memory_budget_mb {budget_mb:g} is below the {full.need_mb:.1f} MB "
            f"that {limit} frames of {width}x{height} need (engine minimum and frame buffers)")


class BatchBudget:
    """The batch cap under the node's budget now: ``cap`` (None: no cap), and ``reason`` while it
    is below the batch the node forms (''). ``update`` is called per batch, cheap unless its
    inputs changed."""

    def __init__(self, costs: FrameCosts, changed: Callable[[], None], warn: Callable[[str], None],
                 name: str) -> None:
        """``changed``: the cap or its reason changed (publish the status)."""
        self._costs, self._changed, self._warn, self._name = costs, changed, warn, name
        self._lock = threading.Lock()
        self._key: tuple | None = None
        self._last: tuple | None = None   # the last update's inputs but the budget (what ``refit`` sizes)
        self.cap: int | None = None
        self.reason = ""

    def update(self, core: PerceptionCore, budget_mb: float, limit: int, height: int, width: int, cameras: int,
               message_bytes: int) -> None:
        """Re-size the cap when the budget, the core, the batch the node forms or the frame size
        changed: batches of 1 at once, the largest that fits once sized."""
        key = (id(core), float(budget_mb), limit, height, width, cameras, message_bytes)
        with self._lock:
            if key == self._key:
                return
            self._key = key
            self._last = (core, limit, height, width, cameras, message_bytes)
            if not budget_mb or limit <= 1:
                self.cap, self.reason = None, ""
                return
            self.cap = 1

        def work() -> None:
            try:
                fits, full = largest_fitting(core, self._costs, float(budget_mb), limit, height, width, cameras,
                                             message_bytes)
            except ValueError as exc:   # the engine cannot size that batch: stay at one frame per run
                fits, reason = 1, f"batches of 1, not {limit}: the batch's memory is unknown ({exc})"
            else:
                fits = max(fits, 1)   # not even one frame fits: that overrun is reported as such
                reason = "" if fits == limit else lowered(fits, limit, budget_mb, full, width, height)
            with self._lock:
                if self._key != key:   # changed meanwhile: the newer sizing decides
                    return
                self.cap, self.reason = fits, reason
            if reason:
                self._warn(reason)
            self._changed()

        threading.Thread(target=work, name=f"{self._name}-batch-size", daemon=True).start()

    def refit(self, budget_mb: float) -> bool:
        """Size the cap for a new ``budget_mb`` now (on the caller's thread), for the frames last
        served: True when a smaller batch fits it where the batch served does not (the budget can
        then be taken, the batch lowered first), False when the batch is not what is too large."""
        with self._lock:
            last = self._last
        if last is None or not budget_mb:
            return False
        core, limit, height, width, cameras, message_bytes = last
        if limit <= 1:
            return False
        fits, full = largest_fitting(core, self._costs, float(budget_mb), limit, height, width, cameras, message_bytes)
        if not 0 < fits < limit:
            return False
        reason = lowered(fits, limit, budget_mb, full, width, height)
        with self._lock:
            self._key = (id(core), float(budget_mb), limit, height, width, cameras, message_bytes)
            self.cap, self.reason = fits, reason
        self._warn(reason)
        self._changed()
        return True
