"""`ros2 launch dynnet_ros vehicle.launch.py` for real: colcon build, LaunchService, Ctrl-C.

Runs wherever `launch`/`launch_ros` import: a system ROS 2, or this venv with the kit in
../shared/vendor/ros2-launch installed (`make test` installs it when the kit is there). Two
launches, together covering every launch argument: all defaults, then `use_sim:=false
config:=<custom> namespace:=<ns>`. Each checks that the config's nodes come up with its parameters,
remappings and namespace, that outputs publish, that the processes match what `dynnet up` starts
for the same arguments (the default config's component container and the nodes it hosts, each
with the arguments it would have on its own; the custom config takes the depth node out of the
container into a process of its own), that a node killed with SIGKILL is respawned as the config's respawn keys
say (the second launch kills the depth node twice: one restart, then left down), and that one
Ctrl-C (SIGINT to the process group, as a terminal sends it) stops every node cleanly, without
launch escalating to SIGTERM/SIGKILL.
"""
from __future__ import annotations

import importlib.util
import math
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import psutil
import pytest
import yaml
from _waiting import quoting, wait_for
from rclpy.parameter import parameter_value_to_python
from rclpy.parameter_client import AsyncParameterClient
from rclpy.qos import qos_profile_sensor_data
from sensor_msgs.msg import Image
from visualization_msgs.msg import MarkerArray

from dynnet_ros.graph_config import (
    CONTAINER,
    CONTAINER_MODULE,
    EXECUTABLES,
    PLUGINS,
    default_config_path,
    graph_processes,
    load_graph,
)
from dynnet_ros.nodes.background import BackgroundNode
from dynnet_ros.nodes.convert import array_to_image
from dynnet_ros.supervisor.runner import GraphRunner

ROOT = Path(__file__).resolve().parents[1]
KIT = ROOT.parent / "shared" / "vendor" / "ros2-launch"  # the `install` fixture (conftest.py) needs it installed
RUNNER = Path(__file__).with_name("_launch_runner.py")
MODULE_TO_EXECUTABLE = {module: exe for exe, module in {**EXECUTABLES, CONTAINER: CONTAINER_MODULE}.items()}
PLUGIN_TO_EXECUTABLE = {plugin: exe for exe, plugin in PLUGINS.items()}


class _ParamsLoader(yaml.SafeLoader):
    """The safe loader plus the one tag launch_ros writes into parameter files: list parameters
    come out as ``!!python/tuple``, read here as plain lists."""


_ParamsLoader.add_constructor("tag:yaml.org,2002:python/tuple",
                              lambda loader, node: loader.construct_sequence(node))


def _launch_missing() -> str | None:
    if importlib.util.find_spec("launch_ros") is not None and importlib.util.find_spec("launch") is not None:
        return None
    if KIT.is_dir():
        return None  # the kit is there: a missing install is a failure (see the test), not a skip
    return (f"launch/launch_ros are not importable and {KIT} is absent (they have no PyPI wheels; a system "
            "ROS 2 install or that kit provides them)")


pytestmark = [pytest.mark.skipif(_launch_missing() is not None, reason=str(_launch_missing())),
              pytest.mark.timeout(600), pytest.mark.graph]


