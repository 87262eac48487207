"""Play a bag into the ROS graph: its messages as recorded (raw CDR), and its time on /clock.

The ROS half of ``dynnet replay`` (and ``dynnet demo --bag``); the bag itself is read, checked and
paced by the ROS-free ``dynnet_ros.bags``. Messages go out as the serialized bytes the bag holds
(rclpy publishes ``bytes`` as a serialized message), so playing costs no message objects and
the headers' stamps are exactly the recorded ones. The model nodes report what became of each
camera frame on ``dynnet/frames`` (``bags.progress``); the player counts those reports and, when
told which nodes read which camera topic (``pace``), holds each camera frame until those nodes
have finished the previous one, so no frame is dropped in a node's one-frame mailbox. The graph's nodes run with
``use_sim_time``: /clock carries the bag's time from the first message on, and keeps running at
the replay rate after the last one until the player closes, so the nodes' timers (diagnostics,
budget profiles) keep ticking while they finish their last frames.
"""
from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable

import rclpy
from rclpy.duration import Duration
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.publisher import Publisher
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
from rclpy.signals import SignalHandlerOptions
from rosgraph_msgs.msg import Clock
from std_msgs.msg import String

from dynnet_ros.bags.pacing import NS, Pacing, Step
from dynnet_ros.bags.progress import FRAME_TYPES, FrameLedger, header_stamp_ns
from dynnet_ros.bags.topics import TopicPlan
from dynnet_ros.commands.parsers.replay import FRAME_WAIT_S
from dynnet_ros.frame_reports import FRAMES_TOPIC, FrameOutcome
from dynnet_ros.nodes.message_types import message_class

#: every played topic: reliable, transient-local, depth 10. Such a publisher serves best-effort and
#: volatile subscribers (the sensor-data QoS the model nodes use) and reliable, transient-local ones
#: (a node whose sensor links QoS overrides make so, to evaluate on a bag without losing a frame:
#: a subscription that matches the player only after a message was sent still gets it) alike.
TOPIC_QOS = QoSProfile(depth=10, durability=DurabilityPolicy.TRANSIENT_LOCAL)
#: how long playing waits after the writers have matched the graph's readers, for the readers to
#: match the writers back (``BagPlayer.wait_for_subscribers``)
MATCH_SETTLE_S = 1.0
#: /clock: one sample, reliable (matches rclpy's best-effort /clock subscription and reliable ones)
CLOCK_QOS = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE)
#: how long the player waits, once the bag is played, for its reliable subscribers to acknowledge
#: every message (``BagPlayer.wait_for_acks``)
ACK_WAIT_S = 10.0


def ns_to_time(stamp_ns: int) -> tuple[int, int]:
    return stamp_ns // NS, stamp_ns % NS


