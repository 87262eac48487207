"""Check a graph config's parameters against what each node declares, before anything starts.

Why: a node handed a bad value by its parameter file dies in its constructor with a long rclpy
traceback (wrong type) or refuses its start (out of range), after the rest of the graph is up.
``dynnet up`` and ``launch/vehicle.launch.py`` run this check on the YAML first and refuse the
whole config with one line naming the file, the node, the parameter and the reason. A model
node's ``model_path`` is read too (its signature only, not the weights): a missing file or one
that is no ONNX model would otherwise crash-loop the node at every restart.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from dynnet_ros.graph_config import GraphConfig
from dynnet_ros.nodes import budget_manager, depth_node, lane_node, pedestrian_node, sensor_sim
from dynnet_ros.nodes.base import ParamSpec
from dynnet_ros.nodes.camera_inputs import camera_inputs, per_camera
from dynnet_ros.perception.model_info import read_model_info

#: parameters every ROS 2 node takes without declaring them
ROS_PARAMETERS = frozenset({"use_sim_time", "start_type_description_service"})
#: ROS 2's QoS override parameters (``qos_overrides.<topic>.<entity>.<policy>``): the nodes whose
#: sensor topics take them (nodes/base.SENSOR_QOS_OVERRIDES), and as publisher or subscription
QOS_OVERRIDES = "qos_overrides"
QOS_ENTITIES = {"sensor_sim": "publisher", "lane_node": "subscription", "pedestrian_node": "subscription",
                "depth_node": "subscription"}
QOS_POLICY_VALUES = {"reliability": ("reliable", "best_effort", "system_default"),
                     "history": ("keep_last", "keep_all", "system_default"),
                     "durability": ("volatile", "transient_local", "system_default")}

#: the executables whose ``model_path`` names an ONNX model ('' = the zoo's, built on first use)
MODEL_NODES = frozenset({"lane_node", "pedestrian_node", "depth_node"})

DECLARED: dict[str, list[ParamSpec]] = {
    "sensor_sim": sensor_sim.PARAMETERS,
    "lane_node": lane_node.PARAMETERS,
    "pedestrian_node": pedestrian_node.PARAMETERS,
    "depth_node": depth_node.PARAMETERS,
    "budget_manager": budget_manager.PARAMETERS,
}
#: model nodes' parameters declared once per camera of their ``cameras`` parameter, as
#: ``<camera name>.<parameter>`` (the camera's name from ``camera_inputs``)
PER_CAMERA: dict[str, list[ParamSpec]] = {"depth_node": depth_node.CAMERA_PARAMETERS}


def camera_specs(executable: str, parameters: dict[str, Any]) -> dict[str, ParamSpec]:
    """The per-camera parameters a node with ``parameters`` declares, by full name (none where
    its ``cameras`` names none, or is itself wrong: that is reported on its own)."""
    entries = parameters.get("cameras", [])
    templates = PER_CAMERA.get(executable, [])
    if not templates or not isinstance(entries, list) or not all(isinstance(e, str) for e in entries) \
            or not per_camera(entries):
        return {}
    try:
        names = [camera.name for camera in camera_inputs(entries)]
    except ValueError:
        return {}
    return {f"{name}.{spec.name}": dataclasses.replace(spec, name=f"{name}.{spec.name}")
            for name in names for spec in templates}


#: executables whose declared parameters depend on their config's values (a parameter per listed
#: camera): the full list for a node started with given parameters
DECLARED_FOR: dict[str, Callable[[dict[str, Any]], list[ParamSpec]]] = {
    "sensor_sim": sensor_sim.declared_specs,
}


def declared_for(executable: str, parameters: dict[str, Any]) -> list[ParamSpec]:
    """What a node of ``executable`` started with ``parameters`` declares."""
    specs = DECLARED_FOR.get(executable)
    declared = specs(parameters) if specs is not None else DECLARED[executable]
    return [*declared, *camera_specs(executable, parameters).values()]


def parameter_problems(graph: GraphConfig) -> list[str]:
    """Every problem as ``node NAME: parameter P: reason``, in config order (empty = all fine)."""
    problems = []
    for node in graph.nodes:
        specs = {spec.name: spec for spec in declared_for(node.executable, node.parameters)}
        for name, value in nest_qos_overrides(node.parameters).items():
            spec = specs.get(name)
            if name == QOS_OVERRIDES and node.executable in QOS_ENTITIES:
                problems += [f"node {node.name}: parameter {name}{problem}"
                             for problem in qos_override_problems(value, QOS_ENTITIES[node.executable])]
                continue
            if spec is None:
                if name not in ROS_PARAMETERS:
                    problems.append(f"node {node.name}: parameter {name}: {node.executable} declares no such "
                                    f"parameter (it has {', '.join(sorted(specs))})")
                continue
            reason = spec.check_file_value(value)
            if reason is None and name == "model_path" and node.executable in MODEL_NODES:
                reason = model_file_problem(value)
            if reason is not None:
                problems.append(f"node {node.name}: parameter {name}: {reason}")
    return problems


def model_file_problem(path: str) -> str | None:
    """Why ``path`` (a model node's ``model_path``) cannot be its model, or None ('' = the zoo's)."""
    if not path:
        return None
    try:
        read_model_info(path, check=False)  # the signature: the weights are the node's to load
    except ValueError as exc:
        return str(exc)
    return None


def nest_qos_overrides(parameters: dict[str, Any]) -> dict[str, Any]:
    """``parameters`` with flat QoS override keys (``qos_overrides./topic.subscription.reliability:
    reliable``, which a ROS 2 parameter file takes as well as the nested form) folded into the
    nested ``qos_overrides`` mapping, so both forms are checked alike. A flat key without the
    three parts stays as it is (and is reported as undeclared)."""
    prefix = f"{QOS_OVERRIDES}."
    out = {name: value for name, value in parameters.items() if not name.startswith(prefix)}
    nested = out.get(QOS_OVERRIDES, {})
    if not isinstance(nested, dict):
        return dict(parameters)  # the nested value's own problem is reported
    merged: dict[str, Any] = {topic: {entity: dict(policies) if isinstance(policies, dict) else policies
                                      for entity, policies in entities.items()}
                              if isinstance(entities, dict) else entities for topic, entities in nested.items()}
    for name, value in parameters.items():
        if not name.startswith(prefix):
            continue
        parts = name[len(prefix):].rsplit(".", 2)   # topic names hold no dots
        entities = merged.setdefault(parts[0], {}) if len(parts) == 3 and all(parts) else None
        policies = entities.setdefault(parts[1], {}) if isinstance(entities, dict) else None
        if isinstance(policies, dict):
            policies[parts[2]] = value
        else:
            out[name] = value
    if merged:
        out[QOS_OVERRIDES] = merged
    return out


def check_graph_parameters(graph: GraphConfig, source: str) -> None:
    """ValueError naming ``source``, the node, the parameter and the reason of the first problem
    (and how many more there are)."""
    problems = parameter_problems(graph)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ValueError(f"{source}: {problems[0]}{more}")


def qos_override_problems(value: Any, entity: str) -> list[str]:
    """What is wrong with a node's ``qos_overrides`` mapping (``{topic: {entity: {policy: value}}}``),
    each as ``.<where>: reason``; rclpy would otherwise reject it in the node's constructor."""
    if not isinstance(value, dict):
        return [f": must be a mapping {{/topic: {{{entity}: {{policy: value}}}}}}, got {value!r}"]
    problems = []
    for topic, entities in value.items():
        where = f".{topic}"
        if not isinstance(topic, str) or not topic.startswith("/"):
            problems.append(f"{where}: the topic must be the resolved name, starting with '/'")
        elif not isinstance(entities, dict) or set(entities) != {entity}:
            problems.append(f"{where}: must hold only '{entity}' (its sensor topics are {entity}s)")
        elif not isinstance(entities[entity], dict):
            problems.append(f"{where}.{entity}: must be a mapping of policy: value")
        else:
            for policy, setting in entities[entity].items():
                problems += [f"{where}.{entity}.{policy}: {reason}" for reason in _policy_problem(policy, setting)]
    return problems


def _policy_problem(policy: str, setting: Any) -> list[str]:
    if policy == "depth":
        return [] if isinstance(setting, int) and not isinstance(setting, bool) and setting >= 0 else \
            [f"must be an integer >= 0, got {setting!r}"]
    allowed = QOS_POLICY_VALUES.get(policy)
    if allowed is None:
        return [f"not a policy these topics take (they take {', '.join(sorted([*QOS_POLICY_VALUES, 'depth']))})"]
    return [] if setting in allowed else [f"must be one of {', '.join(allowed)}, got {setting!r}"]
