"""Multi-version kernels on CPU: shape-specialised segment sessions for hot shape signatures.

Why: a session whose inputs have concrete shapes lets onnxruntime constant-fold the shape
arithmetic inside the segment, pre-plan its memory pattern and pick shape-specific paths
(SoD² §4.5's multi-version code, with onnxruntime as the code generator). Building one costs
milliseconds to seconds, so it happens on a background thread once a signature turns hot; the
generic plan keeps serving meanwhile — a new shape never waits for a build. Each version
holds its own copy of its segments' weights, so the cache is bounded by bytes (LRU).
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

from dynnet_ros.bytesize import MB
from dynnet_ros.engine.plan.cache import LruCache

log = logging.getLogger(__name__)


@dataclass
class Version:
    """Specialised runners for one signature: segment index -> runner."""

    signature: Hashable
    runners: dict[int, object]
    cost_bytes: int
    seconds: float = 0.0
    generation: int = 0  # bumps when installed, so plans know to rebind


@dataclass
class VersionManager:
    """Counts signature uses, builds hot ones in the background, keeps them within a byte budget."""

    build: Callable[[Hashable], Version | None]      # runs on the worker thread
    hot_after: int = 3
    budget_bytes: int = 64 * MB
    max_versions: int = 8
    enabled: bool = True
    uses: dict = field(default_factory=dict)
    built: int = 0
    failed: int = 0

    def __post_init__(self) -> None:
        self.cache: LruCache[Version] = LruCache(self.max_versions, self.budget_bytes,
                                                 cost=lambda v: v.cost_bytes)
        self._pending: dict[Hashable, Future] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def get(self, signature: Hashable) -> Version | None:
        """The ready version for ``signature`` (never blocks); may schedule a build."""
        if not self.enabled:
            return None
        version = self.cache.get(signature)
        if version is not None:
            return version
        count = self.uses.get(signature, 0) + 1
        self.uses[signature] = count
        if count >= self.hot_after:
            self._schedule(signature)
        return None

    def _schedule(self, signature: Hashable) -> None:
        with self._lock:
            future = self._pending.get(signature)
            if future is not None:
                if not future.done():
                    return
                self._pending.pop(signature)
                self._install(signature, future)
                return
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dynnet-versions")
            self._pending[signature] = self._pool.submit(self.build, signature)

    def _install(self, signature: Hashable, future: Future) -> None:
        try:
            version = future.result()
        except Exception as exc:  # noqa: BLE001 - any failure to build leaves the generic plan
            log.warning("specialised version for %s failed: %s", signature, exc)
            self.failed += 1
            self.uses[signature] = -10**9  # do not retry this signature
            return
        if version is None or version.cost_bytes > self.budget_bytes:
            self.uses[signature] = -10**9
            return
        self.cache.put(signature, version)
        self.built += 1

    def wait(self, timeout: float | None = None) -> None:
        """Block until pending builds finish and install them (tests and benchmarks only)."""
        with self._lock:
            pending = list(self._pending.items())
        for signature, future in pending:
            wait([future], timeout=timeout)  # a failed build is logged and counted by _install
            with self._lock:
                if self._pending.get(signature) is future:
                    self._pending.pop(signature)
                    self._install(signature, future)

    def stats(self) -> dict:
        return {"enabled": self.enabled, "built": self.built, "failed": self.failed, "cached": len(self.cache),
                "bytes": self.cache.total_cost(), "budget_bytes": self.budget_bytes,
                "pending": sum(1 for f in self._pending.values() if not f.done())}

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        self.cache.clear()
