"""Recorder node: writes the graph's inputs and outputs into a bag (MCAP by default) as they are published.

Why a node of the graph and not `ros2 bag record`: the PyPI install has no rosbag2, and the
recorder must know which topics belong to the graph. It finds them by discovery, twice a second:
every topic a node of ``nodes`` publishes (the model nodes' outputs, diagnostics, budgets) or
subscribes to (the camera, camera_info and LiDAR inputs, whoever publishes them), plus
``topics`` named outright. Each subscription is raw (``raw=True``), so the bag gets the CDR bytes the
publisher sent, nothing decoded or serialised again, with a QoS every publisher of the topic
can serve (best effort as soon as one publisher is best effort). Writing is bags/writer.py
(rosbags), so ``ros2 bag play``, Foxglove Studio, rosbags and the ``mcap`` library read the result.

Each message is logged at its arrival on this node's clock (the bag's time under ``use_sim_time``).
The bag is finalised when the node stops (SIGINT / SIGTERM through run_node, which calls ``close``),
so a graph stopped by Ctrl-C or ``--duration`` leaves a complete, indexed file.
"""
from __future__ import annotations

import os
import sys
import threading
from typing import Any

from diagnostic_msgs.msg import DiagnosticArray
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy

from dynnet_ros.bags.writer import STORAGES, BagWriter, TopicQos
from dynnet_ros.nodes import diagnostics as diag
from dynnet_ros.nodes.base import ParamSpec, declare, run_node, steady_timer
from dynnet_ros.nodes.message_types import message_class
from dynnet_ros.nodes.recording_graph import EXCLUDED_TOPICS

#: messages a subscription queues while the writer is busy (a burst of three sensor messages per frame)
QUEUE_DEPTH = 100
SPECS = [
    ParamSpec("output", "", "Bag to create: OUT.mcap = one MCAP file, any other name = a rosbag2 directory. "
              "Must not exist."),
    ParamSpec("storage", "mcap", "Storage of a rosbag2 directory.", choices=tuple(sorted(STORAGES))),
    ParamSpec("nodes", [""], "Fully qualified names of the nodes whose topics (published or subscribed) are "
              "recorded ([''] = every topic but this node's).", kind="string_array"),
    ParamSpec("topics", [""], "Topics recorded whoever publishes them ([''] = none beyond the nodes' topics).",
              kind="string_array"),
    ParamSpec("discovery_period_s", 0.5, "Seconds between looks for new topics.", low=0.1, high=60.0),
]

#: every parameter the recorder declares
PARAMETERS = SPECS


def _fq(namespace: str, name: str) -> str:
    return f"{namespace.rstrip('/')}/{name}"


