"""Model-node side of the budget protocol: publish this node's profile on dynnet/model_profiles.

Kept apart from ModelNode so the base class only needs two lines to take part (see
docs/budget.md for the message schema).
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace
from functools import lru_cache
from typing import Any

from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.node import Node
from std_msgs.msg import String

from dynnet_ros.budget.profile import ProfileHold, engine_profile
from dynnet_ros.budget.protocol import PROFILES_TOPIC, ModelProfile
from dynnet_ros.memtrim import release_memory
from dynnet_ros.nodes.base import steady_timer
from dynnet_ros.procmem import ProcessMemory, process_memory
from dynnet_ros.settings import settings

#: How long closing waits for a profile being published; within the shutdown watchdog's limit.
CLOSE_WAIT_S = 0.5


def memory_now() -> ProcessMemory:
    """This process's memory now (RSS and its anonymous part): the baseline before a model loads."""
    return process_memory()


@lru_cache(maxsize=1)
def prewarm_runtime() -> None:
    """Settle the model-independent state before the budget baseline is taken.

    Why: a budget bounds what the process holds *for the model*; the engine's modules (imported
    with this module) are the same for every model and stay after a model is closed, like rclpy
    itself, so they belong to the reserve, and the heap freed while importing them goes back to
    the OS first. onnx's C++ library (checker, shape inference, schemas) is not loaded here: a
    serving process reads models with onnx's protobuf classes alone and checks them in a child.
    onnxruntime's environment is *not* warmed here: the engine's overhead already counts it.
    """
    release_memory()


def shift_profile(profile: ModelProfile, frame_mb: float) -> ModelProfile:
    """The engine's profile as the node's: every budget level plus the node's frame buffers.

    Only where the engine published a table (it swaps); a single-point profile is already the
    node's measured footprint, which includes the frame buffers.
    """
    if not profile.table or frame_mb <= 0:
        return profile

    def add(mb: float | None) -> float | None:
        return None if mb is None else mb + frame_mb

    return replace(profile, min_mb=add(profile.min_mb), full_mb=add(profile.full_mb),
                   table=tuple((mb + frame_mb, ms) for mb, ms in profile.table))


class ProfilePublisher:
    """Publishes ``engine_profile(...)`` of a node's current engine about once a second.

    ``baseline`` is the process memory measured just before the model loaded, so ``held_mb`` =
    RSS growth since then, the same quantity the node's budget bounds (and ``anon_held_mb``
    its anonymous part, which the manager's pool accounting uses). ``frame_mb`` is what the
    node holds per frame outside its engine; the published levels include it. ``size`` is the
    model-input size class ("HxW") the engine last ran (None before its first frame): the
    profile keeps a minimum per class (``ProfileHold``), and stays ``measured: false`` (no
    budget from the manager) until the node's announced minimums are known (``announce``).
    ``publish`` runs on the node's timer and, on a size class the hold has not seen, from the
    worker right away. ``units``: the compute units whose memory the node asks the manager for
    (``mapping: auto``). ``held``: where the node shares its process with other model nodes (a
    component container), its own ``(held_mb, anon_held_mb)``, else None: RSS growth since the
    baseline would count what the neighbours loaded after it.
    """

    def __init__(self, node: Node, engine: Callable[[], Any], budget_mb: Callable[[], float | None],
                 baseline: ProcessMemory, period_s: float = 1.0,
                 latency_ms: Callable[[], float | None] | None = None,
                 frame_mb: Callable[[], float] | None = None,
                 size: Callable[[], str | None] | None = None,
                 units: Callable[[], tuple[str, ...]] | None = None,
                 held: Callable[[], tuple[float, float] | None] | None = None) -> None:
        self._node, self._engine, self._budget = node, engine, budget_mb
        self._held = held or (lambda: None)
        self._units = units or tuple
        self._latency = latency_ms
        self._frame_mb = frame_mb or (lambda: 0.0)
        self._size = size or (lambda: None)
        self._lock = threading.Lock()   # the timer, the worker and the announcer publish
        self._announced: tuple[int, dict[str, float]] | None = None   # (engine id, minimum per size class)
        self._closed = False
        self.baseline = baseline
        self.hold = ProfileHold()   # bounds of the largest input size seen lately (no flapping)
        self._engine_id: int | None = None
        self._pub = node.create_publisher(String, PROFILES_TOPIC, 10)
        # its own callback group: sizing a model at a new input size (seconds, in a child process)
        # never holds up the node's parameter services, which share the default group
        steady_timer(node, period_s, self._on_timer, MutuallyExclusiveCallbackGroup())

    def announce(self, engine: Any, minimums: dict[str, float]) -> None:
        """Minimums per size class of ``engine`` known before such frames arrive (the node's
        ``camera_sizes``); published from then on, each at least what was measured."""
        with self._lock:
            self._announced = (id(engine), dict(minimums))

    def knows(self, size: str) -> bool:
        """Whether the published profile already holds a minimum for input size class ``size``."""
        return size in self.hold.sizes()

    def publish(self) -> None:
        with self._lock:
            if not self._closed:
                self._publish()

    def _on_timer(self) -> None:
        """The periodic publish; skipped while another one (a new size class, an announcement) is
        under way, which publishes the same profile."""
        if not self._lock.acquire(blocking=False):
            return
        try:
            if not self._closed:
                self._publish()
        finally:
            self._lock.release()

    def stop(self) -> None:
        """No publishing from now on (``close`` without the wait)."""
        self._closed = True

    def close(self) -> None:
        """No publishing from now on: the node is about to be destroyed, and the worker or the
        announcing thread may still try. Waits briefly for a publish in flight; one still sizing
        the model in a child process (seconds) sees the flag before it publishes instead."""
        self.stop()
        if self._lock.acquire(timeout=CLOSE_WAIT_S):
            self._lock.release()

    def _publish(self) -> None:
        try:
            engine = self._engine()
            now = process_memory()
            fallback = self._latency() if self._latency is not None else None
            if fallback is None:
                fallback = engine.engine_stats().last_latency_ms
            held, anon_held = self._held() or (max(0.0, now.rss_mb - self.baseline.rss_mb),
                                               max(0.0, now.anon_mb - self.baseline.anon_mb))
            profile = engine_profile(self._node.get_fully_qualified_name(), engine, rss_mb=now.rss_mb,
                                     held_mb=held, anon_held_mb=anon_held,
                                     budget_mb=self._budget(), fallback_ms=fallback)
            profile = shift_profile(profile, self._frame_mb())
            if id(engine) != self._engine_id:  # a new model: its old input sizes say nothing
                self._engine_id = id(engine)
                self.hold.reset()
            announced = self._announced[1] if self._announced and self._announced[0] == id(engine) else None
            profile = self.hold.update(profile, time.monotonic(), self._size(), announced)
            if announced is None:  # a budget now could miss the size classes about to be announced
                profile = replace(profile, measured=False)
            profile = replace(profile, units=tuple(self._units()), host=settings().host_id)
            if not self._closed:
                self._pub.publish(String(data=profile.to_json()))
        except Exception as exc:  # noqa: BLE001 — a profile is advisory; never take the node down
            if self._node.context.ok():
                self._node.get_logger().warn(f"budget profile not published: {exc}",
                                             throttle_duration_sec=10.0)
