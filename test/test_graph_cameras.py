"""A graph with several simulated cameras: `dynnet demo --cameras N` and config/vehicle_4cam.yaml.

The simulator's cameras, the model nodes' ``cameras`` and the depth node's per-camera extrinsics
must name the same cameras, and each extrinsic must be the simulator's ground truth for that
camera's yaw.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dynnet_ros.bags.topics import SINGLE_CAMERA
from dynnet_ros.cli import build_parser
from dynnet_ros.commands.replay import graph_cameras
from dynnet_ros.geometry import extrinsic_matrix
from dynnet_ros.graph_cameras import camera_extrinsic, with_cameras
from dynnet_ros.graph_config import default_config_path, load_graph, parse_graph
from dynnet_ros.nodes.parameter_check import parameter_problems
from dynnet_ros.sim import scene
from dynnet_ros.sim.rig import demo_cameras

ROOT = Path(__file__).resolve().parents[1]
FOUR = ROOT / "config" / "vehicle_4cam.yaml"


def test_the_four_camera_config_is_the_vehicle_graph_with_four_cameras():
    expected = with_cameras(load_graph(default_config_path()), demo_cameras(4))
    written = load_graph(FOUR)
    assert written.containers == expected.containers
    assert [(n.name, n.executable, n.container, n.sim, n.respawn) for n in written.nodes] == \
        [(n.name, n.executable, n.container, n.sim, n.respawn) for n in expected.nodes]
    for have, want in zip(written.nodes, expected.nodes):
        assert have.parameters == want.parameters, have.name
    # every parameter is one its node declares: the simulator's per-camera yaws, the model nodes'
    # cameras, the depth node's per-camera extrinsics
    assert parameter_problems(written) == []


def test_with_cameras_wires_the_simulator_and_every_model_node():
    graph = with_cameras(load_graph(default_config_path()), ["front", "left", "rear"])
    sim = graph.node("sensor_sim").parameters
    assert sim["cameras"] == ["front", "left", "rear"]
    assert (sim["front.yaw_deg"], sim["left.yaw_deg"], sim["rear.yaw_deg"]) == (0.0, 90.0, 180.0)
    for name in ("lane_node", "pedestrian_node", "depth_node"):
        assert graph.node(name).parameters["cameras"] == ["front", "left", "rear"]
    depth = graph.node("depth_node").parameters
    for camera, yaw in (("front", 0.0), ("left", 90.0), ("rear", 180.0)):
        np.testing.assert_allclose(extrinsic_matrix(depth[f"{camera}.lidar_to_camera"]), scene.lidar_to_camera(yaw),
                                   atol=1e-9)
    assert depth["front.lidar_to_camera"] == camera_extrinsic(0.0)
    plain = load_graph(default_config_path())
    assert graph.node("budget_manager").parameters == plain.node("budget_manager").parameters


def test_a_yaw_the_simulator_sets_is_the_one_the_depth_node_gets():
    graph = parse_graph({"nodes": [
        {"name": "sim", "executable": "sensor_sim", "parameters": {"cam0.yaw_deg": 30.0}},
        {"name": "depth", "executable": "depth_node"}]})
    depth = with_cameras(graph, ["cam0", "cam1"]).node("depth").parameters
    np.testing.assert_allclose(extrinsic_matrix(depth["cam0.lidar_to_camera"]), scene.lidar_to_camera(30.0), atol=1e-9)
    np.testing.assert_allclose(extrinsic_matrix(depth["cam1.lidar_to_camera"]), scene.lidar_to_camera(180.0),
                               atol=1e-9)  # the second of two unnamed cameras looks back


@pytest.mark.parametrize("cameras, message", [([], "at least one"), (["front", "front"], "twice"),
                                              (["front/left"], "not a camera name")])
def test_with_cameras_refuses_what_the_simulator_would(cameras, message):
    with pytest.raises(ValueError, match=message):
        with_cameras(load_graph(default_config_path()), cameras)


def test_demo_takes_one_to_eight_cameras(capsys):
    parser = build_parser(["demo"])
    assert parser.parse_args(["demo"]).cameras == 1
    assert parser.parse_args(["demo", "--cameras", "8"]).cameras == 8
    for bad in ("0", "9"):
        with pytest.raises(SystemExit):
            parser.parse_args(["demo", "--cameras", bad])
    assert "1 to 8 cameras" in capsys.readouterr().err


def test_a_replay_type_checks_the_cameras_the_graphs_model_nodes_read():
    four = graph_cameras(load_graph(FOUR))
    assert [(c.image, c.info) for c in four] == [(f"{n}/image_raw", f"{n}/camera_info") for n in demo_cameras(4)]
    assert graph_cameras(load_graph(default_config_path())) == graph_cameras(None) == (SINGLE_CAMERA,)
    mixed = parse_graph({"nodes": [{"name": "lane", "executable": "lane_node",
                                    "parameters": {"cameras": ["/cams/left/image_color", "front"]}},
                                   {"name": "depth", "executable": "depth_node", "parameters": {"cameras": ["front"]}},
                                   {"name": "ped", "executable": "pedestrian_node"}]})
    assert [c.image for c in graph_cameras(mixed)] == ["/cams/left/image_color", "front/image_raw", "camera/image_raw"]
