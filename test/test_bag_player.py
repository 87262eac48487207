"""The bag player's writers outlive a played message until its reliable readers have it.

A reader process that is stopped (SIGSTOP) cannot acknowledge: the player reports its topic as
still waiting once the timeout passes, and nothing once the reader runs again. The reader is a
real rclpy subscription in its own process, over the same loopback DDS as the graph's nodes.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading

import pytest
from _waiting import wait_for
from rclpy.serialization import serialize_message
from std_msgs.msg import String

from dynnet_ros.bags.pacing import Pacing, Step
from dynnet_ros.bags.reader import BagMessage
from dynnet_ros.bags.topics import PlayedTopic, TopicPlan
from dynnet_ros.commands.bag_player import BagPlayer

pytestmark = [pytest.mark.timeout(300), pytest.mark.graph]

TOPIC = f"/bag_player_test_{os.getpid()}/chatter"

READER = textwrap.dedent("""
    import sys
    import rclpy
    from rclpy.qos import QoSProfile, ReliabilityPolicy
    from std_msgs.msg import String

    rclpy.init()
    node = rclpy.create_node("ack_test_reader")
    node.create_subscription(String, sys.argv[1], lambda msg: print("got", msg.data, flush=True),
                             QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE))
    print("subscribed", flush=True)
    rclpy.spin(node)
""")


def message(text: str, topic: str = TOPIC) -> Step:
    """A step that publishes ``text`` on ``topic`` at once."""
    return Step(0.0, 0, BagMessage(topic, "std_msgs/msg/String", 0, serialize_message(String(data=text))), 0)


@pytest.fixture()
def player_and_reader():
    plan = TopicPlan((PlayedTopic(TOPIC, TOPIC, "std_msgs/msg/String", 2, None),), ())
    player = BagPlayer(plan, Pacing(), name="ack_test_player")
    reader = subprocess.Popen([sys.executable, "-c", READER, TOPIC], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        assert reader.stdout is not None and "subscribed" in reader.stdout.readline()
        stop = threading.Event()
        wait_for(lambda: not player.unmatched() or reader.poll() is not None, 60, "the reader to match the player")
        player.wait_for_subscribers(stop, 60.0)  # the reader's side of the match settles too
        yield player, reader
    finally:
        reader.send_signal(signal.SIGCONT)
        reader.kill()
        reader.wait()
        player.close()


def test_a_played_message_is_waited_for_until_a_stopped_reader_acknowledges_it(player_and_reader):
    player, reader = player_and_reader
    stop = threading.Event()
    assert player.play([message("first")], stop)
    assert player.wait_for_acks(60.0) == []  # a running reader acknowledges at once
    reader.send_signal(signal.SIGSTOP)
    assert player.play([message("second")], stop)
    assert player.wait_for_acks(1.0) == [TOPIC]  # the writer keeps it: the reader cannot acknowledge
    reader.send_signal(signal.SIGCONT)
    assert player.wait_for_acks(60.0) == []
    assert reader.poll() is None


def test_without_reliable_readers_there_is_nothing_to_wait_for():
    plan = TopicPlan((PlayedTopic(TOPIC + "_alone", TOPIC + "_alone", "std_msgs/msg/String", 1, None),), ())
    player = BagPlayer(plan, Pacing(), name="ack_test_lonely_player")
    try:
        assert player.play([message("nobody listens", TOPIC + "_alone")], threading.Event())
        assert player.wait_for_acks(0.0) == []
    finally:
        player.close()
