"""A container's kept run-time values (`container --keep-values FILE`): what a set call writes,
what the next start reads back, and what it refuses to apply.

One real rclpy node on a context of the test's own: its parameters set through the node's own
API (the path its parameter services take), the file read back by a new KeptValues as the
respawned process would.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import rclpy
from rcl_interfaces.msg import SetParametersResult
from rclpy.context import Context
from rclpy.node import Node
from rclpy.parameter import Parameter

from dynnet_ros.nodes.kept_values import KeptValues

pytestmark = pytest.mark.graph  # a node: a DDS participant
PLUGIN = "dynnet_ros::LaneNode"


@pytest.fixture
def node():
    context = Context()
    rclpy.init(context=context)
    made = Node("kept_test", context=context, parameter_overrides=[])
    made.declare_parameter("lane_threshold", 0.5)
    made.declare_parameter("classes", [""])
    made.declare_parameter("threads", 1)
    made.declare_parameter("enabled", True)
    yield made
    made.destroy_node()
    rclpy.shutdown(context=context)


def typed(parameters: list[Parameter]) -> dict:
    return {p.name: (p.type_, p.value) for p in parameters}


def test_an_accepted_change_is_in_the_file_before_the_set_returns_and_comes_back_typed(node, tmp_path):
    path = tmp_path / "model_container.kept.yaml"
    kept = KeptValues(path)
    assert kept.overrides(0, PLUGIN) == []  # first start: nothing kept, no file needed
    kept.watch(0, PLUGIN, node)
    assert not path.exists()  # the declarations at start are the config's, not run-time values
    node.set_parameters([Parameter("lane_threshold", value=0.7)])
    assert typed(KeptValues(path).overrides(0, PLUGIN)) == {"lane_threshold": (Parameter.Type.DOUBLE, 0.7)}
    node.set_parameters([Parameter("classes", value=["lane", "curb"]), Parameter("threads", value=2),
                         Parameter("enabled", value=False)])
    assert typed(KeptValues(path).overrides(0, PLUGIN)) == {
        "lane_threshold": (Parameter.Type.DOUBLE, 0.7), "classes": (Parameter.Type.STRING_ARRAY, ["lane", "curb"]),
        "threads": (Parameter.Type.INTEGER, 2), "enabled": (Parameter.Type.BOOL, False)}
    assert "/kept_test" in path.read_text()  # the node named for whoever reads the file


def test_a_refused_change_is_not_kept(node, tmp_path):
    path = tmp_path / "kept.yaml"
    kept = KeptValues(path)
    kept.watch(0, PLUGIN, node)
    node.add_on_set_parameters_callback(
        lambda params: SetParametersResult(successful=all(p.value != 9 for p in params)))
    [result] = node.set_parameters([Parameter("threads", value=9)])
    assert not result.successful
    assert not path.exists()


def test_values_apply_only_to_the_node_at_their_place_with_their_plugin(node, tmp_path):
    path = tmp_path / "kept.yaml"
    KeptValues(path).watch(1, PLUGIN, node)
    node.set_parameters([Parameter("lane_threshold", value=0.6)])
    kept = KeptValues(path)
    assert kept.overrides(0, PLUGIN) == []
    assert kept.overrides(1, "dynnet_ros::DepthNode") == []
    assert typed(kept.overrides(1, PLUGIN)) == {"lane_threshold": (Parameter.Type.DOUBLE, 0.6)}
    assert kept.describe(1, PLUGIN) == "lane_threshold=0.6"


def test_an_unreadable_file_is_reported_and_the_nodes_start_from_the_config(tmp_path, capsys):
    path = tmp_path / "kept.yaml"
    for text in ("nodes: [not, a, mapping]", ": : :", "nodes: {0: {plugin: x}}"):
        Path(path).write_text(text)
        assert KeptValues(path).overrides(0, "x") == []
        assert "cannot read the kept run-time values" in capsys.readouterr().err
