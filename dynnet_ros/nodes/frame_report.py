"""A model node's account of every camera frame it received, on ``dynnet/frames``.

Why: a player (``dynnet replay``) must know when each node has finished a frame, to play the
next one without it being dropped, and what became of every frame it played; the node is the
only one that knows. One small JSON string per frame (``frame_reports.FrameOutcome``), reliable.
"""
from __future__ import annotations

from rclpy.node import Node
from rclpy.qos import QoSProfile
from rclpy.subscription import Subscription
from std_msgs.msg import String

from dynnet_ros.frame_reports import FRAMES_TOPIC, FrameOutcome

#: reliable, and deep enough for the reports of a burst of dropped frames
FRAMES_QOS = QoSProfile(depth=50)


class FrameReporter:
    """Publishes the outcome of each frame taken from ``subscription`` (the node's camera)."""

    def __init__(self, node: Node, subscription: Subscription) -> None:
        self._node = node
        self._pub = node.create_publisher(String, FRAMES_TOPIC, FRAMES_QOS)
        self.topic = subscription.topic_name

    def report(self, stamp_ns: int, outcome: str) -> None:
        """The outcome of the frame stamped ``stamp_ns`` (its header stamp in nanoseconds)."""
        record = FrameOutcome(self._node.get_fully_qualified_name(), self.topic, stamp_ns, outcome)
        try:
            self._pub.publish(String(data=record.to_json()))
        except Exception:  # the context is shut down while the node exits
            if self._node.context.ok():
                raise
