"""A vehicle graph given several simulated cameras: the simulator's rig and the model nodes' cameras.

Why a function: ``dynnet demo --cameras N`` turns the one-camera graph into an N-camera one, and
config/vehicle_4cam.yaml is that graph written out (test/test_graph_cameras.py keeps the two
equal). Three things must agree: the simulator's ``cameras`` (each with its ``NAME.yaw_deg``),
every model node's ``cameras`` (one node serves them all), and the depth node's per-camera
extrinsic ``NAME.lidar_to_camera``, the simulator's ground truth for that camera's yaw. No ROS
imports.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from dynnet_ros.graph_config import GraphConfig, NodeConfig
from dynnet_ros.sim.rig import check_camera_names, default_yaw
from dynnet_ros.sim.scene import lidar_to_camera_xyzrpy

SIMULATOR = "sensor_sim"
#: executables that take a ``cameras`` list and serve every camera in it
MODEL_EXECUTABLES = ("lane_node", "pedestrian_node", "depth_node")
#: the executable that takes a per-camera ``NAME.lidar_to_camera``
DEPTH = "depth_node"


def camera_yaws(graph: GraphConfig, cameras: list[str]) -> dict[str, float]:
    """Where each camera looks: the simulator's ``NAME.yaw_deg`` in ``graph``, else its default."""
    sim = next((n.parameters for n in graph.nodes if n.executable == SIMULATOR), {})
    return {name: float(sim.get(f"{name}.yaw_deg", default_yaw(name, index, len(cameras))))
            for index, name in enumerate(cameras)}


def camera_extrinsic(yaw_deg: float) -> list[float]:
    """The depth node's ``NAME.lidar_to_camera`` for the simulated camera yawed by ``yaw_deg``,
    rounded to 1e-12 (m, rad) so a config reads 0.0 where the rotation leaves 1e-17."""
    return [round(value, 12) + 0.0 for value in lidar_to_camera_xyzrpy(yaw_deg=yaw_deg)]  # + 0.0: no -0.0


def with_cameras(graph: GraphConfig, cameras: list[str]) -> GraphConfig:
    """``graph`` with the simulator publishing ``cameras`` and every model node serving them all
    (the depth node with each camera's extrinsic). ValueError for names the simulator refuses."""
    problem = check_camera_names(cameras) or (None if cameras else "cameras: list at least one camera")
    if problem:
        raise ValueError(problem)
    yaws = camera_yaws(graph, cameras)

    def changed(node: NodeConfig) -> NodeConfig:
        extra: dict[str, Any] = {}
        if node.executable == SIMULATOR:
            extra = {"cameras": list(cameras), **{f"{name}.yaw_deg": yaw for name, yaw in yaws.items()}}
        elif node.executable in MODEL_EXECUTABLES:
            extra = {"cameras": list(cameras)}
            if node.executable == DEPTH:
                extra.update({f"{name}.lidar_to_camera": camera_extrinsic(yaw) for name, yaw in yaws.items()})
        return replace(node, parameters={**node.parameters, **extra}) if extra else node

    return replace(graph, nodes=[changed(node) for node in graph.nodes])
