"""`ros2 launch dynnet_ros vehicle.launch.py` respawns the component container with its nodes' run-time values.

The colcon-built launch file runs for real under a LaunchService (test/_launch_runner.py), on a
light copy of config/vehicle.yaml whose `model_container` hosts the three model nodes and the
budget manager. The test sets one parameter on each of them through its parameter service,
SIGKILLs the container (what the OOM killer or a segfault does), and checks that launch
respawns it as a new process, that every composed node comes back with the value set at run
time (and its config's value for the rest), that the outputs flow again, and that one Ctrl-C
still stops everything cleanly. The only timeouts are generous waits; a failure prints the
launch output's tail (the container's log lines included).
"""
from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import yaml
from _waiting import quoting, wait_for
from rclpy.parameter import Parameter
from rclpy.parameter_client import AsyncParameterClient
from sensor_msgs.msg import Image
from test_launch import Launch, Observer, _launch_missing, died_lines, node_pid, same_value
from visualization_msgs.msg import MarkerArray

from dynnet_ros.graph_config import CONTAINER, default_config_path, graph_processes, load_graph, parse_graph

pytestmark = [pytest.mark.skipif(_launch_missing() is not None, reason=str(_launch_missing())),
              pytest.mark.timeout(900), pytest.mark.graph]

OUTPUTS = {"lane/mask": Image, "pedestrian/markers": MarkerArray, "depth/image": Image}
#: one value per composed node, each different from the config's
RUN_TIME = {"lane_node": ("lane_threshold", 0.7), "pedestrian_node": ("score_threshold", 0.45),
            "depth_node": ("max_depth_m", 60.0), "budget_manager": ("reserve_mb", 300.0)}


def light_config(path: Path) -> Path:
    """The vehicle graph on a small, slow camera; the container respawns fast."""
    data = yaml.safe_load(default_config_path().read_text())
    for node in data["nodes"]:
        params = node.setdefault("parameters", {})
        if node["name"] == "sensor_sim":
            params.update(rate_hz=3.0, resolutions=["160x120"], lidar_azimuth_steps=64)
        elif node["name"] != "budget_manager":
            params.update(max_input_side=160)
    data["containers"]["model_container"].update(respawn=True, respawn_delay_s=0.5, respawn_max_retries=2)
    parse_graph(data, "launch respawn graph")
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def set_parameter(observer: Observer, node: str, name: str, value) -> None:
    client = AsyncParameterClient(observer.node, node)
    assert client.wait_for_services(timeout_sec=60.0), f"{node}: parameter services not available"
    future = client.set_parameters([Parameter(name, value=value)])
    wait_for(future.done, 60.0, f"set_parameters on {node}")
    result = future.result().results[0]
    assert result.successful, (node, name, result.reason)


def test_launch_respawns_a_killed_container_with_its_nodes_run_time_values(install, tmp_path):
    namespace = f"/launchrespawn_{os.getpid()}"
    config = light_config(tmp_path / "vehicle.yaml")
    graph = load_graph(config)
    [container] = [p for p in graph_processes(graph, True, namespace) if p.executable == CONTAINER]
    hosted = {node.name: node for node in container.components}
    assert set(RUN_TIME) == set(hosted), hosted  # every composed node gets a run-time value
    observer = Observer(namespace)
    for topic, kind in OUTPUTS.items():
        observer.watch(f"{namespace}/{topic}", kind)
    launch = Launch(install, [f"config:={config}", f"namespace:={namespace}"])

    def outputs_flow(what: str) -> None:
        start = {t: observer.seen(f"{namespace}/{t}") for t in OUTPUTS}
        wait_for(lambda: all(observer.seen(f"{namespace}/{t}") >= start[t] + 2 for t in OUTPUTS)
                 or launch.proc.poll() is not None, 300, what, interval=0.5)
        assert launch.proc.poll() is None

    try:
        with quoting(launch.output):
            names = {f"{namespace}/{name}" for name in hosted}
            wait_for(lambda: names <= observer.nodes() or launch.proc.poll() is not None, 240, f"nodes {sorted(names)}")
            assert launch.proc.poll() is None
            outputs_flow("every output from the first container")
            for node, (name, value) in RUN_TIME.items():
                set_parameter(observer, f"{namespace}/{node}", name, value)

            first = node_pid(launch, CONTAINER)
            assert first is not None
            os.kill(first, signal.SIGKILL)
            second = wait_for(lambda: (node_pid(launch, CONTAINER) or first) != first and node_pid(launch, CONTAINER),
                              120, "the container respawned by launch")
            [died] = died_lines(launch, CONTAINER)
            assert "exit code -9" in died
            wait_for(lambda: names <= observer.nodes(), 240, f"nodes {sorted(names)} back")
            outputs_flow("every output from the respawned container")

            for node, (name, value) in RUN_TIME.items():
                configured = {k: v for k, v in hosted[node].parameters.items() if k not in (name, "memory_budget_mb")}
                got = observer.parameters(f"{namespace}/{node}", [name, *configured])
                assert same_value(got[name], value), (node, name, got[name])
                for other, want in configured.items():  # the rest: the config's values
                    assert same_value(got[other], want), (node, other, got[other], want)
            assert node_pid(launch, CONTAINER) == second  # one respawn: the restarted container kept running
            restarted = [line for line in launch.lines if "started with the values set at run time" in line]
            assert {node for node in RUN_TIME if any(f"{namespace}/{node} started" in line for line in restarted)} \
                == set(RUN_TIME)
    finally:
        observer.close()
        code = launch.ctrl_c() if launch.proc.poll() is None else launch.proc.returncode
    log = launch.output()
    assert code == 0, log[-6000:]
    assert "escalating" not in log and "Traceback" not in log, log[-6000:]
    finished = [line for line in launch.lines if f"[{CONTAINER}-" in line and "process has" in line]
    assert len(finished) == 2 and "exit code -9" in finished[0] and "finished cleanly" in finished[1], log[-6000:]
