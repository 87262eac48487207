"""Budgets in one process: a model node sharing its process with another model node (a component
container) reports what its own model and frames hold, not the process's growth since its model
loaded, which counts the neighbour's model too; so the budget manager's pool, which adds back
what the model nodes hold, counts each model once.

Two real model nodes in this test's process, each with its own arguments on one rclpy context,
as the container creates them.
"""
from __future__ import annotations

import pytest
import rclpy
from _waiting import wait_for
from rclpy.context import Context

from dynnet_ros.nodes.base import close_node
from dynnet_ros.nodes.lane_node import LaneNode
from dynnet_ros.nodes.pedestrian_node import PedestrianNode
from dynnet_ros.procmem import process_memory
from dynnet_ros.zoo import ensure_model

pytestmark = pytest.mark.graph


def _args(name: str) -> list[str]:
    return ["--ros-args", "-r", f"__node:={name}", "-r", "__ns:=/budget_in_one_process",
            "-p", "max_input_side:=160", "-p", "camera_sizes:=[160x120]"]


def _weights_read_in(node) -> bool:
    """Every weight of the node's engine is resident. A streamed engine reads its weights in on its
    window's thread after the node is built, and what the node reports holding grows with them, as
    its RSS does; with no budget (as here) the window holds them all once read."""
    window = node.serving.engine.engine_stats().window
    return window is None or window.resident_weight_bytes == window.weight_span_bytes


def test_a_model_node_beside_another_counts_its_own_model_only():
    ensure_model("lane")
    ensure_model("pedestrian")
    context = Context()
    rclpy.init(context=context)
    nodes = []
    try:
        lane = LaneNode(context=context, cli_args=_args("lane"), use_global_arguments=False)
        nodes.append(lane)
        assert lane.held_beside_neighbours() is None  # alone: its RSS growth is its own
        wait_for(lambda: _weights_read_in(lane), 60, "the lane engine's weights read in")
        own = lane.own_memory_mb()
        rss_view = process_memory().rss_mb - lane.budget_profile.baseline.rss_mb
        before = process_memory().rss_mb
        pedestrian = PedestrianNode(context=context, cli_args=_args("pedestrian"), use_global_arguments=False)
        nodes.append(pedestrian)
        wait_for(lambda: _weights_read_in(pedestrian), 60, "the pedestrian engine's weights read in")
        grown = process_memory().rss_mb - before  # the neighbour's model, loaded after the lane node's
        assert grown > 5.0, grown

        # the RSS view of the lane node took the neighbour's model in ...
        assert process_memory().rss_mb - lane.budget_profile.baseline.rss_mb >= rss_view + 0.8 * grown
        # ... its reported figure does not: both nodes count their own model and frames
        lane_held, lane_anon = lane.held_beside_neighbours()
        assert lane_held == own == lane_anon
        pedestrian_held, _ = pedestrian.held_beside_neighbours()
        assert pedestrian_held == pedestrian.own_memory_mb() > 0.0

        # alone again, the lane node goes back to its process's growth
        close_node(nodes.pop())
        assert lane.held_beside_neighbours() is None
    finally:
        for node in reversed(nodes):
            close_node(node)
        context.try_shutdown()
