"""Every node stops on the first SIGINT/SIGTERM, in every phase and whichever peers left first.

A single node (run_node around a stand-in factory) is stopped while it builds, while a callback
runs and while its model runs a frame; then the whole graph (`dynnet up`'s GraphRunner) is
started and stopped ten times, in four stop orders, with the model nodes and the manager in their
container or each in a process of its own, and no process may need SIGTERM or SIGKILL.
The only timeouts are the generous escalation steps themselves.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import threading

import pytest
import yaml
from _up import separate_processes
from _waiting import wait_for
from diagnostic_msgs.msg import DiagnosticArray

from dynnet_ros.graph_config import default_config_path, parse_graph
from dynnet_ros.nodes.background import BackgroundNode
from dynnet_ros.supervisor.runner import GraphRunner
from dynnet_ros.zoo import ensure_model

pytestmark = [pytest.mark.timeout(600), pytest.mark.graph]

MODEL_NODES = ("lane_node", "pedestrian_node", "depth_node")
ESCALATION_TIMEOUT_S = 20.0  # far above a clean stop; only a hang reaches it

# A node whose construction, or one timer callback, takes `delay` seconds; it says when it gets there.
STAND_IN = textwrap.dedent("""
    import sys, time
    from rclpy.node import Node
    from dynnet_ros.nodes.base import run_node

    phase, delay = sys.argv[1], float(sys.argv[2])

    class StandIn(Node):
        def __init__(self):
            super().__init__("stand_in")
            if phase == "build":
                print("building", flush=True)
                time.sleep(delay)
            self.create_timer(0.05, self.slow)

        def slow(self):
            if phase == "callback":
                print("in callback", flush=True)
                time.sleep(delay)

    sys.exit(run_node(StandIn))
""")


# A lane node whose frame (its model call) does not end: it gets one frame and says when it is in it.
STAND_IN_FRAME = textwrap.dedent("""
    import sys, time
    import numpy as np
    from dynnet_ros.nodes.base import run_node
    from dynnet_ros.nodes.convert import array_to_image
    from dynnet_ros.nodes.lane_node import LaneNode

    class StuckLaneNode(LaneNode):
        def __init__(self):
            super().__init__()
            self._on_image(array_to_image(np.zeros((120, 160, 3), np.uint8), "rgb8"))

        def infer(self, frame, rgb, core):
            print("in frame", flush=True)
            time.sleep(float(sys.argv[2]))

    sys.exit(run_node(StuckLaneNode))
