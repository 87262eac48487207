"""`dynnet up` restarts a crashed node while the rest of the graph keeps serving.

One live graph (real `dynnet up`, real rclpy): the simulator, pedestrian and depth nodes, and a
lane node pointed at an ONNX model that is no segmenter (the preflight reads only that it is a
model), so it exits with status 1 at every start.
`kill -9` on the depth node (what the OOM killer does) brings it back as a new process that
publishes again, and pedestrian detections arrive while it is down; the lane node is restarted
with doubling delays, then left down at its limit with an ERROR line and a stderr report, and
the others keep serving. The only timeouts are generous waits.
"""
from __future__ import annotations

import os
import re
import signal
import threading
from pathlib import Path

import onnx
import pytest
import yaml
from _up import Up, separate_processes
from _waiting import wait_for
from onnx import TensorProto, helper
from rclpy.qos import qos_profile_sensor_data
from sensor_msgs.msg import Image
from visualization_msgs.msg import MarkerArray

from dynnet_ros.graph_config import default_config_path, parse_graph
from dynnet_ros.nodes.background import BackgroundNode
from dynnet_ros.zoo import ensure_model

pytestmark = [pytest.mark.timeout(600), pytest.mark.graph]

NS = f"/respawn_{os.getpid()}"
CRASH_RETRIES = 2
CRASH_DELAY_S = 0.25


def not_a_segmenter(path: Path) -> Path:
    """A valid ONNX model with no image input: the preflight passes it, the lane node's start fails."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "not_a_segmenter", [x], [y])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def respawn_graph(path: Path) -> Path:
    """The vehicle graph, light (small slow camera), without the budget manager; the lane node
    crashes at every start; each node in a process of its own."""
    data = separate_processes(yaml.safe_load(default_config_path().read_text()))
    nodes = []
    for node in data["nodes"]:
        params = node.setdefault("parameters", {})
        if node["name"] == "budget_manager":
            continue
        if node["name"] == "sensor_sim":
            params.update(rate_hz=2.0, resolutions=["160x120"], lidar_azimuth_steps=64)
        else:
            params.update(max_input_side=160)
        node.update(respawn=True, respawn_delay_s=0.5, respawn_max_retries=3, respawn_window_s=600.0)
        if node["name"] == "lane_node":
            params.update(model_path=str(not_a_segmenter(path.parent / "not_a_segmenter.onnx")))
            node.update(respawn_delay_s=CRASH_DELAY_S, respawn_max_retries=CRASH_RETRIES)
        nodes.append(node)
    data["nodes"] = nodes
    parse_graph(data, "respawn graph")  # a config the parser refuses fails here, not in the child
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


class Counter:
    """Messages per topic, seen by a node of the test's own."""

    def __init__(self, topics: dict[str, type]) -> None:
        self.ros = BackgroundNode("respawn_test_observer")
        self.counts = dict.fromkeys(topics, 0)
        self.lock = threading.Lock()
        for topic, kind in topics.items():
            self.ros.node.create_subscription(kind, f"{NS}/{topic}", self._counter(topic), qos_profile_sensor_data)
        self.ros.start()

    def _counter(self, topic: str):
        def count(_msg) -> None:
            with self.lock:
                self.counts[topic] += 1
        return count

    def __getitem__(self, topic: str) -> int:
        with self.lock:
            return self.counts[topic]


