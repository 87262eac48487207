"""Model-node side of the budget protocol: publish this node's profile on dynnet/model_profiles.

Kept apart from ModelNode so the base class only needs two lines to take part (see
docs/budget.md for the message schema).
"""
from __future__ import annotations

import time
from typing import Any, Callable

from rclpy.node import Node
from std_msgs.msg import String

from dynnet_ros.budget.profile import ProfileHold, engine_profile
from dynnet_ros.budget.protocol import PROFILES_TOPIC
from dynnet_ros.budget.sources import ProcessMemory, process_memory


def memory_now() -> ProcessMemory:
    """This process's memory now (RSS and its anonymous part): the baseline before a model loads."""
    return process_memory()


class ProfilePublisher:
    """Publishes ``engine_profile(...)`` of a node's current engine about once a second.

    ``baseline`` is the process memory measured just before the model loaded, so ``held_mb`` =
    RSS growth since then, the same quantity the engine's budget bounds (and ``anon_held_mb``
    its anonymous part, which the manager's pool accounting uses).
    """

    def __init__(self, node: Node, engine: Callable[[], Any], budget_mb: Callable[[], float | None],
                 baseline: ProcessMemory, period_s: float = 1.0,
                 latency_ms: Callable[[], float | None] | None = None) -> None:
        self._node, self._engine, self._budget = node, engine, budget_mb
        self._latency = latency_ms
        self.baseline = baseline
        self.hold = ProfileHold()   # bounds of the largest input size seen lately (no flapping)
        self._engine_id: int | None = None
        self._pub = node.create_publisher(String, PROFILES_TOPIC, 10)
        node.create_timer(period_s, self.publish)

    def publish(self) -> None:
        try:
            engine = self._engine()
            now = process_memory()
            fallback = self._latency() if self._latency is not None else None
            if fallback is None:
                fallback = (engine.stats() or {}).get("last_latency_ms")
            profile = engine_profile(self._node.get_fully_qualified_name(), engine, rss_mb=now.rss_mb,
                                     held_mb=max(0.0, now.rss_mb - self.baseline.rss_mb),
                                     anon_held_mb=max(0.0, now.anon_mb - self.baseline.anon_mb),
                                     budget_mb=self._budget(), fallback_ms=fallback)
            if id(engine) != self._engine_id:  # a new model: its old input sizes say nothing
                self._engine_id = id(engine)
                self.hold.reset()
            profile = self.hold.update(profile, time.monotonic())
            self._pub.publish(String(data=profile.to_json()))
        except Exception as exc:  # noqa: BLE001 — a profile is advisory; never take the node down
            if self._node.context.ok():
                self._node.get_logger().warn(f"budget profile not published: {exc}",
                                             throttle_duration_sec=10.0)