class Launch:
    """The launch runner in its own session (so a group SIGINT reaches launch and its nodes, like
    Ctrl-C in a terminal), its output collected."""

    def __init__(self, env: dict[str, str], args: list[str]) -> None:
        launch_file = Path(env["INSTALL_PREFIX"]) / "share" / "dynnet_ros" / "launch" / "vehicle.launch.py"
        self.proc = subprocess.Popen([sys.executable, str(RUNNER), str(launch_file), *args], env=env,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, start_new_session=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def output(self) -> str:
        return "\n".join(self.lines)

    def node_processes(self) -> list[psutil.Process]:
        return psutil.Process(self.proc.pid).children()

    def ctrl_c(self, timeout: float = 60.0) -> int:
        os.killpg(self.proc.pid, signal.SIGINT)
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            raise AssertionError(f"launch did not exit {timeout:.0f} s after Ctrl-C:\n{self.output()[-5000:]}") from exc
        self._reader.join(timeout=5.0)
        return code


class Observer:
    """Records the graph's outputs and reads parameters through the nodes' parameter services."""

    def __init__(self, namespace: str) -> None:
        self.ros = BackgroundNode("launch_test_observer")
        self.node = self.ros.node
        self.ns = namespace
        self.counts: dict[str, int] = {}
        self.lock = threading.Lock()
        self.image_pub = self.node.create_publisher(Image, f"{namespace}/camera/image_raw", qos_profile_sensor_data)
        self.ros.start()

    def watch(self, topic: str, kind) -> None:
        def count(_msg) -> None:
            with self.lock:
                self.counts[topic] = self.counts.get(topic, 0) + 1
        self.node.create_subscription(kind, topic, count, qos_profile_sensor_data)

    def seen(self, topic: str) -> int:
        with self.lock:
            return self.counts.get(topic, 0)

    def nodes(self) -> set[str]:
        return {f"{ns.rstrip('/')}/{name}" for name, ns in self.node.get_node_names_and_namespaces()}

    def parameters(self, node: str, names: list[str]) -> dict:
        client = AsyncParameterClient(self.node, node)
        assert client.wait_for_services(timeout_sec=30.0), f"{node}: parameter services not available"
        future = client.get_parameters(names)
        wait_for(future.done, 30.0, f"get_parameters on {node}")
        return {n: parameter_value_to_python(v) for n, v in zip(names, future.result().values)}

    def publishers(self, name: str) -> set[str]:
        return {topic for topic, _ in self.node.get_publisher_names_and_types_by_node(name, self.ns or "/")}

    def close(self) -> None:
        self.ros.close()


def normalized_process(argv: list[str]) -> dict:
    """Executable, ROS arguments and parameters of one process, whichever launcher started it; a
    container's with its components (each as its own process would be) and thread count."""
    if argv[1] == "-m":  # dynnet up: python -m MODULE
        executable, rest = MODULE_TO_EXECUTABLE[argv[2]], argv[3:]
    elif Path(argv[1]).name in MODULE_TO_EXECUTABLE.values():  # launch: python .../lib/dynnet_ros/EXECUTABLE
        executable, rest = Path(argv[1]).name, argv[2:]
    else:
        executable, rest = Path(argv[0]).name, argv[1:]
    components: list[dict] = []
    threads: list[str] = []
    if executable == CONTAINER:
        before = rest[:rest.index("--ros-args")]
        rest = rest[len(before):]
        options = dict(zip(before[::2], before[1::2]))
        threads = ["--threads", options["--threads"]]
        entries = yaml.safe_load(Path(options["--components"]).read_text())["components"]
        components = [dict(normalized_arguments(entry["ros_args"]), executable=PLUGIN_TO_EXECUTABLE[entry["plugin"]],
                           components=[], threads=[]) for entry in entries]
    return dict(normalized_arguments(rest), executable=executable, components=components, threads=threads)


def normalized_arguments(rest: list[str]) -> dict:
    """Remappings, parameters (from the parameters files) and other ROS arguments of ``--ros-args ...``."""
    assert rest[0] == "--ros-args", rest
    remaps, params, other = [], {}, []
    i = 1
    while i < len(rest):
        if rest[i] == "-r":
            remaps.append(rest[i + 1])
            i += 2
        elif rest[i] == "--params-file":
            data = yaml.load(Path(rest[i + 1]).read_text(), Loader=_ParamsLoader)
            [section] = data.values()  # one node per file ("/**" or the node's full name)
            params.update(section["ros__parameters"])
            i += 2
        else:
            other.append(rest[i])
            i += 1
    return {"remappings": sorted(remaps), "parameters": params, "other": other}


def same_value(a, b) -> bool:
    if isinstance(b, list):  # a: a list, or the array.array a parameter service returns
        return not isinstance(a, str) and len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    if isinstance(a, float) or isinstance(b, float):
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-12)
    return a == b


