"""The component container for real: its composition services, fault isolation and respawn.

* A container process (`python -m dynnet_ros.nodes.container`) is driven through the real
  `composition_interfaces` services, the way `ros2 component` and launch_ros drive rclcpp's:
  plugins resolve (ours, and a test package's registered through its own entry points), the
  request's name, namespace, parameters and remappings reach the node, errors answer as
  rclcpp's do, unload removes the node from the graph. A node of the test package raises in a
  subscription callback: the container reports it on /diagnostics (ERROR, naming the node), and
  that node and its neighbour keep serving.
* `dynnet up` with a container: SIGKILL the container, and every node it hosts comes back with
  the parameter values set on it at run time.
"""
from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import yaml
from _up import Up
from _waiting import quoting, wait_for
from diagnostic_msgs.msg import DiagnosticArray
from rcl_interfaces.msg import Parameter as ParameterMsg
from rclpy.parameter import Parameter, parameter_value_to_python
from rclpy.parameter_client import AsyncParameterClient
from rclpy.qos import QoSProfile, qos_profile_sensor_data
from sensor_msgs.msg import Image
from std_msgs.msg import Int32, String

from dynnet_ros.graph_config import default_config_path, parse_graph
from dynnet_ros.nodes.background import BackgroundNode
from dynnet_ros.nodes.container import composition_services
from dynnet_ros.nodes.diagnostics import ERROR, level_value, status_values
from dynnet_ros.nodes.service_answers import REFUSED
from dynnet_ros.zoo import ensure_model

ROOT = Path(__file__).resolve().parents[1]
INTERFACES_KIT = ROOT.parent / "shared" / "vendor" / "ros2-interfaces"
pytestmark = [pytest.mark.timeout(600), pytest.mark.graph]

#: a package of the test's own with a node that raises in a callback, registered like ours
FAULTY_MODULE = '''
from rclpy.node import Node
from std_msgs.msg import Int32, String


class Faulty(Node):
    """Raises on every message on fault/trigger; publishes a count on faulty/alive 5 times a second."""

    def __init__(self, **options):
        super().__init__("faulty", **options)
        self.count = 0
        self.alive = self.create_publisher(Int32, "faulty/alive", 10)
        self.create_subscription(String, "fault/trigger", self.on_trigger, 10)
        self.create_timer(0.2, self.tick)

    def on_trigger(self, msg):
        raise RuntimeError(f"boom: {msg.data}")

    def tick(self):
        self.count += 1
        self.alive.publish(Int32(data=self.count))
'''


def _services():
    services = composition_services()
    if services is None:
        if INTERFACES_KIT.is_dir():
            pytest.fail(f"the real composition_interfaces is not importable although {INTERFACES_KIT} is there: "
                        "run `make test` (it builds and sources .venv/ros2-interfaces) or "
                        ". .venv/ros2-interfaces/install/local_setup.sh")
        pytest.skip("composition_interfaces (a ROS package with no PyPI wheel) is not importable")
    return services


def faulty_package(root: Path) -> Path:
    """``dynnet_faulty``: a module and a dist-info whose entry point registers
    ``dynnet_faulty::Faulty`` in the dynnet_ros.components group."""
    (root / "dynnet_faulty.py").write_text(FAULTY_MODULE)
    info = root / "dynnet_faulty-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: dynnet_faulty\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[dynnet_ros.components]\ndynnet_faulty::Faulty = dynnet_faulty:Faulty\n")
    return root


