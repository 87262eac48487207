"""Serve every shape without a build stall: engine inside its profiles, CPU fallback outside.

A TensorRT build takes seconds to minutes, so a run must never wait for one. A shape inside one
of the current engine's profiles runs on that profile at once (switching profiles is cheap). A
shape outside every profile runs on the fallback executor (onnxruntime on the CPU) while a new
engine, planned over the old distribution plus every shape that missed, builds on a background
thread (``plan(samples)`` decides, ``build(plan)`` returns a runner with ``.profiles``); when it
is ready it replaces the old engine between two runs. Kept free of TensorRT so this policy is
unit-tested on any machine.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np

from dynnet_ros.engine.backends.trt_profiles import ProfileSet, Signature, as_signature
from dynnet_ros.engine.runtime.base import Executor

LOG = logging.getLogger(__name__)


class ProfiledRunner(Protocol):
    """A built engine: its profile set, and a run on one chosen profile."""

    profiles: ProfileSet

    def run(self, feeds: Mapping[str, np.ndarray], profile_index: int) -> dict[str, np.ndarray]: ...

    def close(self) -> None: ...


class NotServable(Exception):
    """Raised by a runner for feeds its engine cannot take although the shapes fit a profile
    (e.g. a shape-tensor input's *value* outside the built range): served by the fallback."""


class EngineSwitch:
    """Holds the current engine, routes each run, and rebuilds in the background on misses."""

    def __init__(self, samples: Mapping[Signature, float], *, plan: Callable[[dict], Any],
                 build: Callable[[Any], ProfiledRunner], fallback: Callable[[], Executor],
                 rebuild_on_miss: bool = True, background_initial: bool = False) -> None:
        self._samples = dict(samples)
        self._plan, self._build, self._make_fallback = plan, build, fallback
        self.rebuild_on_miss = rebuild_on_miss
        self._lock = threading.Lock()
        self._runner: ProfiledRunner | None = None
        self._fallback: Executor | None = None
        self._thread: threading.Thread | None = None
        self._misses: set[Signature] = set()
        self._failed: set[Signature] = set()
        self._closed = False
        self.engine_runs = self.fallback_runs = self.builds = 0
        self.last_error: str | None = None
        self.last_path = ""
        if background_initial:
            self._start_build()
        else:
            self._runner = build(plan(dict(self._samples)))  # errors surface to the caller
            self.builds = 1

    # ------------------------------------------------------------------ running
    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        sig = as_signature({name: value.shape for name, value in feeds.items()})
        with self._lock:
            runner = self._runner
            index = None if runner is None else runner.profiles.select(sig)
            if runner is not None and index is not None:
                try:
                    outputs = runner.run(feeds, index)
                except NotServable as exc:
                    LOG.warning("TensorRT cannot serve this run (%s); CPU fallback", exc)
                else:
                    self.engine_runs += 1
                    self.last_path = f"tensorrt profile {index}"
                    return outputs
            else:
                self._note_miss(sig)
        self.fallback_runs += 1
        self.last_path = "cpu fallback"
        return self._fallback_executor().run(feeds)

    def _fallback_executor(self) -> Executor:
        if self._fallback is None:
            self._fallback = self._make_fallback()
        return self._fallback

    def _note_miss(self, sig: Signature) -> None:
        """Record a shape outside every profile; start a rebuild unless one runs or it failed."""
        if sig in self._failed or not self.rebuild_on_miss:
            return
        if sig not in self._misses:
            LOG.info("TensorRT: shape %s outside every profile; CPU fallback while a new engine builds", sig)
        self._misses.add(sig)
        self._samples[sig] = self._samples.get(sig, 0.0) + 1.0
        if self._thread is None or not self._thread.is_alive():
            self._start_build()

    # ------------------------------------------------------------------ background builds
    def _start_build(self) -> None:
        samples = dict(self._samples)
        wanted = set(self._misses)
        thread = threading.Thread(target=self._build_and_swap, args=(samples, wanted),
                                  name="dynnet-trt-build", daemon=True)
        self._thread = thread
        thread.start()

    def _build_and_swap(self, samples: dict, wanted: set[Signature]) -> None:
        with self._lock:
            if self._closed:  # closed before this thread ran: the device may be gone
                return
        try:
            runner = self._build(self._plan(samples))
        except Exception as exc:  # noqa: BLE001 - the build thread reports any failure; the old engine keeps serving
            LOG.error("TensorRT rebuild failed (shapes %s stay on the CPU fallback): %s", sorted(wanted), exc)
            with self._lock:
                self.last_error = f"{type(exc).__name__}: {exc}"
                self._failed |= wanted
                self._misses -= wanted
            return
        with self._lock:
            closed = self._closed
            if not closed:
                old, self._runner = self._runner, runner
                self.builds += 1
                self.last_error = None
                self._misses = {s for s in self._misses if runner.profiles.select(s) is None}
        if closed:
            runner.close()
            return
        if old is not None:
            old.close()  # on this thread, before any next build: close() joins only the newest
        with self._lock:
            if self._misses and self.rebuild_on_miss and not self._closed:
                self._start_build()  # shapes that missed while this build ran

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until no build runs (tests, tools); True when idle."""
        while True:
            thread = self._thread
            if thread is None or not thread.is_alive():
                with self._lock:
                    if self._thread is thread:
                        return True
                continue
            thread.join(timeout)
            if thread.is_alive():
                return False

    # ------------------------------------------------------------------ info / teardown
    @property
    def profiles(self) -> ProfileSet | None:
        return None if self._runner is None else self._runner.profiles

    @property
    def building(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stats(self) -> dict:
        return {"engine_runs": self.engine_runs, "fallback_runs": self.fallback_runs, "builds": self.builds,
                "building": self.building, "last_error": self.last_error, "last_path": self.last_path,
                "profiles": None if self.profiles is None else self.profiles.describe()}

    def close(self) -> None:
        """Release engine and fallback. A background build cannot be interrupted, so this waits
        for it: the caller releases the CUDA context next, and a build still using it would fail
        on a dead context. The finished build's engine is released, not installed."""
        with self._lock:
            self._closed = True
            runner, self._runner = self._runner, None
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        if runner is not None:
            runner.close()
        if self._fallback is not None:
            self._fallback.close()
            self._fallback = None