def assert_same_processes(launched: list[dict], planned: list[dict]) -> None:
    key = lambda p: p["remappings"]  # noqa: E731 - sorted remaps start with the unique __node:=NAME
    launched, planned = sorted(launched, key=key), sorted(planned, key=key)
    assert [p["executable"] for p in launched] == [p["executable"] for p in planned]
    for got, want in zip(launched, planned):
        assert got["remappings"] == want["remappings"] and got["other"] == want["other"], (got, want)
        assert got["threads"] == want["threads"], (got, want)
        assert got["parameters"].keys() == want["parameters"].keys(), (got, want)
        for name, value in want["parameters"].items():
            assert same_value(got["parameters"][name], value), (name, got["parameters"][name], value)
        assert len(got["components"]) == len(want["components"]), (got, want)
        if want["components"]:
            assert_same_processes(got["components"], want["components"])


def custom_config(path: Path) -> Path:
    """Different parameters and a remapped output; light enough for a loaded CI machine."""
    data = yaml.safe_load(default_config_path().read_text())
    for node in data["nodes"]:
        params = node.setdefault("parameters", {})
        if node["name"] in ("lane_node", "pedestrian_node", "depth_node"):
            params.update(max_input_side=160)
        if node["name"] == "lane_node":
            params.update(lane_threshold=0.6)
            node["remappings"] = {"lane/mask": "lane/mask_remapped"}
        if node["name"] == "budget_manager":
            params.update(reserve_mb=256.0)
        if node["name"] == "depth_node":  # killed by the test: launch restarts it once, then leaves it down
            node.update(container=False, respawn=True, respawn_delay_s=0.5, respawn_max_retries=1)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def node_pid(launch: Launch, executable: str) -> int | None:
    """The running node process of ``executable`` (launch runs lib/dynnet_ros/EXECUTABLE); a child
    forked but not yet exec'd still shows launch's own command line and is not it."""
    for proc in launch.node_processes():
        try:
            argv = proc.cmdline()
            if executable in {Path(a).name for a in argv[:2]} and proc.status() != psutil.STATUS_ZOMBIE:
                return proc.pid
        except psutil.NoSuchProcess:
            continue
    return None


def died_lines(launch: Launch, executable: str) -> list[str]:
    return [line for line in launch.lines if f"[{executable}-" in line and "process has died" in line]


def check_respawn(launch: Launch, graph, node_name: str, outputs_flow) -> None:
    """kill -9 the node: launch restarts it (respawn, respawn_delay) while the others keep publishing;
    a second kill exceeds respawn_max_retries 1 and it stays down."""
    node = graph.node(node_name)
    assert node.respawn.enabled and node.respawn.max_retries == 1, node.respawn
    first = node_pid(launch, node.executable)
    assert first is not None, launch.output()[-5000:]
    os.kill(first, signal.SIGKILL)
    second = wait_for(lambda: (node_pid(launch, node.executable) or first) != first
                      and node_pid(launch, node.executable), 120, f"{node_name} respawned by launch")
    outputs_flow()  # the graph serves again, the respawned node included
    os.kill(second, signal.SIGKILL)
    wait_for(lambda: len(died_lines(launch, node.executable)) >= 2, 60, f"launch noticing {node_name} died again")
    outputs_flow(exclude=node_name)  # the others keep serving ...
    assert node_pid(launch, node.executable) is None, launch.output()[-5000:]  # ... without it


