"""The Engine contract (docs/engine.md): validation, outputs equal to onnxruntime, stats, budgets."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from dynnet_ros.engine import Engine


def _conv_model() -> onnx.ModelProto:
    """x[1,3,H,W] -> Conv(3->4, 3x3, pad 1) -> Relu -> y[1,4,H,W]."""
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
         helper.make_node("Relu", ["c"], ["y"], name="relu")],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "H", "W"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, "H", "W"])],
        initializer=[weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return model


@pytest.fixture()
def model_path(tmp_path):
    path = tmp_path / "tiny.onnx"
    onnx.save(_conv_model(), path)
    return path


def test_outputs_equal_onnxruntime_at_several_shapes(model_path):
    engine = Engine(model_path)
    reference = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    for height, width in [(8, 8), (16, 24), (5, 7)]:
        x = np.random.default_rng(height).standard_normal((1, 3, height, width)).astype(np.float32)
        out = engine.run({"x": x})
        np.testing.assert_allclose(out["y"], reference.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)
    stats = engine.stats()
    assert stats["shape_signature"] == {"x": [1, 3, 5, 7]}
    assert stats["runs"] == 3 and stats["last_latency_ms"] > 0


@pytest.mark.parametrize("feeds, fragment", [
    ({"image": np.zeros((1, 3, 4, 4), np.float32)}, "unknown input"),
    ({}, "missing input"),
    ({"x": np.zeros((1, 3, 4), np.float32)}, "rank 3"),
    ({"x": np.zeros((1, 3, 4, 4), np.float64)}, "dtype float64"),
    ({"x": np.zeros((1, 2, 4, 4), np.float32)}, "axis 1 is 2"),
    ({"x": np.zeros((1, 3, 0, 4), np.float32)}, "Conv node"),  # onnxruntime's Conv refuses an empty image
    ({"x": [[1.0]]}, "rank 2"),
    ({"x": 1.0}, "numpy array"),
])
def test_bad_feeds_name_the_input_and_expected_shape(model_path, feeds, fragment):
    engine = Engine(model_path)
    with pytest.raises(ValueError, match=fragment) as info:
        engine.run(feeds)
    if fragment != "unknown input":
        assert "x: float32[1, 3, H, W]" in str(info.value) or "'x'" in str(info.value)
    # The engine keeps serving after a bad call.
    assert engine.run({"x": np.ones((1, 3, 4, 4), np.float32)})["y"].shape == (1, 4, 4, 4)


def test_malformed_and_missing_models_raise_value_error(tmp_path):
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"\x08\x07not a protobuf at all\xff\xff")
    with pytest.raises(ValueError):
        Engine(garbage)
    with pytest.raises(ValueError, match="not found"):
        Engine(tmp_path / "absent.onnx")
    broken = _conv_model()
    broken.graph.node[0].input[1] = "no_such_weight"
    with pytest.raises(ValueError, match="checker|cannot load"):
        Engine(broken)


def test_unknown_backend_is_rejected_with_choices(model_path):
    with pytest.raises(ValueError, match="unknown backend"):
        Engine(model_path, backend="fpga")


@pytest.mark.parametrize("bad", [0, -5, float("nan"), float("inf"), "100", True])
def test_invalid_budgets_are_rejected_and_previous_kept(model_path, bad):
    engine = Engine(model_path, memory_budget_mb=512)
    with pytest.raises(ValueError):
        engine.set_memory_budget(bad)
    assert engine.memory_budget_mb == 512
    engine.set_memory_budget(None)
    assert engine.memory_budget_mb is None
