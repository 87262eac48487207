"""The frame mailbox and the workers that serve it: newest frame wins, latency bounded by the runs in flight.

Why: a camera callback must never wait for a model, and a model must never work through a
queue of stale frames. The callback parks each frame in a one-slot mailbox per source (a camera),
replacing, and so dropping, an older frame of that source still waiting; one worker thread takes
what is waiting and serves it. Sources are served least recently served first, then in the order
they began waiting (a frame that replaces another keeps its source's place), so a worker that
cannot keep up drops every camera's frames alike and one busy camera cannot starve another.
With several cameras the worker takes their frames as one batch (``batching.form_batch``
decides which and when: a silent camera delays the others by at most the batch window). With a
rate cap the worker waits out the rest of each period before it takes the next batch, and
frames arriving meanwhile go through the same slots.

With ``workers`` > 1 several batches are in flight: each worker thread takes a batch when it is
free (one worker forms and takes a batch at a time), so one batch's decoding and
post-processing overlap another's engine run. Each batch gets a ``turns.Turn`` in take order;
what must leave the node in order (its results, its counters) runs inside that turn.
Plain Python: the adapter's messages travel as opaque payloads.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from dynnet_ros.perception.batching import BatchPolicy, Waiting, form_batch
from dynnet_ros.perception.turns import Turn, Turns

#: How often a worker waiting for a frame or out a rate cap looks at its stop flag and re-reads
#: the cap: a lowered or cleared cap (or a stop) takes effect within this time.
POLL_S = 0.2


@dataclass
class Arrival:
    """One frame as it arrived: where from, its stamp, and the adapter's message (decoded by the
    worker; ``payload`` is taken out of the arrival there, so the worker holds the only reference).
    ``arrived``: when the mailbox got it (its clock, seconds)."""

    source: str
    stamp_ns: int
    frame_id: str
    payload: Any
    arrived: float = 0.0
    since: float = 0.0   # when its source began waiting: a frame it replaced keeps its place


class Mailbox:
    """One slot per source; a frame replaces the one of its source still waiting."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._changed = threading.Condition()
        self._slots: dict[str, Arrival] = {}   # insertion order: the source waiting longest first
        self._served: dict[str, int] = {}      # source -> the take count when it was last served
        self._takes = 0      # frames taken so far: the order sources were served in
        self._puts = 0       # frames parked so far: a waiting worker sees a new one
        self._woken = False  # wake() was called: a waiting worker returns to look at its stop flag

    def put(self, arrival: Arrival) -> Arrival | None:
        """Park ``arrival`` (stamped with its arrival time); the frame of its source it replaced
        (dropped), if any."""
        with self._changed:
            arrival.arrived = self.clock()
            replaced = self._slots.get(arrival.source)
            arrival.since = arrival.arrived if replaced is None else replaced.since
            self._slots[arrival.source] = arrival   # a replaced key keeps its place in the order
            self._puts += 1
            self._changed.notify_all()
        return replaced

    def take(self) -> Arrival | None:
        """The waiting frame whose turn it is (``Waiting.turn_key``; None: none waits)."""
        with self._changed:
            if not self._slots:
                return None
            source = min(self._waiting(), key=lambda w: w.turn_key).source
            return self._pop(source)

    def take_sources(self, sources: Iterable[str]) -> list[Arrival]:
        """The waiting frames of ``sources``, in that order (a source with none is left out)."""
        with self._changed:
            return [self._pop(source) for source in sources if source in self._slots]

    def waiting(self) -> tuple[list[Waiting], int]:
        """The frames waiting (source, arrival, when their source was served) and the count of
        frames parked so far."""
        with self._changed:
            return self._waiting(), self._puts

    def _waiting(self) -> list[Waiting]:
        return [Waiting(a.source, a.arrived, a.since, self._served.get(a.source, -1)) for a in self._slots.values()]

    def _pop(self, source: str) -> Arrival:
        self._served[source] = self._takes
        self._takes += 1
        return self._slots.pop(source)

    def wait(self, timeout: float) -> bool:
        """Block until a frame may be waiting (or ``timeout``); whether one may."""
        with self._changed:
            self._changed.wait_for(lambda: bool(self._slots) or self._woken, timeout)
            self._woken = False
            return bool(self._slots)

    def wait_for_put(self, puts: int, timeout: float) -> None:
        """Block until a frame is parked after the ``puts``-th (``waiting``), a wake, or ``timeout``."""
        with self._changed:
            self._changed.wait_for(lambda: self._puts != puts or self._woken, timeout)
            self._woken = False

    def wake(self) -> None:
        """Wake a waiting worker (to see a stop)."""
        with self._changed:
            self._woken = True
            self._changed.notify_all()


