"""Latency and rate bookkeeping for node diagnostics — no ROS imports."""
from __future__ import annotations

import statistics
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np


@dataclass
class FrameStats:
    """Counters and a sliding latency window shared by a node's callback and worker threads."""

    window: int = 50  # frames: short enough that p50/p95 follow resolution changes
    received: int = 0
    processed: int = 0
    dropped: int = 0   # replaced by a newer frame before the worker took it (stale)
    failed: int = 0    # bad message or inference error
    _latencies_ms: deque = field(default_factory=deque)
    _done_times: deque = field(default_factory=deque)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, latency_ms: float) -> None:
        with self._lock:
            self.processed += 1
            self._latencies_ms.append(float(latency_ms))
            while len(self._latencies_ms) > self.window:
                self._latencies_ms.popleft()
            now = time.monotonic()
            self._done_times.append(now)
            while self._done_times and now - self._done_times[0] > 5.0:
                self._done_times.popleft()

    @property
    def last_ms(self) -> float | None:
        with self._lock:
            return self._latencies_ms[-1] if self._latencies_ms else None

    def percentiles(self) -> tuple[float | None, float | None]:
        """p50 and p95 of the latency window (None before the first frame)."""
        with self._lock:
            if not self._latencies_ms:
                return None, None
            values = np.fromiter(self._latencies_ms, dtype=np.float64)
        return float(np.percentile(values, 50)), float(np.percentile(values, 95))

    def rate_hz(self) -> float:
        """Frames finished per second over the last ~5 s."""
        with self._lock:
            now = time.monotonic()
            while self._done_times and now - self._done_times[0] > 5.0:
                self._done_times.popleft()
            if len(self._done_times) < 2:
                return 0.0
            span = max(now - self._done_times[0], 1e-6)
            return (len(self._done_times) - 1) / span if span < 5.0 else len(self._done_times) / 5.0


@dataclass
class StampGaps:
    """Frames a node can tell it never got, from the header stamps of those it did.

    A stamp older than the newest one seen arrived out of order (``out_of_order``). A step
    between consecutive stamps of more than 1.5 camera periods means frames went missing
    between them (``lost`` += the periods skipped); the camera's period is the median of the
    last ``window`` steps, so a camera that changes its rate is followed, and nothing is counted
    before ``min_steps`` steps have been seen. A camera that pauses (a driver restart, a bag
    with a gap) also counts as lost frames: the node cannot tell the two apart."""

    window: int = 20
    min_steps: int = 3
    lost: int = 0
    out_of_order: int = 0
    _last_ns: int | None = None
    _steps: deque = field(default_factory=deque)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def observe(self, stamp_ns: int) -> None:
        with self._lock:
            last, self._last_ns = self._last_ns, stamp_ns if self._last_ns is None else max(self._last_ns, stamp_ns)
            if last is None:
                return
            if stamp_ns < last:
                self.out_of_order += 1
                return
            step = stamp_ns - last
            if step == 0:
                return
            if len(self._steps) >= self.min_steps:
                period = float(statistics.median(self._steps))   # 20 ints: cheaper than numpy's
                if step > 1.5 * period:
                    self.lost += int(round(step / period)) - 1
            self._steps.append(step)
            while len(self._steps) > self.window:
                self._steps.popleft()


#: A camera that sent nothing for this long is reported silent in its own status (WARN); the
#: other cameras keep being served meanwhile.
SILENT_S = 2.0


@dataclass
class CameraStats:
    """One camera's share of a multi-camera core's frames: its counters, latency (from the
    frame's arrival to its outputs: the mailbox wait and the batch window included) and lost
    frames, told from its own stamps."""

    frames: FrameStats = field(default_factory=FrameStats)
    gaps: StampGaps = field(default_factory=StampGaps)
    last_arrival: float | None = None   # monotonic time of its last frame

    def received(self, stamp_ns: int) -> None:
        self.gaps.observe(stamp_ns)
        self.frames.received += 1
        self.last_arrival = time.monotonic()

    def silent_s(self) -> float | None:
        """Seconds since its last frame (None: none yet)."""
        last = self.last_arrival
        return None if last is None else time.monotonic() - last

    def values(self) -> dict[str, float | int | None]:
        """The counters as a status publishes them (keys without the camera's prefix)."""
        p50, p95 = self.frames.percentiles()
        return {"received": self.frames.received, "processed": self.frames.processed,
                "dropped": self.frames.dropped, "failed": self.frames.failed, "missing": self.gaps.lost,
                "hz": self.frames.rate_hz(), "latency_p50_ms": p50, "latency_p95_ms": p95}
