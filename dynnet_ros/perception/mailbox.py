"""The frame mailbox and the worker that serves it: newest frame wins, latency bounded by one run.

Why: a camera callback must never wait for a model, and a model must never work through a
queue of stale frames. The callback parks each frame in a one-slot mailbox per source (a camera),
replacing, and so dropping, an older frame of that source still waiting; one worker thread takes
whatever is waiting and serves it. Sources are served in the order their waiting frames arrived,
so one busy camera cannot starve another. With a rate cap the worker waits out the rest of each
period before it takes the next frame, and frames arriving meanwhile go through the same slots.
Plain Python: the adapter's messages travel as opaque payloads.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: How often a worker waiting for a frame or out a rate cap looks at its stop flag and re-reads
#: the cap: a lowered or cleared cap (or a stop) takes effect within this time.
POLL_S = 0.2


@dataclass
class Arrival:
    """One frame as it arrived: where from, its stamp, and the adapter's message (decoded by the
    worker; ``payload`` is taken out of the arrival there, so the worker holds the only reference)."""

    source: str
    stamp_ns: int
    frame_id: str
    payload: Any


class Mailbox:
    """One slot per source; a frame replaces the one of its source still waiting."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._slots: dict[str, Arrival] = {}   # insertion order: the source waiting longest first
        self._wake = threading.Event()

    def put(self, arrival: Arrival) -> Arrival | None:
        """Park ``arrival``; the frame of its source it replaced (dropped), if any."""
        with self._lock:
            replaced = self._slots.get(arrival.source)
            self._slots[arrival.source] = arrival   # a replaced key keeps its place in the order
            self._wake.set()
        return replaced

    def take(self) -> Arrival | None:
        """The waiting frame of the source waiting longest (None: none waits)."""
        with self._lock:
            if not self._slots:
                self._wake.clear()
                return None
            source = next(iter(self._slots))
            arrival = self._slots.pop(source)
            if not self._slots:
                self._wake.clear()
            return arrival

    def wait(self, timeout: float) -> bool:
        """Block until a frame may be waiting (or ``timeout``); whether one may."""
        return self._wake.wait(timeout)

    def wake(self) -> None:
        """Wake a waiting worker (to see a stop)."""
        self._wake.set()


class FrameWorker:
    """The thread that serves the mailbox: ``serve(arrival)`` per frame taken, at most
    ``rate_hz()`` frames a second (<= 0: as fast as frames come). ``serve`` reports its own
    failures; an exception escaping it goes to ``on_error`` and the worker carries on."""

    def __init__(self, mailbox: Mailbox, serve: Callable[[Arrival], None], rate_hz: Callable[[], float],
                 on_error: Callable[[BaseException], None], name: str) -> None:
        self._mailbox, self._serve, self._rate_hz, self._on_error = mailbox, serve, rate_hz, on_error
        self._stop = threading.Event()
        self._last_take: float | None = None   # monotonic time the last frame was taken (the rate cap)
        self.thread = threading.Thread(target=self._loop, name=name, daemon=True)

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        """Stop taking frames, without waiting for the frame being served."""
        self._stop.set()
        self._mailbox.wake()

    def _loop(self) -> None:
        while not self._stop.is_set():
            if not self._mailbox.wait(POLL_S):
                continue
            self._wait_for_rate()
            arrival = self._mailbox.take()
            if arrival is None:
                continue
            self._last_take = time.monotonic()
            try:
                self._serve(arrival)
            except Exception as exc:  # noqa: BLE001 — the worker must keep serving; the reason is reported
                if self._stop.is_set():
                    return
                self._on_error(exc)

    def _wait_for_rate(self) -> None:
        """Wait until the rate cap allows the next frame: its period counted from the last frame
        taken. The frame stays in the mailbox meanwhile, where a newer one replaces it. The cap
        is re-read every ``POLL_S``, so a change applies to a wait under way."""
        while not self._stop.is_set():
            rate, last = float(self._rate_hz()), self._last_take
            if rate <= 0.0 or last is None:
                return
            remaining = last + 1.0 / rate - time.monotonic()
            if remaining <= 0.0:
                return
            self._stop.wait(min(remaining, POLL_S))