class Recorder(Node):
    def __init__(self, **options: Any) -> None:
        super().__init__("recorder", **options)
        self.params = declare(self, SPECS)
        if not self.params["output"]:
            raise ValueError("parameter output must name the bag to create")
        self._nodes = {n for n in self.params["nodes"] if n}
        self._wanted = {self.resolve_topic_name(t) for t in self.params["topics"] if t}
        self._lock = threading.Lock()
        self._bag: BagWriter | None = BagWriter(self.params["output"], storage=self.params["storage"])
        self._recording: dict[str, Any] = {}
        self.skipped: dict[str, str] = {}  # topic -> why it is not recorded
        self._diag_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self._discover()
        # steady clock: under use_sim_time the ROS clock stands still until a player publishes /clock,
        # and the topics must be found before that (the player waits for them)
        steady_timer(self, self.params["discovery_period_s"], self._discover)
        steady_timer(self, 1.0, self._publish_diagnostics, MutuallyExclusiveCallbackGroup())
        self.get_logger().info(f"recording to {self._bag.path}")

    def _ours(self, topic: str) -> list:
        """The topic's publishers when it is one to record (empty: not one, or no publisher yet):
        a topic the graph's nodes publish (outputs) or subscribe to (inputs, whoever publishes
        them: the simulator, a bag player, the robot's drivers), or one named in ``topics``."""
        me = self.get_fully_qualified_name()
        infos = [i for i in self.get_publishers_info_by_topic(topic) if _fq(i.node_namespace, i.node_name) != me]
        if topic in self._wanted or not self._nodes:
            return infos
        if any(_fq(i.node_namespace, i.node_name) in self._nodes for i in infos):
            return infos
        readers = self.get_subscriptions_info_by_topic(topic)
        return infos if any(_fq(i.node_namespace, i.node_name) in self._nodes for i in readers) else []

    def _discover(self) -> None:
        if self._bag is None:
            return
        for topic, types in self.get_topic_names_and_types():
            if topic in self._recording or topic in self.skipped or topic in EXCLUDED_TOPICS:
                continue
            publishers = self._ours(topic)
            if not publishers:
                continue
            if len(types) != 1:
                self._skip(topic, f"published with {len(types)} types ({', '.join(types)})")
                continue
            self._subscribe(topic, types[0], publishers)

    def _skip(self, topic: str, reason: str) -> None:
        self.skipped[topic] = reason
        self.get_logger().warning(f"not recording {topic}: {reason}")

    def _subscribe(self, topic: str, msgtype: str, publishers: list) -> None:
        assert self._bag is not None
        best_effort = any(p.qos_profile.reliability == ReliabilityPolicy.BEST_EFFORT for p in publishers)
        latched = all(p.qos_profile.durability == DurabilityPolicy.TRANSIENT_LOCAL for p in publishers)
        offered = TopicQos(reliable=not best_effort, depth=max(1, int(publishers[0].qos_profile.depth)),
                           transient_local=latched)
        try:
            cls = message_class(msgtype)
            if cls is None:
                raise ValueError(f"message type {msgtype} is not importable here")
            with self._lock:
                self._bag.add_topic(topic, msgtype, offered)
        except ValueError as exc:
            self._skip(topic, str(exc))
            return
        qos = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=QUEUE_DEPTH,
                         reliability=ReliabilityPolicy.BEST_EFFORT if best_effort else ReliabilityPolicy.RELIABLE,
                         durability=DurabilityPolicy.TRANSIENT_LOCAL if latched else DurabilityPolicy.VOLATILE)
        self._recording[topic] = self.create_subscription(
            cls, topic, lambda data, t=topic: self._on_message(t, data), qos, raw=True)
        self.get_logger().info(f"recording {topic} ({msgtype}, {'best effort' if best_effort else 'reliable'})")

    def _on_message(self, topic: str, data: bytes) -> None:
        stamp = self.get_clock().now().nanoseconds
        with self._lock:
            if self._bag is None:
                return
            self._bag.write(topic, stamp, data)
            first = self._bag.counts[topic] == 1
        if first:
            self.get_logger().info(f"first message on {topic}")

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._bag.counts) if self._bag is not None else {}

    def _publish_diagnostics(self) -> None:
        counts = self.counts()
        values: dict[str, Any] = {"pid": os.getpid(), "output": self.params["output"],
                                  "messages": sum(counts.values()), "topics": len(counts)}
        values.update({f"messages.{topic}": n for topic, n in sorted(counts.items())})
        values.update({f"skipped.{topic}": why for topic, why in sorted(self.skipped.items())})
        level, message = (diag.WARN, "no topic found yet") if not counts else (diag.OK, "recording")
        diag.publish(self, self._diag_pub, [diag.node_status(self, "bag recorder", level, message, values)])

    def close(self) -> None:
        """Finalise the bag (index, footer, metadata): called once the executor has stopped."""
        with self._lock:
            bag, self._bag = self._bag, None
        if bag is None:
            return
        path = bag.close()
        total = sum(bag.counts.values())
        print(f"recorder: wrote {total} messages on {len(bag.counts)} topics to {path}", flush=True)


def main(args: list[str] | None = None) -> int:
    return run_node(Recorder, args)


if __name__ == "__main__":
    sys.exit(main())
