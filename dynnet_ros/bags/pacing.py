"""When each message of a replay goes out, and what /clock says meanwhile.

A pure plan, apart from the clock it is played against: the player sleeps until each step's
time and publishes it, so the plan is testable without ROS or waiting. Times follow the bag's
own timestamps divided by the rate; /clock carries the bag's time (the recording's original
timestamps, which the messages' headers also carry), with ticks between messages so that nodes
on simulated time see it advance while a bag has gaps. With ``loop`` the bag starts again right
after its last message, as ``ros2 bag play --loop`` does, and /clock jumps back to its start.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from dynnet_ros.bags.reader import BagMessage

NS = 1_000_000_000


@dataclass(frozen=True)
class Pacing:
    """``rate``: bag seconds per wall second (2 = twice as fast); ``loop``: play again and again;
    ``clock_hz``: /clock ticks per wall second between messages (``ros2 bag play --clock``)."""

    rate: float = 1.0
    loop: bool = False
    clock_hz: float = 25.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.rate) and self.rate > 0):
            raise ValueError(f"replay rate must be a positive number, got {self.rate}")
        if not (math.isfinite(self.clock_hz) and self.clock_hz > 0):
            raise ValueError(f"/clock rate must be a positive number, got {self.clock_hz}")


@dataclass(frozen=True)
class Step:
    """Publish /clock = ``clock_ns`` (and ``message``, if any) ``at_s`` wall seconds into the replay."""

    at_s: float
    clock_ns: int
    message: BagMessage | None
    loop: int  # 0 for the first pass through the bag


def loop_period_ns(start_ns: int, end_ns: int) -> int:
    """Bag time from one pass's start to the next's: the bag's span (``end_ns`` is just past its
    last message, as rosbags reports it). ValueError for a bag whose messages share one instant:
    looping it would publish without pause."""
    period = end_ns - start_ns
    if period <= 1:
        raise ValueError("every message of the bag has the same timestamp; --loop would replay it without pause")
    return period


def paced_steps(passes: Callable[[], Iterable[BagMessage]], start_ns: int, end_ns: int, pacing: Pacing,
                max_passes: int | None = None) -> Iterator[Step]:
    """The replay's steps in order: the messages of ``passes()`` (called once per pass, so each
    pass streams the bag again) with /clock ticks between them.

    ``start_ns``/``end_ns``: the bag's span (first message; just past the last). One pass
    without ``loop``; with it, passes until ``max_passes`` (None: for ever).
    """
    period = loop_period_ns(start_ns, end_ns) if pacing.loop else end_ns - start_ns
    tick_s = 1.0 / pacing.clock_hz
    count = 1 if not pacing.loop else max_passes
    done = 0
    last_at = -math.inf
    while count is None or done < count:
        offset_ns = done * period
        for message in passes():
            at = (message.timestamp_ns - start_ns + offset_ns) / NS / pacing.rate
            if last_at > -math.inf:  # clock ticks on the wall-time grid between two messages, none
                tick = (math.floor(last_at / tick_s) + 1) * tick_s  # within half a tick of the next one
                while tick < at - tick_s / 2:
                    bag_ns = start_ns + round(tick * pacing.rate * NS) - offset_ns
                    yield Step(tick, max(start_ns, bag_ns), None, done)
                    tick += tick_s
            yield Step(at, message.timestamp_ns, message, done)
            last_at = at
        done += 1