def run_launch(env: dict[str, str], args: list[str], config: Path, use_sim: bool, namespace: str,
               outputs: dict[str, type], feed: bool, kill: str | None = None) -> None:
    graph = load_graph(config)
    expected = graph.selected(use_sim)
    observer = Observer(namespace)
    for topic, kind in outputs.items():
        observer.watch(f"{namespace}/{topic}", kind)
    launch = Launch(env, args)
    try:
        with quoting(launch.output):
            names = {f"{namespace}/{n.name}" for n in expected}
            wait_for(lambda: names <= observer.nodes() or launch.proc.poll() is not None, 120, f"nodes {sorted(names)}")
            assert launch.proc.poll() is None, launch.output()[-5000:]
            others = {n.name for n in graph.nodes} - {n.name for n in expected}
            assert not {f"{namespace}/{n}" for n in others} & observer.nodes(), "a sim node started with use_sim:=false"

            # the YAML's parameters, read back through each node's parameter service; a running budget
            # manager sets memory_budget_mb itself, so that one is the manager's, not the YAML's
            managed = {"memory_budget_mb"} if any(n.executable == "budget_manager" for n in expected) else set()
            for node in expected:
                values = observer.parameters(f"{namespace}/{node.name}", list(node.parameters))
                for name, value in node.parameters.items():
                    if name not in managed:
                        assert same_value(values[name], value), (node.name, name, values[name], value)

            image = array_to_image(np.full((96, 128, 3), 90, np.uint8), "rgb8")
            owners = {node.name: [t for t in outputs if t.split("/")[0] == node.name.removesuffix("_node")]
                      for node in expected}

            def outputs_flow(exclude: str | None = None) -> None:
                """Every output (but ``exclude``'s) publishes again from here on."""
                topics = [t for t in outputs if exclude is None or t not in owners.get(exclude, [])]
                start = {t: observer.seen(f"{namespace}/{t}") for t in topics}

                def fed() -> bool:
                    if feed:  # no simulator: this test is the camera
                        observer.image_pub.publish(image)
                    return all(observer.seen(f"{namespace}/{t}") > start[t] for t in topics)
                wait_for(fed, 180, f"outputs {sorted(topics)}", interval=0.5)

            outputs_flow()
            for node in expected:  # remappings and namespace, as the graph sees them
                for src, dst in node.remappings.items():
                    assert f"{namespace}/{dst}" in observer.publishers(node.name)
                    assert f"{namespace}/{src}" not in observer.publishers(node.name)

            # the same processes `dynnet up` starts for these arguments
            launched = [normalized_process(p.cmdline()) for p in launch.node_processes()]
            runner = GraphRunner(graph, use_sim=use_sim, namespace=namespace)
            try:
                planned = [normalized_process(argv) for _, argv in runner.commands()]
            finally:
                runner.stop()
            assert_same_processes(launched, planned)
            if kill is not None:
                check_respawn(launch, graph, kill, outputs_flow)
    finally:
        observer.close()
        code = launch.ctrl_c() if launch.proc.poll() is None else launch.proc.returncode
    log = launch.output()
    assert code == 0, log[-5000:]
    assert "escalating" not in log and "SIGKILL" not in log, log[-5000:]
    for process in graph_processes(graph, use_sim, namespace):
        finished = [line for line in log.splitlines() if f"[{process.executable}-" in line and "process has" in line]
        if process.name == kill:  # killed twice, respawned once
            assert len(finished) == 2 and all("exit code -9" in line for line in finished), (process.name, log[-5000:])
            continue
        assert finished and all("finished cleanly" in line for line in finished), (process.name, log[-5000:])
    assert "Traceback" not in log, log[-5000:]


def test_launch_with_default_arguments(install):
    run_launch(install, [], default_config_path(), use_sim=True, namespace="",
               outputs={"lane/mask": Image, "depth/image": Image, "pedestrian/markers": MarkerArray}, feed=False)


def test_launch_with_every_argument_set(install, tmp_path):
    namespace = f"/launchtest_{os.getpid()}"
    config = custom_config(tmp_path / "vehicle.yaml")
    run_launch(install, ["use_sim:=false", f"config:={config}", f"namespace:={namespace}"], config,
               use_sim=False, namespace=namespace,
               outputs={"lane/mask_remapped": Image, "depth/image": Image, "pedestrian/markers": MarkerArray},
               feed=True, kill="depth_node")
