"""onnx's checker for model files: once per content, in a child process (modelio/model_check.py)."""
from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper

from dynnet_ros.engine.modelio import model_check
from dynnet_ros.engine.modelio.loader import load_skeleton


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DYNNET_LAYOUT_DIR", str(tmp_path / "cache"))


def _model(path, op: str = "Relu") -> str:
    graph = helper.make_graph([helper.make_node(op, ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return str(path)


def test_verdict_is_cached_by_content(tmp_path, monkeypatch):
    path = _model(tmp_path / "relu.onnx")
    load_skeleton(path)  # first time: checked in a child process, verdict stored

    def no_child(*args, **kwargs):
        raise AssertionError("a checked file must not be checked again")

    monkeypatch.setattr(model_check.subprocess, "run", no_child)
    assert load_skeleton(path).graph.node[0].op_type == "Relu"
    _model(tmp_path / "relu.onnx", op="Sigmoid")  # new content: a new verdict is needed
    with pytest.raises(AssertionError, match="must not be checked again"):
        load_skeleton(path)


@pytest.mark.slow
def test_invalid_model_reports_the_checker_message(tmp_path):
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Relu", ["z"], ["w"])],
                              "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("w", TensorProto.FLOAT, [4])])
    path = tmp_path / "dangling.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    for _ in range(2):  # an invalid verdict is never cached
        with pytest.raises(ValueError, match="checker"):
            load_skeleton(path)


def test_without_a_child_process_the_check_runs_here(tmp_path, monkeypatch):
    def cannot_start(*args, **kwargs):
        raise OSError("no interpreter")

    monkeypatch.setattr(model_check.subprocess, "run", cannot_start)
    assert load_skeleton(_model(tmp_path / "ok.onnx")).graph.node
    graph = helper.make_graph([helper.make_node("Relu", ["missing"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    bad = tmp_path / "bad.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), bad)
    with pytest.raises(ValueError, match="checker"):
        load_skeleton(bad)