class Client:
    """The test's node: composition service calls, parameter reads, topic counts, diagnostics."""

    def __init__(self, container: str) -> None:
        load, unload, listing = _services()
        self.types = {"load": load, "unload": unload, "list": listing}
        self.ros = BackgroundNode("container_test_client")
        node = self.ros.node
        self.clients = {"load": node.create_client(load, f"{container}/_container/load_node"),
                        "unload": node.create_client(unload, f"{container}/_container/unload_node"),
                        "list": node.create_client(listing, f"{container}/_container/list_nodes")}
        self.counts: dict[str, int] = {}
        self.statuses: list = []
        self.lock = threading.Lock()
        node.create_subscription(DiagnosticArray, "/diagnostics", self._on_diagnostics, 100)
        self.ros.start()

    def _on_diagnostics(self, msg: DiagnosticArray) -> None:
        with self.lock:
            self.statuses.extend(msg.status)

    def status(self, name: str, hardware_id: str) -> list:
        with self.lock:
            return [s for s in self.statuses if s.name == name and s.hardware_id == hardware_id]

    def count(self, topic: str, kind, qos=10) -> None:
        def seen(_msg) -> None:
            with self.lock:
                self.counts[topic] = self.counts.get(topic, 0) + 1
        self.counts.setdefault(topic, 0)
        self.ros.node.create_subscription(kind, topic, seen, qos)

    def seen(self, topic: str) -> int:
        with self.lock:
            return self.counts.get(topic, 0)

    def call(self, service: str, **fields):
        client = self.clients[service]
        assert client.wait_for_service(timeout_sec=60.0), f"{client.srv_name} not available"
        request = self.types[service].Request()
        for key, value in fields.items():
            setattr(request, key, value)
        future = client.call_async(request)
        wait_for(future.done, 120.0, f"the answer of {client.srv_name}")
        return future.result()

    def parameter(self, node: str, name: str):
        client = AsyncParameterClient(self.ros.node, node)
        assert client.wait_for_services(timeout_sec=30.0), f"{node}: parameter services not available"
        future = client.get_parameters([name])
        wait_for(future.done, 30.0, f"get_parameters on {node}")
        return parameter_value_to_python(future.result().values[0])

    def set_parameter(self, node: str, name: str, value) -> None:
        client = AsyncParameterClient(self.ros.node, node)
        assert client.wait_for_services(timeout_sec=30.0), f"{node}: parameter services not available"
        future = client.set_parameters([Parameter(name, value=value)])
        wait_for(future.done, 60.0, f"set_parameters on {node}")
        assert future.result().results[0].successful, future.result().results[0].reason

    def node_names(self) -> set[str]:
        return {f"{ns.rstrip('/')}/{name}" for name, ns in self.ros.node.get_node_names_and_namespaces()}

    def close(self) -> None:
        self.ros.close()


def parameters(**values) -> list[ParameterMsg]:
    return [Parameter(name, value=value).to_parameter_msg() for name, value in values.items()]


def test_nodes_load_and_unload_through_the_composition_services_and_a_callback_exception_stays_in_its_node(
        tmp_path):
    _services()
    ns = f"/ctest_{os.getpid()}"
    container = f"{ns}/comp_test"
    env = {**os.environ, "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join([str(faulty_package(tmp_path)), os.environ.get("PYTHONPATH", "")])}
    log = (tmp_path / "container.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "dynnet_ros.nodes.container", "--ros-args", "-r",
                             "__node:=comp_test", "-r", f"__ns:={ns}"], stdout=log, stderr=subprocess.STDOUT,
                            env=env, cwd=ROOT, start_new_session=True)
    client = Client(container)
    client.count(f"{ns}/cam/image", Image, qos_profile_sensor_data)
    client.count(f"{ns}/faulty/alive", Int32)
    trigger = client.ros.node.create_publisher(String, f"{ns}/fault/trigger", QoSProfile(depth=10))
    try:
        with quoting(lambda: (tmp_path / "container.log").read_text()):  # the container's side of a failure
            assert list(client.call("list").unique_ids) == []
            # errors answer as rclcpp's container does, and take no unique id
            answer = client.call("load", package_name="dynnet_ros", plugin_name="dynnet_ros::NoSuchNode")
            assert not answer.success and answer.error_message == "Failed to find class with the requested plugin name."
            answer = client.call("load", package_name="no_such_package", plugin_name="no_such_package::Node")
            assert not answer.success and answer.error_message == "Could not find requested resource in ament index"
            answer = client.call("load", package_name="dynnet_ros", plugin_name="dynnet_ros::SensorSim",
                                 node_name="bad_sim", parameters=parameters(rate_hz=-1.0))
            assert not answer.success and answer.error_message.startswith("Component constructor threw an exception: ")
            assert "rate_hz" in answer.error_message
            answer = client.call("load", package_name="dynnet_ros", plugin_name="dynnet_ros::SensorSim",
                                 node_name="sim", extra_arguments=parameters(use_intra_process_comms=1))
            assert not answer.success
            assert answer.error_message == "Extra component argument 'use_intra_process_comms' must be a boolean"

            # our simulator, with the request's name, namespace, parameters and remapping
            sim = client.call("load", package_name="dynnet_ros", plugin_name="dynnet_ros::SensorSim", node_name="sim",
                              node_namespace=ns, remap_rules=["camera/image_raw:=cam/image"],
                              parameters=parameters(rate_hz=5.0, resolutions=["160x120"], lidar_azimuth_steps=64),
                              extra_arguments=parameters(use_intra_process_comms=True))
            assert sim.success, sim.error_message
            assert sim.full_node_name == f"{ns}/sim" and sim.unique_id == 2  # the failed constructor took 1
            assert client.parameter(f"{ns}/sim", "rate_hz") == 5.0
            wait_for(lambda: client.seen(f"{ns}/cam/image") >= 3, 120, "frames on the remapped camera topic")
            # the test package's node, resolved through its own entry point
            faulty = client.call("load", package_name="dynnet_faulty", plugin_name="dynnet_faulty::Faulty",
                                 node_namespace=ns)
            assert faulty.success and faulty.full_node_name == f"{ns}/faulty", faulty.error_message
            listing = client.call("list")
            assert list(listing.unique_ids) == [sim.unique_id, faulty.unique_id]
            assert list(listing.full_node_names) == [f"{ns}/sim", f"{ns}/faulty"]
            wait_for(lambda: client.seen(f"{ns}/faulty/alive") >= 3, 60, "the faulty node's heartbeat")

            # an exception in one node's callback: reported against it; it and its neighbour keep serving
            wait_for(lambda: trigger.get_subscription_count() > 0, 60, "the faulty node's trigger subscription")
            trigger.publish(String(data="first"))
            errors = wait_for(lambda: [s for s in client.status("faulty: callback", f"{ns}/faulty")
                                       if level_value(s.level) == ERROR], 60, "the ERROR status of the faulty node")
            assert "RuntimeError: boom: first" in errors[-1].message
            assert status_values(errors[-1])["exceptions"] == 1
            frames, beats = client.seen(f"{ns}/cam/image"), client.seen(f"{ns}/faulty/alive")
            trigger.publish(String(data="second"))
            wait_for(lambda: any(status_values(s)["exceptions"] == 2
                                 for s in client.status("faulty: callback", f"{ns}/faulty")), 60,
                     "the second exception")
            wait_for(lambda: client.seen(f"{ns}/cam/image") >= frames + 5
                     and client.seen(f"{ns}/faulty/alive") >= beats + 5, 60, "both nodes serving after the exceptions")
            assert proc.poll() is None

            # unload: the node leaves the graph and the listing; its id is not found again
            answer = client.call("unload", unique_id=sim.unique_id)
            assert answer.success, answer.error_message
            wait_for(lambda: f"{ns}/sim" not in client.node_names(), 60, "the unloaded node gone from the graph")
            assert list(client.call("list").full_node_names) == [f"{ns}/faulty"]
            answer = client.call("unload", unique_id=sim.unique_id)
            assert not answer.success and answer.error_message == f"No node found with unique_id: {sim.unique_id}"
    finally:
        client.close()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
        code = proc.wait(timeout=60)
        log.close()
    text = (tmp_path / "container.log").read_text()
    assert code == 0, text[-5000:]
    assert "RuntimeError: boom: first" in text and "exception in a callback of " + f"{ns}/faulty" in text, text[-5000:]
    assert "extra argument 'use_intra_process_comms' ignored" in text, text[-5000:]
    assert REFUSED not in text, text[-5000:]  # every answer reached the test's client (service_answers.py)


