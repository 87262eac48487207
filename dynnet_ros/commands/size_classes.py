"""Measure a graph's model footprints before its nodes start (`dynnet up`, `dynnet demo`).

Why: a budget is judged against each model's footprint at each input size class, measured once per
machine in a child process (swap/footprint.py). On a graph's first start every model node would
measure its classes at once, on the same cores, while frames wait; measured here first, one at a
time, the nodes start from the cache and serve at once. Later starts find everything cached and
this step takes well under a second per model.
"""
from __future__ import annotations

from collections.abc import Callable

from dynnet_ros.graph_config import ProcessSpec
from dynnet_ros.nodes.depth_node import make_depth_estimator
from dynnet_ros.nodes.lane_node import make_segmenter
from dynnet_ros.nodes.parameter_check import DECLARED
from dynnet_ros.nodes.pedestrian_node import make_detector
from dynnet_ros.nodes.sensor_sim import parse_resolution
from dynnet_ros.perception.core import PerceptionCore
from dynnet_ros.zoo import ensure_model

MODEL_TASKS = {"lane_node": "lane", "pedestrian_node": "pedestrian", "depth_node": "depth"}
#: the perception core each model node builds from its parameters
CORES: dict[str, Callable[..., PerceptionCore]] = {
    "lane_node": make_segmenter, "pedestrian_node": make_detector, "depth_node": make_depth_estimator}


def effective_parameters(process: ProcessSpec) -> dict:
    """The node's parameters as it will declare them: the config's over the declared defaults."""
    return {**{spec.name: spec.default for spec in DECLARED[process.executable]}, **process.parameters}


def measure_size_classes(process: ProcessSpec) -> int:
    """Measure the footprint of ``process``'s model at each of its ``camera_sizes`` (the size
    classes the node announces), through the same perception core the node builds, so the input
    shapes are the ones its frames get; returns how many. ValueError for a model that does not
    load or run there (the node reports that itself)."""
    params = effective_parameters(process)
    path = params["model_path"] or str(ensure_model(MODEL_TASKS[process.executable]))
    with CORES[process.executable](path, params, None, swappable=True) as core:
        count = 0
        for text in params["camera_sizes"]:
            width, height = parse_resolution(text)
            core.engine.min_budget_mb(core.input_shapes(height, width))
            count += 1
        return count


def prepare_graph_models(processes: list[ProcessSpec], report: Callable[[str], None]) -> None:
    """``measure_size_classes`` for every model node on the cpu backend, one after another."""
    for process in processes:
        if process.executable not in MODEL_TASKS:
            continue
        params = effective_parameters(process)
        if params["backend"] != "cpu":
            continue  # budgets apply to the cpu backend only
        try:
            count = measure_size_classes(process)
        except ValueError as exc:
            report(f"{process.name}: footprint not measured ahead ({exc}); the node reports it")
            continue
        report(f"{process.name}: footprint at {count} size class(es) ready")
