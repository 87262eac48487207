"""RDP's strict mode: a transfer function's own failure raises; lenient mode makes it nac and warns
once per operator type."""
from __future__ import annotations

import dataclasses
import logging

import pytest
from onnx import TensorProto, helper

from dynnet_ros.engine.rdp import REGISTRY, TransferError, analyze, fixpoint
from dynnet_ros.settings import settings


def _two_relus():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "H", "W"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu_a"),
             helper.make_node("Relu", ["a"], ["y"], name="relu_b")]
    graph = helper.make_graph(nodes, "g", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture
def broken_relu(monkeypatch):
    """Relu's transfer function with a bug (an internal error, not a ShapeError); fresh warn-once state."""
    def boom(ctx):
        raise KeyError("a transfer-function bug")

    monkeypatch.setitem(REGISTRY, "Relu", dataclasses.replace(REGISTRY["Relu"], fn=boom))
    monkeypatch.setattr(fixpoint, "_failed_ops", set())


def test_strict_mode_raises_naming_the_node(broken_relu):
    with pytest.raises(TransferError, match="Relu failed on node relu_a: KeyError") as info:
        analyze(_two_relus(), strict=True)
    assert isinstance(info.value.__cause__, KeyError)


def test_lenient_mode_makes_nac_and_warns_once_per_op_type(broken_relu, caplog):
    with caplog.at_level(logging.DEBUG, logger=fixpoint.log.name):
        result = analyze(_two_relus(), strict=False)
    assert result.tensors["a"].kind == "nac" and result.tensors["y"].kind == "nac"
    assert "transfer failed: KeyError" in (result.tensors["a"].reason or "")
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "ai.onnx::Relu" in warned[0].getMessage()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=fixpoint.log.name):
        analyze(_two_relus(), strict=False)
    assert [r for r in caplog.records if r.levelno == logging.WARNING] == []  # once per process


@pytest.mark.parametrize(("value", "raises"), [("1", True), ("0", False)])
def test_the_environment_decides_when_strict_is_not_given(broken_relu, monkeypatch, value, raises):
    monkeypatch.setenv("DYNNET_RDP_STRICT", value)
    if raises:
        with pytest.raises(TransferError):
            analyze(_two_relus())
    else:
        assert analyze(_two_relus()).tensors["y"].kind == "nac"


def test_the_test_suite_runs_strict():
    assert settings().planner.rdp_strict


def test_an_invalid_model_stays_nac_in_strict_mode():
    # a broadcast the model breaks is the model's fault (ShapeError), not a bug in RDP
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 3])
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, [4, 5])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph([helper.make_node("Add", ["a", "b"], ["y"], name="add")], "g", [a, b], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    result = analyze(model, strict=True)
    assert result.tensors["y"].kind == "nac"