def container_graph(path: Path) -> Path:
    """A light vehicle graph: the simulator alone, the lane node and the budget manager in one container."""
    data = yaml.safe_load(default_config_path().read_text())
    data["nodes"] = [n for n in data["nodes"] if n["name"] in ("sensor_sim", "lane_node", "budget_manager")]
    for node in data["nodes"]:
        params = node.setdefault("parameters", {})
        if node["name"] == "sensor_sim":
            params.update(rate_hz=4.0, resolutions=["160x120"], lidar_azimuth_steps=64)
        elif node["name"] == "lane_node":
            params.update(max_input_side=160, camera_sizes=["160x120"])
        else:
            params.update(node_names=["lane_node"], node_priorities=[1.0], node_min_mb=[0.0], node_max_mb=[0.0])
    data["containers"]["model_container"].update(respawn_delay_s=0.5, respawn_max_retries=3)
    parse_graph(data, "container graph")
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_a_killed_container_brings_every_node_back_with_its_run_time_values(tmp_path):
    ensure_model("lane")
    ns = f"/ckill_{os.getpid()}"
    client = Client(f"{ns}/model_container")
    client.count(f"{ns}/lane/mask", Image)
    up = Up(container_graph(tmp_path / "vehicle.yaml"), ns)
    try:
        wait_for(lambda: client.seen(f"{ns}/lane/mask") >= 3 or up.proc.poll() is not None, 300, "lane masks")
        assert up.proc.poll() is None, up.log()
        for node, name, value in (("lane_node", "lane_threshold", 0.7), ("budget_manager", "reserve_mb", 300.0)):
            def kept(node=node, name=name, value=value) -> bool:
                """Set the value until the supervisor reports it kept: a parameter event sent before
                the supervisor's /parameter_events subscription matched the container is not resent."""
                if not [line for line in up.supervisor("INFO", node) if f"{name} = " in line]:
                    client.set_parameter(f"{ns}/{node}", name, value)
                    return False
                return True
            wait_for(kept, 120, f"the supervisor keeping {node}'s {name}", interval=3.0)
        pid = up.pid("container")
        assert pid is not None, up.log()
        os.kill(pid, signal.SIGKILL)
        warn = wait_for(lambda: up.supervisor("WARN", "model_container"), 60, "the container's death noticed")[0]
        assert "was killed by SIGKILL" in warn
        info = wait_for(lambda: [line for line in up.supervisor("INFO", "model_container") if "restarted" in line],
                        120, "the container restarted")[0]
        kept = dict(part.split(": ", 1) for part in info.split(" with ", 1)[1].split("; "))
        assert "lane_threshold=0.7" in kept["values set at run time on lane_node"], info
        assert "reserve_mb=300.0" in kept["values set at run time on budget_manager"], info
        assert up.pid("container") not in (None, pid)
        masks = client.seen(f"{ns}/lane/mask")
        wait_for(lambda: client.seen(f"{ns}/lane/mask") >= masks + 3, 300, "lane masks from the new container")
        assert client.parameter(f"{ns}/lane_node", "lane_threshold") == 0.7
        assert client.parameter(f"{ns}/budget_manager", "reserve_mb") == 300.0
    finally:
        client.close()
        code = up.stop()
    assert code == 0, up.log()
    assert not any("Traceback" in line for line in up.out + up.err), up.log()


