"""Launch the vehicle graph described by config/vehicle.yaml (the same nodes `dynnet up` starts).

    ros2 launch dynnet_ros vehicle.launch.py                 # with the sensor simulator
    ros2 launch dynnet_ros vehicle.launch.py use_sim:=false  # real camera / LiDAR drivers
    ros2 launch dynnet_ros vehicle.launch.py config:=/path/to/my_vehicle.yaml namespace:=/robot1
    ros2 launch dynnet_ros vehicle.launch.py config:=<share>/config/vehicle_4cam.yaml  # four cameras
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, OpaqueFunction, SetEnvironmentVariable
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node

from dynnet_ros.graph_config import (
    CONTAINER,
    PACKAGE,
    ProcessSpec,
    default_config_path,
    graph_processes,
    load_graph,
    process_arguments,
    write_process_files,
)
from dynnet_ros.graph_transport import transport_env
from dynnet_ros.supervisor.preflight import check_in_child, measure_in_child


def _default_config() -> str:
    try:
        from ament_index_python.packages import get_package_share_directory

        path = os.path.join(get_package_share_directory(PACKAGE), "config", "vehicle.yaml")
        if os.path.isfile(path):
            return path
    except (ImportError, LookupError, OSError):  # not installed through colcon (a source checkout): its copy
        pass
    return str(default_config_path())


def _nodes(context, *args, **kwargs):
    """Resolve the launch arguments, then one launch_ros Node per process of `graph_processes`
    (the function `dynnet up` starts its processes from): a node of its own, or a component
    container started with its components file (``ros2 run dynnet_ros container --components
    FILE --keep-values FILE``), so that launch's respawn brings the container back with all its
    nodes and the values set on them at run time.

    Respawn uses what launch offers: a fixed ``respawn_delay`` (no doubling) and at most
    ``respawn_max_retries`` restarts over the whole launch (not per window); launch also restarts
    a node that exited with status 0 on its own. `dynnet up` backs off and forgets old crashes
    (graph_config.RespawnPolicy).
    """
    path = LaunchConfiguration("config").perform(context)
    graph = load_graph(path)
    # a bad value stops the launch here, naming file, node and parameter (checked in a child, as
    # the measurements below: the launch process, alive as long as the graph, never loads the engine)
    check_in_child(Path(path))
    use_sim = LaunchConfiguration("use_sim").perform(context).strip().lower() == "true"
    namespace = LaunchConfiguration("namespace").perform(context).strip()
    processes = graph_processes(graph, use_sim, namespace)
    # each model's footprint per size class, measured one model at a time before the nodes start
    # (seconds on a machine's first start, cached after): the nodes then serve at once
    measure_in_child([node for process in processes for node in process.hosted],
                     lambda message: print(f"[vehicle.launch.py] {message}", flush=True))
    files = tempfile.mkdtemp(prefix="dynnet-launch-")  # the containers' components and parameters files
    return [_node(process, files) for process in processes]


def _node(process: ProcessSpec, files: str) -> Node:
    if process.executable == CONTAINER:
        # launch respawns with this same command line: the container keeps its nodes' values set
        # at run time in the kept-values file and starts them with those (nodes/kept_values.py)
        kept = os.path.join(files, f"{process.name}.kept.yaml")
        arguments = [*process_arguments(process, write_process_files(process, files)), "--keep-values", kept]
        parameters: list = []
    else:
        arguments, parameters = [], [process.parameters] if process.parameters else []
    return Node(package=PACKAGE, executable=process.executable, name=process.name,
                namespace=process.namespace or None, output="screen", arguments=arguments,
                parameters=parameters, remappings=list(process.remappings),
                respawn=process.respawn.enabled, respawn_delay=process.respawn.delay_s,
                respawn_max_retries=process.respawn.max_retries,
                # image publishers get the transport profile their frames need (graph_transport)
                additional_env=transport_env(process, os.environ) or None)


def generate_launch_description() -> LaunchDescription:
    actions = [
        DeclareLaunchArgument("use_sim", default_value="true", choices=["true", "false"],
                              description="start the sensor simulator (nodes with sim: true)"),
        DeclareLaunchArgument("config", default_value=_default_config(),
                              description="graph description (nodes, parameters, remappings)"),
        DeclareLaunchArgument("namespace", default_value="",
                              description="ROS namespace for every node and its topics (/diagnostics stays global)"),
    ]
    if "ROS_AUTOMATIC_DISCOVERY_RANGE" not in os.environ:  # keep discovery on this machine by default
        actions.append(SetEnvironmentVariable("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST"))
    actions.append(OpaqueFunction(function=_nodes))
    return LaunchDescription(actions)
