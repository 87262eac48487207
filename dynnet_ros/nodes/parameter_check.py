"""Check a graph config's parameters against what each node declares, before anything starts.

Why: a node handed a bad value by its parameter file dies in its constructor with a long rclpy
traceback (wrong type) or refuses its start (out of range), after the rest of the graph is up.
``dynnet up`` and ``launch/vehicle.launch.py`` run this check on the YAML first and refuse the
whole config with one line naming the file, the node, the parameter and the reason.
"""
from __future__ import annotations

from dynnet_ros.graph_config import GraphConfig
from dynnet_ros.nodes import budget_manager, depth_node, lane_node, pedestrian_node, sensor_sim
from dynnet_ros.nodes.base import ParamSpec

#: parameters every ROS 2 node takes without declaring them
ROS_PARAMETERS = frozenset({"use_sim_time", "start_type_description_service"})

DECLARED: dict[str, list[ParamSpec]] = {
    "sensor_sim": sensor_sim.PARAMETERS,
    "lane_node": lane_node.PARAMETERS,
    "pedestrian_node": pedestrian_node.PARAMETERS,
    "depth_node": depth_node.PARAMETERS,
    "budget_manager": budget_manager.PARAMETERS,
}


def parameter_problems(graph: GraphConfig) -> list[str]:
    """Every problem as ``node NAME: parameter P: reason``, in config order (empty = all fine)."""
    problems = []
    for node in graph.nodes:
        specs = {spec.name: spec for spec in DECLARED[node.executable]}
        for name, value in node.parameters.items():
            spec = specs.get(name)
            if spec is None:
                if name not in ROS_PARAMETERS:
                    problems.append(f"node {node.name}: parameter {name}: {node.executable} declares no such "
                                    f"parameter (it has {', '.join(sorted(specs))})")
                continue
            reason = spec.check_file_value(value)
            if reason is not None:
                problems.append(f"node {node.name}: parameter {name}: {reason}")
    return problems


def check_graph_parameters(graph: GraphConfig, source: str) -> None:
    """ValueError naming ``source``, the node, the parameter and the reason of the first problem
    (and how many more there are)."""
    problems = parameter_problems(graph)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ValueError(f"{source}: {problems[0]}{more}")
