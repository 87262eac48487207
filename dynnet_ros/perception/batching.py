"""When a serving core's worker runs the frames waiting from several cameras as one batch.

Why a pure policy: the decision (take these cameras' frames now, or wait this long for more) is
what bounds every camera's latency, and it must be testable with a fake clock, apart from the
threads that act on it. The worker (``mailbox.FrameWorker``) calls ``form_batch`` with the
frames waiting (one per camera: the mailbox keeps each camera's newest) and acts on the answer.

The rules (the ``batch_window_ms``, ``max_batch`` and ``max_latency_ms`` parameters):

* The batch opens when the worker, free, first finds a frame waiting. It then waits up to
  ``window_s`` for the other cameras' frames, so cameras triggered at the same rate but not in
  sync share one model run.
* It never waits past the oldest waiting frame's arrival plus ``max_latency_s``: a frame that
  already waited out a long run is not held back further to fill a batch.
* It runs at once when ``limit`` frames wait (``max_batch``, at most one frame per camera; 0:
  the cameras shared between the batches in flight, ``BatchPolicy.limit``):
  a camera that stops publishing costs the others at most the window, never a stall.
* The frames taken are those of the ``limit`` cameras served least recently, and among cameras
  served equally recently those waiting longest (a replaced frame keeps its camera's place); the
  rest wait for the next batch. Serving order, not arrival order, comes first: cameras triggered
  together arrive in the same order every period, and a worker that frees up takes whatever waits
  then, so by arrival alone the camera that publishes first would win every period the worker
  falls behind in.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Waiting:
    """A frame waiting in the mailbox: its camera, when it arrived (the worker's clock, s), since
    when its camera has had a frame waiting (``since``; None: since this frame arrived) and when
    its camera was last served (``served``: the mailbox's take count then; -1: never).
    A newer frame replacing a waiting one keeps the camera's place: among cameras served equally
    recently, they are taken in the order they began waiting, so a camera whose frames keep being
    replaced is not passed over by cameras that publish a little earlier in each period."""

    source: str
    arrived: float
    since: float | None = None
    served: int = -1

    @property
    def waiting_since(self) -> float:
        return self.arrived if self.since is None else self.since

    @property
    def turn_key(self) -> tuple[int, float]:
        """The order cameras are taken in: least recently served first, then waiting longest."""
        return self.served, self.waiting_since


@dataclass(frozen=True)
class BatchPolicy:
    """``window_s``: how long an open batch waits for more frames (0: no batching);
    ``max_batch``: the most frames in one batch (<= 0: one per camera); ``max_latency_s``: the
    deadline counted from the oldest waiting frame's arrival."""

    window_s: float
    max_batch: int
    max_latency_s: float

    def __post_init__(self) -> None:
        if not (self.window_s >= 0.0 and self.max_latency_s >= 0.0):
            raise ValueError(f"batch window and latency must be >= 0 s, got {self.window_s}, {self.max_latency_s}")

    @classmethod
    def from_params(cls, params: dict) -> BatchPolicy:
        """The policy a model node's parameters set (``batch_window_ms``, ``max_batch``, ``max_latency_ms``)."""
        return cls(float(params["batch_window_ms"]) / 1e3, int(params["max_batch"]),
                   float(params["max_latency_ms"]) / 1e3)

    def limit(self, cameras: int, model_max: int, in_flight: int = 1) -> int:
        """The largest batch formed with ``cameras`` sources, ``in_flight`` batches served at once
        and a model that takes at most ``model_max`` frames per run (without batching: 1).
        ``max_batch`` <= 0 shares the cameras between the batches in flight (rounded up): the
        frames in flight are then about one per camera, as one batch of every camera holds, so
        the batches' buffers and the engine's activations (sized for one batch) stay what one
        batch of all cameras needs, and a frame waits for at most one smaller batch's run."""
        if self.window_s <= 0.0:
            return 1
        wanted = -(-cameras // max(1, in_flight)) if self.max_batch <= 0 else min(self.max_batch, cameras)
        return max(1, min(wanted, model_max))


@dataclass(frozen=True)
class Batch:
    """The decision: ``take`` the frames of these sources now (oldest first), or, when empty,
    decide again within ``wait_s`` (sooner if a frame arrives)."""

    take: tuple[str, ...]
    wait_s: float


def form_batch(waiting: Sequence[Waiting], now: float, opened: float, policy: BatchPolicy, limit: int) -> Batch:
    """What to run at ``now`` for a batch opened at ``opened`` (see module doc); ``limit``: the
    largest batch (``BatchPolicy.limit``). No frame waiting: nothing to take, wait indefinitely."""
    if limit < 1:
        raise ValueError(f"a batch limit must be >= 1, got {limit}")
    if not waiting:
        return Batch((), math.inf)
    in_turn = sorted(waiting, key=lambda w: w.turn_key)
    take = tuple(w.source for w in in_turn[:limit])
    if len(in_turn) >= limit or policy.window_s <= 0.0:
        return Batch(take, 0.0)
    deadline = min(opened + policy.window_s, min(w.arrived for w in waiting) + policy.max_latency_s)
    if now >= deadline:
        return Batch(take, 0.0)
    return Batch((), deadline - now)