""")


def stand_in(phase: str, delay: float, sig: int) -> tuple[int, str]:
    script = STAND_IN_FRAME if phase == "frame" else STAND_IN
    proc = subprocess.Popen([sys.executable, "-c", script, phase, str(delay)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    marker = {"build": "building", "callback": "in callback", "frame": "in frame"}[phase]
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if marker in line:
            break
    proc.send_signal(sig)
    try:
        code = proc.wait(timeout=ESCALATION_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        proc.kill()
        proc.wait()
        raise AssertionError(f"{phase}: still running {ESCALATION_TIMEOUT_S:.0f} s after "
                             f"{signal.Signals(sig).name}") from exc
    return code, "".join(lines) + proc.stdout.read()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_while_the_node_is_built_stops_it(sig):
    code, out = stand_in("build", 600.0, sig)
    assert code == 0 and "Traceback" not in out, out


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_callback_that_does_not_finish_does_not_hold_the_process(sig):
    code, out = stand_in("callback", 600.0, sig)
    assert code == 0 and "still running" in out and "Traceback" not in out, out


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_frame_that_does_not_finish_does_not_hold_the_process(sig):
    """A model node stopped mid-frame exits cleanly without the frame, before the shutdown
    watchdog (which would call it a hang: thread dump, exit status 1)."""
    ensure_model("lane")
    code, out = stand_in("frame", 600.0, sig)
    assert code == 0 and "still running" in out and "lane_node-worker" in out, out
    assert "Traceback" not in out and "Timeout" not in out, out


def light_graph() -> dict:
    """The vehicle graph with a small, slow camera: the cycles test shutdown, not throughput."""
    data = yaml.safe_load(default_config_path().read_text())
    for node in data["nodes"]:
        params = node.setdefault("parameters", {})
        if node["name"] == "sensor_sim":
            params.update(rate_hz=2.0, resolutions=["160x120"], lidar_azimuth_steps=64)
        if node["name"] in MODEL_NODES:
            params.update(max_input_side=160)
        if node["name"] == "budget_manager":
            params.update(rate_hz=2.0, min_interval_s=0.0)  # budget pushes keep flowing up to the stop
    return data


class Reporters:
    """Which nodes of one namespace have published diagnostics (they spin, their services are up)."""

    def __init__(self, namespace: str) -> None:
        self.ros = BackgroundNode("shutdown_test_observer")
        self.prefix = namespace + "/"
        self.names: set[str] = set()
        self.lock = threading.Lock()
        self.ros.node.create_subscription(DiagnosticArray, "/diagnostics", self._on_diag, 100)
        self.ros.start()

    def _on_diag(self, msg: DiagnosticArray) -> None:
        with self.lock:
            for status in msg.status:
                if status.hardware_id.startswith(self.prefix):
                    self.names.add(status.hardware_id[len(self.prefix):])

    def clear(self) -> None:
        with self.lock:
            self.names.clear()

    def all_of(self, names) -> bool:
        with self.lock:
            return set(names) <= self.names


def cycle_start_stop(graph, namespace: str, reporters: Reporters, first_names: tuple[str, ...], label: str) -> None:
    """Start the graph, wait until every node reports, SIGINT ``first_names`` (then the rest), check."""
    reporters.clear()
    log: list[str] = []
    runner = GraphRunner(graph, namespace=namespace, sink=lambda name, line: log.append(f"[{name}] {line}"))
    names = [n.name for n in graph.nodes]
    try:
        runner.start()
        wait_for(lambda: reporters.all_of(names) or runner.dead(), 180, f"{label}: all nodes up")
        assert not runner.dead(), "\n".join(log[-80:])
        first = [c for c in runner.children if c.node.name in first_names]
        for child in first:
            os.killpg(child.proc.pid, signal.SIGINT)
        for child in first:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.proc.wait(timeout=ESCALATION_TIMEOUT_S)
        hung = [c.node.name for c in first if c.proc.poll() is None]
    finally:
        codes = runner.stop(int_timeout=ESCALATION_TIMEOUT_S)
    label += f" ({', '.join(first_names) + ' first' if first_names else 'all at once'})"
    assert not hung, f"{label}: {hung} still running after SIGINT\n" + "\n".join(log[-80:])
    assert not runner.escalated, f"{label}: {runner.escalated}\n" + "\n".join(log[-80:])
    assert all(code == 0 for code in codes.values()), f"{label}: {codes}\n" + "\n".join(log[-80:])
    assert not [line for line in log if "Traceback" in line], "\n".join(log[-80:])


def test_ten_graph_start_stop_cycles_need_no_escalation():
    for task in ("lane", "pedestrian", "depth"):
        ensure_model(task)
    namespace = f"/shutdown_{os.getpid()}"
    composed = parse_graph(light_graph(), "light graph")
    separate = parse_graph(separate_processes(light_graph()), "light graph, a process per node")
    reporters = Reporters(namespace)
    # stop orders: everything at once (model nodes and manager in their container); model nodes
    # first (the budget manager's peers gone first); the budget manager first; the container
    # (models and manager at once) before the simulator
    orders = [(composed, ()), (separate, MODEL_NODES), (separate, ("budget_manager",)),
              (composed, ("model_container",))]
    try:
        for cycle in range(10):
            graph, first = orders[cycle % len(orders)]
            cycle_start_stop(graph, namespace, reporters, first, f"cycle {cycle}")
    finally:
        reporters.ros.close()
