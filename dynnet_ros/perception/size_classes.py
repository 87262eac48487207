"""The minimum budget a serving core announces per input size class, before such frames arrive.

Why: the budget manager must not give a node a budget its next camera size cannot run in. A core
announces, for every camera size it expects (``camera_sizes``), the engine's minimum at that
model-input size plus the frame buffers of such a frame; sizes not expected are published once
seen. Both happen on threads of their own: the engine may first measure a size class in a child
process (seconds) while frames keep being served.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from dynnet_ros.budget.protocol import size_key
from dynnet_ros.perception.budget_split import FrameCosts
from dynnet_ros.perception.core import PerceptionCore
from dynnet_ros.sim.frames import parse_resolution


class ProfileSink(Protocol):
    """Where the minimums go: the node's budget profile (nodes/budget_profile.ProfilePublisher)."""

    def announce(self, engine: Any, minimums: dict[str, float]) -> None: ...

    def publish(self) -> None: ...

    def knows(self, size: str) -> bool: ...


def announced_minimums(core: PerceptionCore, camera_sizes: Iterable[str], costs: FrameCosts,
                       skipped: Callable[[str], None], batch: int = 1, cameras: int = 1) -> dict[str, float]:
    """The minimum budget per input size class for the cameras in ``camera_sizes`` ("WxH"): the
    engine's minimum at that input size and ``batch`` frames per run (the largest batch the node
    forms) plus the frame buffers for them, with each of ``cameras`` cameras' messages at the
    largest of those sizes (messages are charged at the largest size seen lately,
    ``budget_split.MESSAGE_HOLD_S``). A class the engine cannot size is left to be measured
    (``skipped`` gets the reason)."""
    sizes = [parse_resolution(text) for text in camera_sizes]
    message_bytes = max((w * h * 3 for w, h in sizes), default=0)
    out: dict[str, float] = {}
    for width, height in sizes:
        box = core.preprocess.plan(height, width)
        try:
            engine_mb = core.min_budget_mb_at(height, width, batch)
        except ValueError as exc:
            skipped(f"no announced minimum for {width}x{height} frames: {exc}")
            continue
        mb = engine_mb + costs.batch_bytes([message_bytes] * cameras, [box] * batch).total_mb
        key = size_key(box.pad_h, box.pad_w)
        out[key] = max(mb, out.get(key, 0.0))
    return out


class SizeClasses:
    """Announces a core's expected size classes and publishes a new one the moment it is served."""

    def __init__(self, sink: ProfileSink, costs: FrameCosts, alive: Callable[[], bool],
                 info: Callable[[str], None], warn: Callable[[str], None], name: str) -> None:
        """``alive``: whether publishing still makes sense (the adapter is not shutting down)."""
        self._sink, self._costs, self._alive = sink, costs, alive
        self._info, self._warn, self._name = info, warn, name
        self._publishing = threading.Lock()   # held while a new size class's profile goes out

    def announce(self, core: PerceptionCore, camera_sizes: list[str], batch: int = 1, cameras: int = 1) -> None:
        """Compute ``announced_minimums`` (at ``batch`` frames per run, ``cameras`` cameras) on a
        thread of its own and publish them once known."""
        engine = core.engine

        def work() -> None:
            try:
                minimums = announced_minimums(core, camera_sizes, self._costs, self._info, batch, cameras)
            except Exception as exc:  # noqa: BLE001 — announcing is advisory; measured sizes still count
                if self._alive():
                    self._warn(f"size-class minimums not announced: {exc}")
                minimums = {}
            self._sink.announce(engine, minimums)
            if self._alive():
                self._sink.publish()

        threading.Thread(target=work, name=f"{self._name}-announce", daemon=True).start()

    def served(self, size: str) -> None:
        """A frame of input size class ``size`` was served: publish now if the profile lacks it."""
        if not self._sink.knows(size):
            self.publish_now()

    def publish_now(self) -> None:
        """Publish the profile (its minimum for the size just served) from a thread of its own,
        one such publish at a time."""
        if self._publishing.locked():
            return

        def work() -> None:
            with self._publishing:
                if self._alive():
                    self._sink.publish()

        threading.Thread(target=work, name=f"{self._name}-size-class", daemon=True).start()
