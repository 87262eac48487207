"""Graph config validation, the memory monitors and the `dynnet up` command line (no graph)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from dynnet_ros.budget.cgroup import CgroupPaths
from dynnet_ros.budget.monitors import MemorySnapshot, read_cgroup_memory, snapshot
from dynnet_ros.bytesize import MB
from dynnet_ros.cli import main as cli_main
from dynnet_ros.graph_config import (
    COMPONENTS,
    CONTAINER,
    EXECUTABLES,
    PLUGINS,
    RespawnPolicy,
    default_config_path,
    graph_processes,
    load_graph,
    node_command,
    parse_graph,
    restart_process,
    separate_processes,
    with_parameters,
    write_process_files,
)
from dynnet_ros.nodes.parameter_check import DECLARED, check_graph_parameters, parameter_problems

pytestmark = pytest.mark.graph


def test_vehicle_yaml_is_valid_and_complete():
    graph = load_graph(default_config_path())
    assert {n.executable for n in graph.nodes} == set(EXECUTABLES)
    assert [n.name for n in graph.selected(use_sim=False)] == [n.name for n in graph.nodes if not n.sim]
    assert graph.node("sensor_sim").sim and not graph.node("lane_node").sim
    for name in ("lane_node", "pedestrian_node", "depth_node"):
        params = graph.node(name).parameters
        assert {"model_path", "backend", "memory_budget_mb", "enabled"} <= set(params)


def test_namespaces():
    from dynnet_ros.graph_config import validate_namespace

    assert validate_namespace("") == "" and validate_namespace("robot1") == "/robot1"
    assert validate_namespace("/fleet/robot_2") == "/fleet/robot_2"
    for bad in ("/a b", "/1abc", "//x", "/x/"):
        with pytest.raises(ValueError, match="bad ROS namespace"):
            validate_namespace(bad)
    graph = parse_graph({"nodes": [{"name": "lane_node", "executable": "lane_node"}]})
    [process] = graph_processes(graph, namespace="robot1")
    assert process.namespace == "/robot1"
    cmd = node_command(process, "p.yaml", python="py")
    assert "__ns:=/robot1" in cmd and "--params-file" not in cmd  # no parameters: no params file


def test_graph_processes_select_sim_nodes_in_config_order():
    graph = load_graph(default_config_path())
    hosted = lambda processes: [n.name for p in processes for n in p.hosted]  # noqa: E731
    assert hosted(graph_processes(graph, use_sim=True)) == [n.name for n in graph.nodes]
    assert hosted(graph_processes(graph, use_sim=False)) == [n.name for n in graph.nodes if not n.sim]
    with pytest.raises(ValueError, match="bad ROS namespace"):
        graph_processes(graph, namespace="/a b")


def test_the_vehicle_graph_runs_the_model_nodes_and_the_manager_in_one_container():
    graph = load_graph(default_config_path())
    sim, container = graph_processes(graph, namespace="/car")
    assert sim.executable == "sensor_sim" and not sim.components
    assert container.executable == CONTAINER and container.name == "model_container"
    assert [n.name for n in container.components] == ["lane_node", "pedestrian_node", "depth_node", "budget_manager"]
    assert all(n.namespace == "/car" for n in container.components)
    assert container.respawn == graph.containers["model_container"].respawn
    assert container.executor_threads() == 5  # threads: 0 -> one per node, plus one


def _grouped(*nodes: dict, containers: dict | None = None) -> dict:
    return {"containers": containers if containers is not None else {"models": {"respawn_delay_s": 0.3}},
            "nodes": list(nodes)}


def test_container_groups_become_processes_where_their_first_node_is():
    graph = parse_graph(_grouped(
        {"name": "sim", "executable": "sensor_sim", "sim": True, "container": "models"},
        {"name": "alone", "executable": "budget_manager", "container": False, "respawn_max_retries": 1},
        {"name": "lane", "executable": "lane_node", "container": "models", "remappings": {"lane/mask": "m"}},
        {"name": "depth", "executable": "depth_node", "container": "models", "parameters": {"threads": 2}},
        containers={"models": {"threads": 3, "respawn_delay_s": 0.3}}))
    models, alone = graph_processes(graph)
    assert models.name == "models" and [n.name for n in models.components] == ["sim", "lane", "depth"]
    assert models.executor_threads() == 3 and models.respawn.delay_s == 0.3
    assert alone.name == "alone" and alone.respawn.max_retries == 1 and not alone.components
    # without the simulator, two nodes still share the container
    [_, models] = graph_processes(graph, use_sim=False)
    assert [n.name for n in models.components] == ["lane", "depth"]
    # a group of one is a plain process with the container's respawn keys
    single = parse_graph(_grouped({"name": "sim", "executable": "sensor_sim", "sim": True, "container": "models"},
                                  {"name": "lane", "executable": "lane_node", "container": "models"}))
    [lane] = graph_processes(single, use_sim=False)
    assert lane.executable == "lane_node" and not lane.components and lane.respawn.delay_s == 0.3


def test_a_container_command_names_its_components_file_and_each_node_gets_its_standalone_arguments(tmp_path):
    graph = parse_graph(_grouped(
        {"name": "lane", "executable": "lane_node", "container": "models", "parameters": {"lane_threshold": 0.7},
         "remappings": {"lane/mask": "lane/remapped"}},
        {"name": "manager", "executable": "budget_manager", "container": "models"}))
    [container] = graph_processes(graph, namespace="/ns")
    path = write_process_files(container, tmp_path)
    cmd = node_command(container, path, python="py")
    assert cmd[:3] == ["py", "-m", "dynnet_ros.nodes.container"]
    assert cmd[3:7] == ["--components", str(path), "--threads", "3"]
    assert cmd[7:] == ["--ros-args", "-r", "__node:=models", "-r", "__ns:=/ns"]
    [lane, manager] = yaml.safe_load(path.read_text())["components"]
    assert lane["plugin"] == "dynnet_ros::LaneNode" and manager["plugin"] == "dynnet_ros::BudgetManager"
    # exactly the arguments a process of its own would have after python -m MODULE
    alone = parse_graph({"nodes": [{"name": "lane", "executable": "lane_node", "parameters": {"lane_threshold": 0.7},
                                    "remappings": {"lane/mask": "lane/remapped"}}]})
    [own] = graph_processes(alone, namespace="/ns")
    assert lane["ros_args"] == node_command(own, tmp_path / "lane.yaml", python="py")[3:]
    assert yaml.safe_load((tmp_path / "lane.yaml").read_text()) == own.params_file_data()
    assert manager["ros_args"] == ["--ros-args", "-r", "__node:=manager", "-r", "__ns:=/ns"]


def test_a_restarted_container_gives_each_node_its_own_run_time_values():
    graph = parse_graph(_grouped(
        {"name": "lane", "executable": "lane_node", "container": "models", "parameters": {"lane_threshold": 0.5}},
        {"name": "depth", "executable": "depth_node", "container": "models", "parameters": {"threads": 1}}))
    [container] = graph_processes(graph, namespace="/ns")
    again = restart_process(container, {"/ns/lane": {"lane_threshold": 0.8}, "/ns/other": {"threads": 4}})
    lane, depth = again.components
    assert lane.parameters == {"lane_threshold": 0.8} and depth.parameters == {"threads": 1}
    sim_time = with_parameters(container, {"use_sim_time": True})
    assert all(n.parameters["use_sim_time"] is True for n in sim_time.components)


def test_the_component_plugins_are_the_entry_points_setup_py_registers():
    setup = (Path(__file__).resolve().parents[1] / "setup.py").read_text()
    for plugin, target in COMPONENTS.items():
        assert f'"{plugin}": "{target}"' in setup
    assert set(PLUGINS) == set(EXECUTABLES)
    assert set(PLUGINS.values()) == set(COMPONENTS)


def test_node_command_uses_params_file_and_remappings(tmp_path):
    graph = parse_graph({"nodes": [{"name": "front_lane", "executable": "lane_node",
                                    "parameters": {"lane_threshold": 0.7},
                                    "remappings": {"/camera/image_raw": "/front/image"}}]})
    [process] = graph_processes(graph)
    cmd = node_command(process, tmp_path / "p.yaml", python="python3")
    assert cmd[:3] == ["python3", "-m", "dynnet_ros.nodes.lane_node"]
    assert "__node:=front_lane" in cmd and "/camera/image_raw:=/front/image" in cmd
    assert cmd[cmd.index("--params-file") + 1] == str(tmp_path / "p.yaml")
    assert process.params_file_data() == {"/**": {"ros__parameters": {"lane_threshold": 0.7}}}


@pytest.mark.parametrize("data,reason", [
    ([], "mapping with a 'nodes' list"),
    ({"nodes": []}, "non-empty list"),
    ({"nodes": [{"name": "a", "executable": "nope"}]}, "unknown executable"),
    ({"nodes": [{"name": "a b", "executable": "lane_node"}]}, "ROS node name"),
    ({"nodes": [{"name": "a", "executable": "lane_node"}, {"name": "a", "executable": "depth_node"}]}, "twice"),
    ({"nodes": [{"name": "a", "executable": "lane_node", "parameters": {"x": {"y": [1, "a"]}}}]}, "parameter 'x'"),
    ({"nodes": [{"name": "a", "executable": "lane_node", "parameters": {"x": [1, "a"]}}]}, "parameter 'x'"),
    ({"nodes": [{"name": "a", "executable": "lane_node", "colour": "red"}]}, "unknown key"),
    ({"nodes": [{"name": "a", "executable": "lane_node", "sim": "yes"}]}, "'sim' must be"),
    ({"nodes": [{"name": "a", "executable": "lane_node", "remappings": {"/a": "not a topic"}}]}, "bad remapping"),
    ({"nodes": [], "extra": 1}, "unknown top-level"),
    ({"nodes": [{"name": "a", "executable": "lane_node", "respawn": "yes"}]}, "'respawn' must be true or false"),
    ({"nodes": [{"name": "a", "executable": "lane_node", "respawn_delay_s": -1}]}, "'respawn_delay_s' must be"),
    ({"nodes": [{"name": "a", "executable": "lane_node", "respawn_delay_s": "1s"}]}, "'respawn_delay_s' must be"),
    ({"nodes": [{"name": "a", "executable": "lane_node", "respawn_max_retries": 1.5}]}, "'respawn_max_retries'"),
    ({"nodes": [{"name": "a", "executable": "lane_node", "respawn_max_retries": -1}]}, "'respawn_max_retries'"),
    ({"nodes": [{"name": "a", "executable": "lane_node", "respawn_window_s": 0}]}, "'respawn_window_s' must be"),
    ({"nodes": [{"name": "a", "executable": "lane_node", "respawn_delay_s": float("inf")}]}, "'respawn_delay_s'"),
    ({"nodes": [{"name": "a", "executable": "lane_node", "container": "c"}]}, "none are defined"),
    ({"nodes": [{"name": "a", "executable": "lane_node", "container": True}], "containers": {"c": {}}},
     "'container' must be false or a container"),
    ({"nodes": [{"name": "a", "executable": "lane_node", "container": "c", "respawn": False}], "containers": {"c": {}}},
     r"\['respawn'\] apply to a process.*containers.c"),
    ({"nodes": [{"name": "a", "executable": "lane_node"}], "containers": {"c": {}}}, r"\['c'\] hold no node"),
    ({"nodes": [{"name": "a", "executable": "lane_node", "container": "c"}], "containers": {"c": {"colour": 1}}},
     "container 'c': unknown key"),
    ({"nodes": [{"name": "a", "executable": "lane_node", "container": "c"}], "containers": {"c": {"threads": -1}}},
     "'threads' must be an integer"),
    ({"nodes": [{"name": "a", "executable": "lane_node", "container": "c"}], "containers": {"c": {"respawn": 2}}},
     "container 'c': 'respawn' must be"),
    ({"nodes": [{"name": "a", "executable": "lane_node", "container": "a"}], "containers": {"a": {}}},
     "a container has the same name"),
    ({"nodes": [{"name": "a", "executable": "lane_node"}], "containers": ["c"]}, "'containers' must be a mapping"),
    ({"nodes": [{"name": "a", "executable": "lane_node"}], "containers": {"c d": {}}}, "container name must be"),
])
def test_bad_graph_configs_name_the_problem(data, reason):
    with pytest.raises(ValueError, match=reason):
        parse_graph(data, "cfg.yaml")


def test_respawn_keys_reach_the_processes_and_default_to_on():
    graph = parse_graph({"nodes": [
        {"name": "lane_node", "executable": "lane_node"},
        {"name": "depth_node", "executable": "depth_node", "respawn": False},
        {"name": "sensor_sim", "executable": "sensor_sim", "respawn_delay_s": 0.2, "respawn_max_retries": 2,
         "respawn_window_s": 30}]})
    lane, depth, sim = graph_processes(graph)
    assert lane.respawn == RespawnPolicy() and lane.respawn.enabled
    assert not depth.respawn.enabled and depth.respawn.gives_up(1)
    assert sim.respawn == RespawnPolicy(enabled=True, delay_s=0.2, max_retries=2, window_s=30.0)
    # the delay doubles per crash within the window; the crash after max_retries restarts gives up
    assert [sim.respawn.delay_after(n) for n in (1, 2)] == [0.2, 0.4]
    assert [sim.respawn.gives_up(n) for n in (1, 2, 3)] == [False, False, True]
    # respawn keys are node keys, never ROS parameters
    assert "respawn" not in lane.params_file_data()["/**"]["ros__parameters"]


def test_every_node_of_the_vehicle_graph_respawns():
    graph = load_graph(default_config_path())
    assert all(n.respawn.enabled and n.respawn.max_retries > 0 for n in graph.nodes)


def test_load_graph_reports_missing_and_malformed_files(tmp_path):
    with pytest.raises(ValueError, match="not found"):
        load_graph(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("nodes: [a, b\n")
    with pytest.raises(ValueError, match="not valid YAML"):
        load_graph(bad)


def test_dynnet_up_rejects_bad_config_with_exit_2(tmp_path, capsys):
    bad = tmp_path / "g.yaml"
    bad.write_text(yaml.safe_dump({"nodes": [{"name": "x", "executable": "teleport"}]}))
    assert cli_main(["up", "--config", str(bad), "--duration", "1"]) == 2
    assert "unknown executable 'teleport'" in capsys.readouterr().err
    assert cli_main(["up", "--duration", "-1"]) == 2


def _default_with(node_name: str, **parameters) -> dict:
    data = yaml.safe_load(default_config_path().read_text())
    for node in data["nodes"]:
        if node["name"] == node_name:
            node.setdefault("parameters", {}).update(parameters)
    return data


def test_every_executable_declares_its_parameters_and_the_default_config_passes():
    assert set(DECLARED) == set(EXECUTABLES)
    assert parameter_problems(load_graph(default_config_path())) == []


@pytest.mark.parametrize("node, parameters, reason", [
    ("lane_node", {"lane_threshold": 2.0}, "lane_threshold must be in [0.0, 1.0], got 2.0"),
    ("lane_node", {"lane_threshold": 1}, "lane_threshold must be a double"),
    ("pedestrian_node", {"max_detections": 5.0}, "max_detections must be an integer"),
    ("depth_node", {"enabled": "yes"}, "enabled must be a bool"),
    ("depth_node", {"lidar_to_camera": [0.0, 1.0]}, "lidar_to_camera"),
    ("sensor_sim", {"rate_hz": -1.0}, "rate_hz must be in"),
    ("budget_manager", {"period_s": 0.0}, "period_s must be in"),
    ("lane_node", {"lane_treshold": 0.5}, "declares no such parameter"),
    ("lane_node", {"backend": "cuda"}, "backend"),
    ("lane_node", {"qos_overrides": "reliable"}, "must be a mapping"),
    ("lane_node", {"qos_overrides": {"camera/image_raw": {"subscription": {"reliability": "reliable"}}}},
     "the resolved name, starting with '/'"),
    ("lane_node", {"qos_overrides": {"/camera/image_raw": {"publisher": {"reliability": "reliable"}}}},
     "must hold only 'subscription'"),
    ("sensor_sim", {"qos_overrides": {"/camera/image_raw": {"publisher": {"reliability": "sure"}}}},
     ".publisher.reliability: must be one of reliable, best_effort, system_default, got 'sure'"),
    ("depth_node", {"qos_overrides": {"/lidar/points": {"subscription": {"depth": -1}}}}, "integer >= 0"),
    ("depth_node", {"qos_overrides": {"/lidar/points": {"subscription": {"deadline": 1}}}}, "not a policy"),
    ("budget_manager", {"qos_overrides": {"/diagnostics": {"subscription": {"depth": 1}}}},
     "declares no such parameter"),
    ("lane_node", {"cameras": ["front", "/front/image_color"]}, "front named twice"),
    ("pedestrian_node", {"cameras": ["image_raw"]}, "needs the camera's namespace"),
    ("depth_node", {"front.lidar_to_camera": [0.0, 1.0], "cameras": ["front"]}, "lidar_to_camera"),
    ("depth_node", {"rear.lidar_to_camera": [0.0] * 6, "cameras": ["front"]}, "declares no such parameter"),
])
def test_config_parameters_are_checked_against_the_declarations(node, parameters, reason):
    graph = parse_graph(_default_with(node, **parameters), "vehicle-test.yaml")
    with pytest.raises(ValueError) as info:
        check_graph_parameters(graph, "vehicle-test.yaml")
    message = str(info.value)
    # a nested value's problem names its dotted parameter (qos_overrides./topic.subscription.depth)
    assert message.startswith(f"vehicle-test.yaml: node {node}: parameter {next(iter(parameters))}")
    assert reason in message and "\n" not in message


def test_ros_parameters_every_node_takes_are_accepted():
    graph = parse_graph(_default_with("lane_node", use_sim_time=True), "g.yaml")
    assert parameter_problems(graph) == []


def test_per_camera_parameters_are_accepted_for_the_cameras_named():
    graph = parse_graph(_default_with("depth_node", cameras=["front", "/cams/left/image_color"],
                                      **{"front.lidar_to_camera": [0.0] * 6, "cams_left.lidar_to_camera": [0.0] * 6}),
                        "g.yaml")
    assert parameter_problems(graph) == []


def test_qos_overrides_on_sensor_topics_are_accepted():
    reliable = {"reliability": "reliable", "history": "keep_last", "depth": 3}
    graph = parse_graph(_default_with("depth_node", qos_overrides={"/car1/camera/image_raw": {"subscription": reliable},
                                                                   "/car1/lidar/points": {"subscription": reliable}}),
                        "g.yaml")
    assert parameter_problems(graph) == []


def test_dynnet_up_refuses_a_bad_parameter_before_starting_anything(tmp_path, capsys):
    bad = tmp_path / "g.yaml"
    bad.write_text(yaml.safe_dump(_default_with("lane_node", lane_threshold=2.0)))
    assert cli_main(["up", "--config", str(bad), "--duration", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "node lane_node: parameter lane_threshold" in err[0] and str(bad) in err[0]


def test_memory_snapshot_reads_this_process():
    snap = snapshot([os.getpid(), 2**22 + 12345])  # the second pid does not exist
    assert isinstance(snap, MemorySnapshot)
    assert 0 < snap.available_bytes <= snap.total_bytes
    assert snap.used_bytes == snap.total_bytes - snap.available_bytes
    assert list(snap.rss_bytes) == [os.getpid()] and snap.rss_bytes[os.getpid()] > 10 * MB
    assert snap.effective_available_bytes <= snap.available_bytes


def test_cgroup_v2_reader_on_a_fake_hierarchy(tmp_path):
    group = CgroupPaths(2, tmp_path)
    (tmp_path / "memory.current").write_text("123456\n")
    (tmp_path / "memory.max").write_text("1048576000\n")
    assert read_cgroup_memory(group) == (1048576000, 123456)
    (tmp_path / "memory.max").write_text("max\n")
    assert read_cgroup_memory(group) == (None, 123456)
    assert snapshot(cgroup=group).cgroup_limit_bytes is None
    (tmp_path / "memory.current").unlink()
    assert read_cgroup_memory(group) == (None, None) and read_cgroup_memory(None) == (None, None)
    snap = MemorySnapshot(0.0, 100, 80, 20, cgroup_limit_bytes=50, cgroup_current_bytes=45)
    assert snap.effective_available_bytes == 5


def test_demo_summary_and_plot_from_recorded_diagnostics(tmp_path):
    import threading
    from types import SimpleNamespace

    from dynnet_ros.commands.demo import Series, plot, summarize

    samples = []
    for i in range(11):  # 10 s at 1 Hz, 4 frames per second, camera switching at t = 5
        camera = "320x240" if i < 5 else "1280x720"
        samples.append({"t": float(i), "level": 0, "task": "lane", "frames_processed": 4 * i, "frames_received": 5 * i,
                        "frames_dropped": i, "frames_failed": 0, "latency_p50_ms": 50.0 + i,
                        "latency_p95_ms": 80.0 + i, "latency_last_ms": 40.0 if i < 5 else 90.0,
                        "input_shape": "1x3x256x320" if i < 5 else "1x3x384x640", "camera_resolution": camera,
                        "rss_mb": 200.0 + i, "model_path": "/m/lane.onnx", "backend": "cpu"})
    recorder = SimpleNamespace(lock=threading.Lock(), series={"lane_node": Series("lane", samples)},
                               memory=[{"t": 1.0, "available_mb": 1000.0, "rss_mb.sensor_sim": 90.0}],
                               camera=[{"t": 0.0, "camera_resolution": "320x240"},
                                       {"t": 5.0, "camera_resolution": "1280x720"}])
    summary = summarize(recorder, 10.0, {"lane_node": 0})
    lane = summary["models"]["lane_node"]
    assert lane["mean_hz"] == pytest.approx(4.0)
    assert lane["latency_p50_ms"] == 60.0 and lane["rss_mb_max"] == 210.0
    assert lane["latency_median_ms_by_camera_resolution"] == {"1280x720": 90.0, "320x240": 40.0}
    assert lane["input_shapes_seen"] == ["1x3x256x320", "1x3x384x640"]
    assert summary["system_available_mb_min"] == 1000.0
    plot(recorder, tmp_path / "demo.png")
    assert (tmp_path / "demo.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_flat_qos_override_keys_are_checked_like_the_nested_form():
    """ROS 2 parameter files take `qos_overrides./topic.subscription.policy` as one dotted key."""
    flat = _default_with("lane_node", **{"qos_overrides./camera/image_raw.subscription.reliability": "reliable",
                                         "qos_overrides./camera/image_raw.subscription.depth": 2})
    assert parameter_problems(parse_graph(flat, "g.yaml")) == []
    bad = _default_with("sensor_sim", **{"qos_overrides./camera/image_raw.publisher.reliability": "sure"})
    [problem] = parameter_problems(parse_graph(bad, "g.yaml"))
    assert problem == ("node sensor_sim: parameter qos_overrides./camera/image_raw.publisher.reliability: "
                       "must be one of reliable, best_effort, system_default, got 'sure'")
    wrong_side = _default_with("lane_node", **{"qos_overrides./camera/image_raw.publisher.depth": 1})
    assert "must hold only 'subscription'" in parameter_problems(parse_graph(wrong_side, "g.yaml"))[0]


@pytest.mark.parametrize("content, reason", [(None, "model file not found"),
                                             (b"a text file, not a model\n", "is not a readable ONNX model")])
def test_dynnet_up_refuses_a_model_path_that_is_no_model_before_starting_anything(tmp_path, capsys, content,
                                                                                   reason):
    model = tmp_path / "detector.onnx"
    if content is not None:
        model.write_bytes(content)
    config = tmp_path / "g.yaml"
    config.write_text(yaml.safe_dump(_default_with("pedestrian_node", model_path=str(model))))
    assert cli_main(["up", "--config", str(config), "--duration", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "node pedestrian_node: parameter model_path: " in err[0] and reason in err[0] and str(config) in err[0]


def test_a_model_path_that_is_a_model_passes_the_preflight():
    from dynnet_ros.zoo import ensure_model

    graph = parse_graph(_default_with("depth_node", model_path=str(ensure_model("depth"))), "g.yaml")
    assert parameter_problems(graph) == []


def test_separate_processes_gives_each_node_a_process_with_its_containers_respawn_keys():
    data = yaml.safe_load(default_config_path().read_text())
    data["containers"]["model_container"].update(respawn_delay_s=0.3)
    graph = parse_graph(separate_processes(data))
    assert not graph.containers and all(n.container is None for n in graph.nodes)
    processes = graph_processes(graph)
    assert [p.name for p in processes] == [n.name for n in graph.nodes] and not any(p.components for p in processes)
    assert graph.node("lane_node").respawn.delay_s == 0.3
