"""Latency and rate bookkeeping for node diagnostics — no ROS imports."""
from __future__ import annotations

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
