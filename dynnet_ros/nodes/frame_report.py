"""A model node's account of every camera frame it received, on ``dynnet/frames``.

Why: a player (``dynnet replay``) must know when each node has finished a frame, to play the
next one without it being dropped, and what became of every frame it played; the node is the
only one that knows. One small JSON string per frame (``frame_reports.FrameOutcome``), reliable.
"""
from __future__ import annotations

from rclpy.node import Node
from rclpy.qos import QoSProfile
from std_msgs.msg import String

from dynnet_ros.frame_reports import FRAMES_TOPIC, FrameOutcome

#: reliable, and deep enough for the reports of a burst of dropped frames
FRAMES_QOS = QoSProfile(depth=50)


class FrameReporter:
    """Publishes the outcome of each frame taken from the node's cameras (``topics``: each
    camera's image topic, by camera name, as its subscription resolved it)."""

    def __init__(self, node: Node, topics: dict[str, str]) -> None:
        self._node = node
        self._pub = node.create_publisher(String, FRAMES_TOPIC, FRAMES_QOS)
        self.topics = dict(topics)

    def report(self, camera: str, stamp_ns: int, outcome: str) -> None:
        """The outcome of ``camera``'s frame stamped ``stamp_ns`` (its header stamp in nanoseconds)."""
        record = FrameOutcome(self._node.get_fully_qualified_name(), self.topics[camera], stamp_ns, outcome)
        try:
            self._pub.publish(String(data=record.to_json()))
        except Exception:  # the context is shut down while the node exits
            if self._node.context.ok():
                raise