class BagPlayer:
    """Publishers for a plan's topics and /clock on a node of its own (its own rclpy context,
    no signal handlers: the command handles Ctrl-C), and a subscription to the model nodes'
    frame reports under ``namespace``, spun on a thread of its own."""

    def __init__(self, plan: TopicPlan, pacing: Pacing, name: str = "dynnet_replay", namespace: str = "",
                 frame_wait_s: float = FRAME_WAIT_S) -> None:
        self.plan = plan
        self.pacing = pacing
        self.frame_wait_s = frame_wait_s
        self.context = rclpy.Context()
        rclpy.init(context=self.context, signal_handler_options=SignalHandlerOptions.NO)
        self.node: Node = rclpy.create_node(name, context=self.context)
        self._clock = self.node.create_publisher(Clock, "/clock", CLOCK_QOS)
        self._publishers: dict[str, Publisher] = {}
        for topic in plan.played:
            cls = message_class(topic.msgtype)
            if cls is None:  # plan_topics was given message_class, so only a broken install gets here
                raise ValueError(f"message type {topic.msgtype} of {topic.source} is not importable")
            self._publishers[topic.target] = self.node.create_publisher(cls, topic.target, TOPIC_QOS)
        self.published: Counter[str] = Counter()  # target topic -> messages published
        self.clock_ns: int | None = None  # the last /clock value published
        self.passes = 0
        self.frame_topics = {t.target for t in plan.played if t.msgtype in FRAME_TYPES}
        self.ledger = FrameLedger({})
        self.late: Counter[str] = Counter()  # node -> frames sent before it finished the previous one
        self.bad_reports = 0
        self._last_frame: dict[str, int] = {}  # camera topic -> stamp of the frame played last
        self._hold = False  # camera frames wait for the readers (``pace``)
        self._ledger_lock = threading.Condition()
        self.node.create_subscription(String, f"{namespace.rstrip('/')}/{FRAMES_TOPIC}", self._on_report,
                                      QoSProfile(depth=100))
        self._executor = SingleThreadedExecutor(context=self.context)
        self._executor.add_node(self.node)
        self._closing = threading.Event()
        self._spinner = threading.Thread(target=self._spin, name=f"{name}-reports", daemon=True)
        self._spinner.start()

    def _spin(self) -> None:
        try:
            while self.context.ok() and not self._closing.is_set():
                self._executor.spin_once(timeout_sec=0.1)
        except Exception:  # noqa: BLE001 — the context was shut down while spinning
            pass

    def _on_report(self, msg: String) -> None:
        try:
            report = FrameOutcome.from_json(msg.data)
        except ValueError:
            self.bad_reports += 1
            return
        with self._ledger_lock:
            self.ledger.reported(report)
            self._ledger_lock.notify_all()

    def frame_readers(self, nodes: Iterable[str]) -> dict[str, list[str]]:
        """Camera topic played -> the nodes (fully qualified) among ``nodes`` subscribed to it."""
        readers: dict[str, list[str]] = {}
        for node in nodes:
            namespace, _, name = node.rpartition("/")
            try:
                topics = self.node.get_subscriber_names_and_types_by_node(name, namespace or "/")
            except Exception:  # noqa: BLE001 — rclpy raises NodeNameNonExistentError for a node that is gone
                continue
            for topic, _types in topics:
                if topic in self.frame_topics:
                    readers.setdefault(topic, []).append(node)
        return readers

    def pace(self, readers: dict[str, list[str]], hold: bool = True) -> None:
        """Count the frames of ``readers`` (camera topic -> nodes) in the report, and with
        ``hold`` keep each camera frame until those nodes have finished the previous one."""
        with self._ledger_lock:
            self.ledger.readers = {topic: list(nodes) for topic, nodes in readers.items()}
            self._hold = hold

    def wait_for_frames(self, stop: threading.Event, topics: Iterable[str] | None = None,
                        timeout_s: float | None = None) -> dict[str, list[str]]:
        """Wait until the paced nodes have finished the last frame played on each of ``topics``
        (default: every camera topic), for at most ``timeout_s`` (default ``frame_wait_s``) in
        all; returns topic -> nodes still busy with it."""
        deadline = time.monotonic() + (self.frame_wait_s if timeout_s is None else timeout_s)
        wanted = [t for t in (self._last_frame if topics is None else topics) if t in self._last_frame]

        def busy() -> dict[str, list[str]]:
            found = {t: self.ledger.waiting_for(t, self._last_frame[t]) for t in wanted}
            return {t: nodes for t, nodes in found.items() if nodes}

        with self._ledger_lock:
            while (waiting := busy()) and not stop.is_set():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._ledger_lock.wait(min(remaining, 0.1))
            return waiting

    def frame_counts(self):
        """(node, camera topic) -> ``FrameCounts`` so far."""
        with self._ledger_lock:
            return self.ledger.counts()

    def subscribed(self, node: str) -> bool:
        """Whether the fully qualified ``node`` subscribes to any of the played topics."""
        namespace, _, name = node.rpartition("/")
        try:
            topics = self.node.get_subscriber_names_and_types_by_node(name, namespace or "/")
        except Exception:  # noqa: BLE001 — rclpy raises NodeNameNonExistentError until the node is up
            return False
        return any(topic in self._publishers for topic, _types in topics)

    def wait_for_nodes(self, nodes: Iterable[str], stop: threading.Event, timeout_s: float,
                       alive: Callable[[], bool] = lambda: True) -> list[str]:
        """Wait until every node in ``nodes`` subscribes to a played topic (a model node does
        once its model is loaded); returns those that did not within ``timeout_s``."""
        waiting = list(nodes)
        deadline = time.monotonic() + timeout_s
        while waiting and not stop.is_set() and alive() and time.monotonic() < deadline:
            waiting = [n for n in waiting if not self.subscribed(n)]
            if waiting:
                stop.wait(0.2)
        return waiting

    def wait_for_subscribers(self, stop: threading.Event, timeout_s: float) -> None:
        """Wait until each played topic's publisher has matched every subscription the ROS graph
        shows for the topic (and at least one), for at most ``timeout_s``, then ``MATCH_SETTLE_S``.

        A node is in the graph before DDS has matched its reader with this writer, and what is
        published before that reaches nobody. Matching is done on each side: the writer counts a
        reader before that reader has matched the writer back, and a volatile reader drops what
        arrives from a writer it has not matched yet — the settle time covers that second half,
        so a node does not miss the bag's first frame."""
        deadline = time.monotonic() + timeout_s
        while not stop.is_set() and time.monotonic() < deadline and self.unmatched():
            stop.wait(0.05)
        stop.wait(MATCH_SETTLE_S)

    def unmatched(self) -> list[str]:
        """Played topics whose publisher has not yet matched every subscription in the graph."""
        return [topic for topic, publisher in self._publishers.items()
                if publisher.get_subscription_count() < max(1, self.node.count_subscribers(topic))]

    def publish_clock(self, stamp_ns: int) -> None:
        sec, nanosec = ns_to_time(stamp_ns)
        msg = Clock()
        msg.clock.sec, msg.clock.nanosec = sec, nanosec
        self._clock.publish(msg)
        self.clock_ns = stamp_ns

    def play(self, steps: Iterable[Step], stop: threading.Event,
             on_step: Callable[[Step], None] | None = None) -> bool:
        """Publish each step at its time (late steps at once, never skipped); True when every
        step went out, False when ``stop`` was set first."""
        t0 = time.monotonic()
        for step in steps:
            delay = t0 + step.at_s - time.monotonic()
            if delay > 0 and stop.wait(delay):
                return False
            if stop.is_set():
                return False
            message = step.message
            if message is not None and message.topic in self.frame_topics and self._hold:
                for node in self.wait_for_frames(stop, [message.topic]).get(message.topic, []):
                    self.late[node] += 1
                if stop.is_set():
                    return False
            self.publish_clock(step.clock_ns)
            if message is not None:
                self._publishers[message.topic].publish(message.data)
                self.published[message.topic] += 1
                if message.topic in self.frame_topics:
                    self._note_frame(message.topic, message.data)
            self.passes = step.loop + 1
            if on_step is not None:
                on_step(step)
        return True

    def _note_frame(self, topic: str, data: bytes) -> None:
        try:
            stamp = header_stamp_ns(data)
        except ValueError:
            return
        with self._ledger_lock:
            self.ledger.published(topic, stamp)
            self._last_frame[topic] = stamp

    def keep_clock(self, stop: threading.Event, seconds: float | None) -> None:
        """Keep /clock advancing from its last value at the replay rate, ``pacing.clock_hz`` times
        a second, for ``seconds`` (None: until ``stop``)."""
        if self.clock_ns is None:
            return
        base, t0, period = self.clock_ns, time.monotonic(), 1.0 / self.pacing.clock_hz
        while not stop.wait(period):
            elapsed = time.monotonic() - t0
            self.publish_clock(base + round(elapsed * self.pacing.rate * NS))
            if seconds is not None and elapsed >= seconds:
                return

    def wait_for_acks(self, timeout_s: float = ACK_WAIT_S) -> list[str]:
        """Wait until every reliable subscriber has acknowledged every message played, for at
        most ``timeout_s`` in all; returns the topics still waiting.

        Why: a reliable writer resends a lost fragment of a large message (a camera frame) until
        the reader has it, but only while the writer exists. Closed right after the last
        message, the player would take the bag's last frame away from a reader on a busy machine
        that had not yet reassembled it. Best-effort subscribers acknowledge nothing and are not
        waited for."""
        deadline = time.monotonic() + timeout_s
        waiting = []
        for topic, publisher in self._publishers.items():
            remaining = Duration(nanoseconds=max(0, int((deadline - time.monotonic()) * NS)))
            if not publisher.wait_for_all_acked(remaining):
                waiting.append(topic)
        return waiting

    def close(self) -> None:
        self._closing.set()
        self._spinner.join(timeout=5.0)  # a node destroyed under a spinning executor aborts the process
        try:
            self._executor.shutdown(timeout_sec=1.0)
            self.node.destroy_node()
        finally:
            if self.context.ok():
                rclpy.shutdown(context=self.context)