class FrameWorker:
    """The threads that serve the mailbox: ``serve(arrivals, turn)`` per batch taken, at most
    ``rate_hz()`` batches a second (<= 0: as fast as frames come), with up to ``workers``
    batches in flight. ``batching()`` gives the policy and the batch limit now (limit 1: each
    frame on its own, as soon as it is taken). ``serve`` runs its in-order part inside ``turn``
    (a batch that never does has its turn taken for it) and reports its own failures; an
    exception escaping it goes to ``on_error`` and the worker carries on."""

    def __init__(self, mailbox: Mailbox, serve: Callable[[list[Arrival], Turn], None], rate_hz: Callable[[], float],
                 on_error: Callable[[BaseException], None], name: str,
                 batching: Callable[[], tuple[BatchPolicy, int]] | None = None, workers: int = 1) -> None:
        if workers < 1:
            raise ValueError(f"a frame worker needs at least one thread, got {workers}")
        self._mailbox, self._serve, self._rate_hz, self._on_error = mailbox, serve, rate_hz, on_error
        self._batching = batching
        self._stop = threading.Event()
        self._taking = threading.Lock()   # one thread forms and takes a batch at a time: tickets follow takes
        self.turns = Turns()
        self._last_take: float | None = None   # monotonic time the last batch was taken (the rate cap)
        self.threads = [threading.Thread(target=self._loop, name=name if workers == 1 else f"{name}-{index}",
                                         daemon=True) for index in range(workers)]

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def stop(self) -> None:
        """Stop taking frames, without waiting for the batches being served; batches waiting for
        their turn go at once."""
        self._stop.set()
        self._mailbox.wake()
        self.turns.close()

    def alive(self) -> list[threading.Thread]:
        """The worker threads still running."""
        return [thread for thread in self.threads if thread.is_alive()]

    def join(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds in all for the worker threads to end."""
        deadline = time.monotonic() + timeout
        for thread in self.threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))

    def _take(self) -> tuple[list[Arrival], Turn] | None:
        """The next batch and its turn (None: nothing taken this time round)."""
        with self._taking:
            if self._stop.is_set() or not self._mailbox.wait(POLL_S):
                return None
            self._wait_for_rate()
            arrivals = self._next_batch()
            if not arrivals:
                return None
            self._last_take = time.monotonic()
            return arrivals, Turn(self.turns, self.turns.ticket())

    def _loop(self) -> None:
        while not self._stop.is_set():
            taken = self._take()
            if taken is None:
                continue
            arrivals, turn = taken
            try:
                self._serve(arrivals, turn)
            except Exception as exc:  # noqa: BLE001 — the worker must keep serving; the reason is reported
                if self._stop.is_set():
                    return
                self._on_error(exc)
            finally:
                turn.end()

    def _next_batch(self) -> list[Arrival]:
        """The frames to serve now: the one whose turn it is alone when not batching, else what
        ``form_batch`` takes once it decides (a new frame or the decision's time re-asks it)."""
        opened = self._mailbox.clock()
        while not self._stop.is_set():
            policy, limit = self._batching() if self._batching is not None else (None, 1)
            if policy is None or limit <= 1:
                arrival = self._mailbox.take()
                return [] if arrival is None else [arrival]
            waiting, puts = self._mailbox.waiting()
            if not waiting:
                return []
            decision = form_batch(waiting, self._mailbox.clock(), opened, policy, limit)
            if decision.take:
                return self._mailbox.take_sources(decision.take)
            self._mailbox.wait_for_put(puts, min(decision.wait_s, POLL_S))
        return []

    def _wait_for_rate(self) -> None:
        """Wait until the rate cap allows the next batch: its period counted from the last one
        taken. The frames stay in the mailbox meanwhile, where newer ones replace them. The cap
        is re-read every ``POLL_S``, so a change applies to a wait under way."""
        while not self._stop.is_set():
            rate, last = float(self._rate_hz()), self._last_take
            if rate <= 0.0 or last is None:
                return
            remaining = last + 1.0 / rate - time.monotonic()
            if remaining <= 0.0:
                return
            self._stop.wait(min(remaining, POLL_S))
