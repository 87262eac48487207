"""What a recorder has yet to record, as the ROS graph shows it: its subscriptions against what
the recorded nodes publish, and its diagnostics' message counts.

Apart from the recorder node (``recorder.py``, which imports the bag writer) so that `dynnet up`
and `dynnet replay`, which wait on a recorder, need only rclpy.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from rclpy.node import Node

#: ROS's own bookkeeping topics, and the bag player's /clock (a player of this bag publishes its own)
EXCLUDED_TOPICS = frozenset({"/rosout", "/parameter_events", "/clock"})
#: the types of the camera frames a model node's outputs copy their header from (raw, compressed)
CAMERA_TYPES = frozenset({"sensor_msgs/msg/Image", "sensor_msgs/msg/CompressedImage"})
#: the sensor inputs of a model node (the camera, its CameraInfo, the LiDAR)
SENSOR_TYPES = CAMERA_TYPES | {"sensor_msgs/msg/CameraInfo", "sensor_msgs/msg/PointCloud2"}


def _split(node: str) -> tuple[str, str]:
    namespace, _, name = node.rpartition("/")
    return name, namespace or "/"


def unrecorded_topics(observer: Node, recorder: str, nodes: Iterable[str],
                      storable: Callable[[str], bool] = lambda _msgtype: True) -> list[str] | None:
    """Topics that ``nodes`` publish and the ``recorder`` (fully qualified names) does not subscribe
    to yet, as ``observer`` sees the graph; None while the recorder is not up. A topic of no type
    ``storable`` accepts is skipped by the recorder (e.g. vision_msgs, which rosbags' typestore
    lacks), so it is not waited for."""
    try:
        subscribed = {topic for topic, _ in observer.get_subscriber_names_and_types_by_node(*_split(recorder))}
    except Exception:  # noqa: BLE001 — rclpy raises NodeNameNonExistentError until the node is up
        return None
    published: set[str] = set()
    for node in nodes:
        try:
            published |= {topic for topic, types in observer.get_publisher_names_and_types_by_node(*_split(node))
                          if any(storable(t) for t in types)}
        except Exception:  # noqa: BLE001 — a node that is not up (yet, or any more) publishes nothing to wait for
            continue
    return sorted(published - subscribed - EXCLUDED_TOPICS)


def wait_for_recorder(observer: Node, recorder: str, nodes: Iterable[str], stop: threading.Event,
                      timeout_s: float, storable: Callable[[str], bool] = lambda _msgtype: True) -> list[str] | None:
    """Wait until the recorder subscribes to every topic ``nodes`` publish, so a player starting
    afterwards loses no message to discovery; returns what is still unrecorded at the timeout
    (None: the recorder never came up), or [] once complete."""
    deadline = time.monotonic() + timeout_s
    while True:
        missing = unrecorded_topics(observer, recorder, nodes, storable)
        if missing == [] or stop.is_set() or time.monotonic() >= deadline:
            return missing
        stop.wait(0.2)


def unrecorded_inputs(observer: Node, recorder: str, node: str, status: Mapping[str, Any] | None) -> list[str] | None:
    """What keeps model node ``node`` from starting under ``recorder`` (fully qualified names),
    as ``observer`` sees the graph and ``status`` (the values of the recorder's latest
    diagnostics status) tells: the node's sensor inputs with a publisher that the recorder has
    no message on yet, and the topics the node publishes that the recorder does not subscribe
    to yet; [] once none is left.

    None while there is nothing to wait for: the node does not subscribe to a camera yet (it
    does once its model is loaded) or no one publishes its camera. Why a message and not a
    subscription: the recorder has matched the sensor's publisher once a message arrived, so
    every later frame reaches the recorder as it reaches the node. A topic the recorder skips
    (``skipped.<topic>``: a type rosbags cannot store) is not waited for."""
    try:
        subscribed = observer.get_subscriber_names_and_types_by_node(*_split(node))
    except Exception:  # noqa: BLE001 — rclpy raises NodeNameNonExistentError until the node is up
        return None
    inputs = [(topic, types) for topic, types in subscribed if SENSOR_TYPES.intersection(types)]
    cameras = [topic for topic, types in inputs if CAMERA_TYPES.intersection(types)]
    if not cameras or not any(observer.count_publishers(topic) for topic in cameras):
        return None
    values = status or {}

    def recorded(topic: str) -> bool:
        count = values.get(f"messages.{topic}", 0)
        return f"skipped.{topic}" in values or (isinstance(count, int) and count > 0)

    missing = [topic for topic, _ in inputs if not recorded(topic) and observer.count_publishers(topic)]
    outputs = unrecorded_topics(observer, recorder, [node])
    missing += [topic for topic in outputs or [] if f"skipped.{topic}" not in values]
    return sorted(set(missing))
