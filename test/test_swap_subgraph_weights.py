"""Weights read only inside an ``If`` body stay in a streamed model's graph (swap/gemm_split.py),
and the footprint calibration feeds the model's small integer inputs their last values
(swap/footprint.py), so a model whose control flow hangs on such an input (Silero's sample
rate, test/test_real_models.py) can be budgeted."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h

from dynnet_ros.engine import Engine
from dynnet_ros.swap.footprint import footprint_path
from dynnet_ros.swap.gemm_split import split_large_gemms


def _branch_model() -> onnx.ModelProto:
    def branch(op: str) -> onnx.GraphProto:
        return h.make_graph([h.make_node(op, ["x", "w"], ["out"])], op, [],
                            [h.make_tensor_value_info("out", T.FLOAT, [4])])
    weight = h.make_tensor("w", T.FLOAT, [4], np.arange(4, dtype=np.float32))
    graph = h.make_graph([h.make_node("If", ["c"], ["y"], then_branch=branch("Add"), else_branch=branch("Mul"))], "g",
                         [h.make_tensor_value_info("c", T.BOOL, []), h.make_tensor_value_info("x", T.FLOAT, [4])],
                         [h.make_tensor_value_info("y", T.FLOAT, [4])], [weight])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8)


def test_weights_read_only_by_if_branches_are_kept():
    model = _branch_model()
    split_large_gemms(model, 1 << 20)
    assert [t.name for t in model.graph.initializer] == ["w"]
    onnx.checker.check_model(model)


@pytest.mark.slow
def test_a_budgeted_engine_streams_weights_read_only_by_if_branches(tmp_path, monkeypatch):
    monkeypatch.setenv("DYNNET_SWAP_DIR", str(tmp_path / "swap"))
    path = tmp_path / "branches.onnx"
    onnx.save(_branch_model(), path)
    x = np.full(4, 2.0, np.float32)
    with Engine(str(path), swappable=True, input_shapes={"c": (), "x": (4,)}) as engine:
        engine.run({"c": np.array(True), "x": x})
        engine.set_memory_budget(engine.latency_table()[-1][0])
        assert engine.engine_stats().window is not None  # streamed, not refused
        np.testing.assert_array_equal(engine.run({"c": np.array(True), "x": x})["y"], x + np.arange(4))
        np.testing.assert_array_equal(engine.run({"c": np.array(False), "x": x})["y"], x * np.arange(4))


def test_control_values_key_their_own_calibration(tmp_path):
    class File:  # what footprint_path reads of a weight file
        directory = tmp_path / "weights"
    shapes = {"sr": (), "x": (1, 576)}
    plain = footprint_path(File, 1, shapes, tmp_path)
    assert footprint_path(File, 1, shapes, tmp_path, {}) == plain  # no values: the same entry as ever
    at_16k = footprint_path(File, 1, shapes, tmp_path, {"sr": 16000})
    assert at_16k != plain and at_16k != footprint_path(File, 1, shapes, tmp_path, {"sr": 8000})