def test_a_killed_node_comes_back_and_a_crash_loop_stops_at_its_limit(tmp_path):
    for task in ("pedestrian", "depth"):
        ensure_model(task)
    config = respawn_graph(tmp_path / "vehicle.yaml")
    seen = Counter({"pedestrian/markers": MarkerArray, "depth/image": Image})
    up = Up(config, NS)
    try:
        wait_for(lambda: (seen["pedestrian/markers"] and seen["depth/image"]) or up.proc.poll() is not None,
                 240, "pedestrian and depth outputs")
        assert up.proc.poll() is None, up.log()
        pedestrian_pid, depth_pid = up.pid("pedestrian_node"), up.pid("depth_node")
        assert pedestrian_pid and depth_pid, up.log()

        # kill -9 the depth node: it comes back as a new process and publishes again
        os.kill(depth_pid, signal.SIGKILL)
        wait_for(lambda: up.supervisor("WARN", "depth_node"), 60, "the supervisor noticing the kill")
        pedestrian_at_kill = seen["pedestrian/markers"]
        new_pid = wait_for(lambda: up.supervisor("INFO", "depth_node") and up.pid("depth_node"), 120,
                           "depth_node restarted")
        assert new_pid != depth_pid
        depth_at_restart = seen["depth/image"]
        wait_for(lambda: seen["depth/image"] >= depth_at_restart + 3, 180, "depth outputs from the new process")
        assert "was killed by SIGKILL" in up.supervisor("WARN", "depth_node")[0], up.log()
        # the pedestrian node served throughout, in the same process
        assert seen["pedestrian/markers"] > pedestrian_at_kill, up.log()
        assert up.pid("pedestrian_node") == pedestrian_pid

        # the crash loop: restarts with doubling delays, then left down and reported
        wait_for(lambda: up.supervisor("ERROR", "lane_node") or up.proc.poll() is not None, 240,
                 "lane_node left down")
        assert up.proc.poll() is None, up.log()
        delays = [float(re.search(r"restarting in ([0-9.]+) s", line).group(1))
                  for line in up.supervisor("WARN", "lane_node")]
        assert delays == [CRASH_DELAY_S * 2 ** k for k in range(CRASH_RETRIES)], up.log()
        assert len(up.supervisor("INFO", "lane_node")) == CRASH_RETRIES, up.log()
        [error] = up.supervisor("ERROR", "lane_node")
        assert f"{CRASH_RETRIES + 1} crashes" in error and "exited with status 1" in error, error
        assert any("lane_node" in line and "left down" in line for line in up.err), up.log()
        # ... and the others keep serving; the lane node stays down
        pedestrian, depth = seen["pedestrian/markers"], seen["depth/image"]
        wait_for(lambda: seen["pedestrian/markers"] >= pedestrian + 3 and seen["depth/image"] >= depth + 3, 120,
                 "pedestrian and depth outputs after lane_node was left down")
        assert len(up.supervisor("INFO", "lane_node")) == CRASH_RETRIES, up.log()
        assert up.pid("lane_node") is None, up.log()
    finally:
        seen.ros.close()
        code = up.stop()
    log = up.log()
    assert code == 1, log  # a node left down makes the run a failure
    assert any("failure: node(s) left down: lane_node" in line for line in up.err), log
    assert not any("Traceback" in line for line in up.out + up.err), log


def test_a_crash_loop_cut_short_by_the_end_of_the_run_fails_the_run(tmp_path):
    """A node that crashed again after its restart makes `dynnet up` fail even though the run ended
    before the node reached its retry limit."""
    data = separate_processes(yaml.safe_load(default_config_path().read_text()))
    [lane] = [node for node in data["nodes"] if node["name"] == "lane_node"]
    lane.setdefault("parameters", {})["model_path"] = str(not_a_segmenter(tmp_path / "not_a_segmenter.onnx"))
    lane.update(respawn=True, respawn_delay_s=CRASH_DELAY_S, respawn_max_retries=50, respawn_window_s=600.0)
    data["nodes"] = [lane]
    config = tmp_path / "lane_only.yaml"
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    up = Up(config, NS)
    try:
        wait_for(lambda: len(up.supervisor("WARN", "lane_node")) >= 2 or up.proc.poll() is not None, 240,
                 "lane_node crashing twice")
        assert up.proc.poll() is None, up.log()
    finally:
        code = up.stop()
    log = up.log()
    assert code == 1, log
    assert any("failure: node(s) crash-looped: lane_node exited with status 1" in line for line in up.err), log
    assert not any("left down" in line for line in up.err), log
