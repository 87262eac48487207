"""The wire format of ``dynnet/frames``: a model node's account of each camera frame it received.

A model node publishes one ``FrameOutcome`` per camera frame (std_msgs/String, JSON like the
budget topics) and ``dynnet replay`` reads them (``bags/progress.py``). Its own module, below
both, because a serving node must not load the bag machinery. No ROS imports.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

#: relative, like the budget topics: a graph under a namespace reports to its own player
FRAMES_TOPIC = "dynnet/frames"
OUTCOMES = ("processed", "failed", "dropped", "skipped")


@dataclass(frozen=True)
class FrameOutcome:
    """One camera frame's fate in one node: ``node`` (fully qualified) read it from ``topic``."""

    node: str
    topic: str
    stamp_ns: int
    outcome: str

    def to_json(self) -> str:
        return json.dumps({"node": self.node, "topic": self.topic, "stamp_ns": self.stamp_ns,
                           "outcome": self.outcome})

    @classmethod
    def from_json(cls, text: str) -> FrameOutcome:
        """ValueError naming what is malformed."""
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"frame report is not JSON: {exc}") from exc
        if not isinstance(raw, dict):
            raise ValueError("frame report must be a JSON object")
        node, topic, stamp, outcome = raw.get("node"), raw.get("topic"), raw.get("stamp_ns"), raw.get("outcome")
        if not (isinstance(node, str) and isinstance(topic, str)):
            raise ValueError("frame report needs string 'node' and 'topic'")
        if isinstance(stamp, bool) or not isinstance(stamp, int):
            raise ValueError(f"frame report 'stamp_ns' must be an integer, got {stamp!r}")
        if outcome not in OUTCOMES:
            raise ValueError(f"frame report 'outcome' must be one of {OUTCOMES}, got {outcome!r}")
        return cls(node, topic, stamp, outcome)