def _launch_available() -> bool:
    return importlib.util.find_spec("launch_ros") is not None


COMPOSED_LAUNCH = '''
from launch import LaunchDescription
from launch_ros.actions import ComposableNodeContainer
from launch_ros.descriptions import ComposableNode


def generate_launch_description():
    return LaunchDescription([ComposableNodeContainer(
        package="dynnet_ros", executable="container", name="perception", namespace="{ns}", output="screen",
        composable_node_descriptions=[
            ComposableNode(package="dynnet_ros", plugin="dynnet_ros::SensorSim", name="sim", namespace="{ns}",
                           parameters=[{{"rate_hz": 4.0, "resolutions": ["160x120"], "lidar_azimuth_steps": 64}}]),
            ComposableNode(package="dynnet_ros", plugin="dynnet_ros::LaneNode", name="lane", namespace="{ns}",
                           parameters=[{{"max_input_side": 160, "camera_sizes": ["160x120"], "lane_threshold": 0.6}}],
                           remappings=[("lane/mask", "lane/composed_mask")]),
        ])])
'''


@pytest.mark.skipif(not _launch_available(), reason="launch_ros is not importable (see test_launch.py)")
def test_a_composable_node_container_under_launch_loads_our_nodes_and_unloads_them(install, tmp_path):
    _services()
    ensure_model("lane")
    from test_launch import RUNNER  # the `ros2 launch` stand-in (the ros2 CLI has no wheel)

    ns = f"/claunch_{os.getpid()}"
    launch_file = tmp_path / "composed.launch.py"
    launch_file.write_text(textwrap.dedent(COMPOSED_LAUNCH.format(ns=ns)))
    client = Client(f"{ns}/perception")
    client.count(f"{ns}/lane/composed_mask", Image)
    # the package's install space, over the real composition_interfaces this process has sourced
    env = {**install, **{key: os.pathsep.join(filter(None, [install.get(key), os.environ.get(key)]))
                         for key in ("PYTHONPATH", "AMENT_PREFIX_PATH")}}
    proc = subprocess.Popen([sys.executable, str(RUNNER), str(launch_file)], env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(line.rstrip("\n") for line in proc.stdout), daemon=True)
    reader.start()
    try:
        with quoting(lambda: "\n".join(lines)):
            wait_for(lambda: client.seen(f"{ns}/lane/composed_mask") >= 3 or proc.poll() is not None, 300,
                     "lane masks from the composed lane node")
            assert proc.poll() is None, "\n".join(lines[-80:])
            assert any(f"Loaded node '{ns}/lane' in container '{ns}/perception'" in line for line in lines), lines[-80:]
            assert client.parameter(f"{ns}/lane", "lane_threshold") == 0.6
            listing = client.call("list")
            assert list(listing.full_node_names) == [f"{ns}/sim", f"{ns}/lane"]
            for unique_id, name in zip(listing.unique_ids, listing.full_node_names):
                answer = client.call("unload", unique_id=unique_id)
                assert answer.success, (name, answer.error_message)
            wait_for(lambda: not {f"{ns}/sim", f"{ns}/lane"} & client.node_names(), 60,
                     "both nodes gone from the graph")
            assert list(client.call("list").unique_ids) == []
            assert proc.poll() is None
    finally:
        client.close()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
        code = proc.wait(timeout=60)
        reader.join(timeout=5)
    log = "\n".join(lines)
    assert code == 0, log[-5000:]
    trouble = next((i for i, line in enumerate(lines) if "Traceback" in line or "escalating" in line), None)
    assert trouble is None, "\n".join(lines[max(0, trouble - 5):trouble + 40])
    assert any("[container-1]" in line and "process has finished cleanly" in line for line in lines), log[-5000:]
