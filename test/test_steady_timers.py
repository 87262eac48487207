"""Liveness timers run on the steady clock, message stamps on ROS time.

Under `dynnet replay` every node has ``use_sim_time``: its ROS clock is the bag's /clock, which
stands still before the player starts, while it waits, and crawls at ``--rate 0.1``. Diagnostics,
budget profiles and the budget manager's readings and evaluations mean "every so many real
seconds" (the manager drops a model node whose profile is ``profile_timeout_s`` old in wall
time), so they must keep coming with no /clock at all. Their stamps stay on the ROS clock (0 here).

The nodes run in this process, with ``use_sim_time`` and nobody publishing /clock.
"""
from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
import rclpy
from _waiting import wait_for
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.executors import MultiThreadedExecutor
from rclpy.node import Node
from std_msgs.msg import String

from dynnet_ros.budget.protocol import BUDGETS_TOPIC, PROFILES_TOPIC
from dynnet_ros.nodes.budget_manager import BudgetManager
from dynnet_ros.nodes.budget_profile import ProfilePublisher
from dynnet_ros.nodes.foxglove_view import FoxgloveView
from dynnet_ros.nodes.sensor_sim import SensorSim
from dynnet_ros.procmem import process_memory

NS = f"/steadytest_{os.getpid()}"
LANE = f"{NS}/lane_node"
# A deadline for each condition, not a speed requirement: the timers fire about once a second.
WAIT_S = 120.0
pytestmark = [pytest.mark.timeout(600), pytest.mark.graph]


class _InMemoryEngine:
    """What ProfilePublisher reads from an engine that runs its model in memory (no swap table)."""

    def latency_table(self) -> list[tuple[float, float]]:
        return []

    def min_budget_mb(self) -> float | None:
        return None


@dataclass
class Seen:
    """What the probe node received, by the executor's threads."""

    diagnostics: dict[str, list[DiagnosticArray]] = field(default_factory=dict)
    profiles: list[dict] = field(default_factory=list)
    reports: list[dict] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def on_diagnostics(self, msg: DiagnosticArray) -> None:
        with self.lock:
            for status in msg.status:
                if status.hardware_id.startswith(NS + "/"):  # /diagnostics is global
                    self.diagnostics.setdefault(status.hardware_id, []).append(msg)

    def on_profile(self, msg: String) -> None:
        with self.lock:
            self.profiles.append(json.loads(msg.data))

    def on_report(self, msg: String) -> None:
        with self.lock:
            self.reports.append(json.loads(msg.data))


@pytest.fixture(scope="module")
def sim_time_graph() -> Iterator[tuple[Seen, list[Node]]]:
    # every node of this context: use_sim_time, our namespace, any free port for the live view, and
    # a /clock of our own that nobody publishes (a replay elsewhere on this domain cannot feed it)
    rclpy.init(args=["--ros-args", "-p", "use_sim_time:=true", "-p", "port:=0", "-r", f"__ns:={NS}",
                     "-r", f"/clock:={NS}/clock"])
    nodes: list[Node] = []
    executor = MultiThreadedExecutor(num_threads=4)
    spinner = threading.Thread(target=executor.spin, daemon=True)
    try:
        lane = Node("lane_node")
        lane.declare_parameter("memory_budget_mb", 0.0)  # where the manager pushes the budget
        engine = _InMemoryEngine()
        # as after a frame at 240x320 and with nothing else announced: the profile counts as measured
        profile = ProfilePublisher(lane, lambda: engine, lambda: None, process_memory(), latency_ms=lambda: 10.0,
                                   size=lambda: "240x320")
        profile.announce(engine, {})
        nodes += [BudgetManager(), SensorSim(), FoxgloveView(), lane]
        seen = Seen()
        probe = Node("steady_probe")
        probe.create_subscription(DiagnosticArray, "/diagnostics", seen.on_diagnostics, 50)
        probe.create_subscription(String, PROFILES_TOPIC, seen.on_profile, 50)
        probe.create_subscription(String, BUDGETS_TOPIC, seen.on_report, 50)
        nodes.append(probe)
        for node in nodes:
            executor.add_node(node)
        spinner.start()
        yield seen, nodes
    finally:
        executor.shutdown(timeout_sec=5.0)
        if nodes:
            profile.close()
            for node in nodes:
                close = getattr(node, "close", None)
                if close is not None:
                    close()
                node.destroy_node()
        rclpy.shutdown()
        spinner.join(timeout=5.0)


def _ros_time_stands_still(nodes: list[Node]) -> None:
    for node in nodes:
        assert node.get_parameter("use_sim_time").value is True
        assert node.get_clock().now().nanoseconds == 0, f"{node.get_name()}: /clock was published"


@pytest.mark.parametrize("node", ["budget_manager", "sensor_sim", "foxglove_view"])
def test_diagnostics_keep_coming_without_clock(sim_time_graph, node):
    seen, nodes = sim_time_graph
    wait_for(lambda: len(seen.diagnostics.get(f"{NS}/{node}", [])) >= 2, WAIT_S,
             f"two /diagnostics arrays from {node} with use_sim_time and no /clock")
    with seen.lock:
        arrays = list(seen.diagnostics[f"{NS}/{node}"])
    assert all(a.header.stamp.sec == 0 and a.header.stamp.nanosec == 0 for a in arrays)  # stamped on ROS time
    _ros_time_stands_still(nodes)


def test_budget_profile_and_manager_keep_running_without_clock(sim_time_graph):
    seen, nodes = sim_time_graph
    wait_for(lambda: len([p for p in seen.profiles if p["node"] == LANE]) >= 2, WAIT_S,
             "two budget profiles from lane_node with use_sim_time and no /clock")

    def lane_budgeted():
        with seen.lock:
            return any((r["nodes"].get(LANE) or {}).get("budget_mb") is not None for r in seen.reports)

    # the manager's evaluations run, and the profile is fresh when they read it: lane_node gets a budget
    wait_for(lane_budgeted, WAIT_S, "a budget report giving lane_node a budget")
    _ros_time_stands_still(nodes)
