"""Live view: the graph's images and detections as Foxglove messages, served on loopback.

ROS-free (numpy and foxglove-sdk only), so the conversions are unit-tested without a graph;
``dynnet_ros.nodes.foxglove_view`` is the thin ROS adapter that feeds them.
"""

#: the live view's WebSocket port on the loopback interface (Foxglove's usual one)
DEFAULT_PORT = 8765
