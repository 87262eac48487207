"""The planned engine over onnxruntime's blocked (NCHWc) layout rewrite (engine/plan/layout.py)."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from dynnet_ros.engine import Engine
from dynnet_ros.engine.backends import cpu_planned
from dynnet_ros.engine.backends.cpu_planned import create_planned_executor
from dynnet_ros.engine.backends.registry import load_for_backend
from dynnet_ros.engine.plan import layout
from dynnet_ros.engine.plan.layout import cpu_block_size, laid_out_skeleton, nchwc_layout
from dynnet_ros.engine.rdp import analyze
from dynnet_ros.engine.runtime.executor import PlannedExecutor
from dynnet_ros.zoo import ensure_model
from dynnet_ros.zoo.samples import example_inputs

pytestmark = pytest.mark.slow

needs_nchwc = pytest.mark.skipif(cpu_block_size() is None, reason="this CPU has no onnxruntime NCHWc kernels")


def _reference(path: str, feeds: dict) -> dict:
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


def _image(height: int, width: int, seed: int = 0) -> dict:
    return {"image": np.random.default_rng(seed).random((1, 3, height, width), dtype=np.float32)}


def _residual_chain(path) -> str:
    """conv → conv → conv, + skip Add, → conv (1 channel) → sigmoid: onnxruntime keeps the Add as an ONNX
    op between two NCHWc convs, the pattern our own Conv+Add fusion must not touch."""
    rng = np.random.default_rng(3)

    def w(name, shape):
        return onnx.numpy_helper.from_array((rng.standard_normal(shape) * 0.2).astype(np.float32), name)

    nodes = [helper.make_node("Conv", ["image", "w0"], ["c0"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Relu", ["c0"], ["r0"]),
             helper.make_node("Conv", ["r0", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Add", ["r0", "r1"], ["sum"]),
             helper.make_node("Conv", ["sum", "w2"], ["c2"]),
             helper.make_node("Sigmoid", ["c2"], ["prob"])]
    graph = helper.make_graph(nodes, "residual", [helper.make_tensor_value_info("image", TensorProto.FLOAT,
                                                                                  [1, 3, "H", "W"])],
                              [helper.make_tensor_value_info("prob", TensorProto.FLOAT, [1, 1, "h", "w"])],
                              [w("w0", (32, 3, 3, 3)), w("w1", (32, 32, 3, 3)), w("w2", (1, 32, 1, 1))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, path)
    return str(path)


@pytest.fixture(autouse=True)
def _private_layout_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DYNNET_LAYOUT_DIR", str(tmp_path / "layout"))


@needs_nchwc
def test_engine_plans_the_blocked_layout_and_matches_onnxruntime(tmp_path):
    path = _residual_chain(tmp_path / "residual.onnx")
    with Engine(path, threads=1) as engine:
        executor = engine._executor
        assert isinstance(executor, PlannedExecutor) and executor.options.layout == "nchwc"
        ops = {(n.domain, n.op_type) for n in executor.graph.nodes}
        assert ("com.microsoft.nchwc", "Conv") in ops
        # the skip Add between two blocked convs stays an ONNX Add (never an NCHW FusedConv)
        assert ("com.microsoft", "FusedConv") not in ops
        for height, width in ((64, 64), (96, 160)):
            feeds = _image(height, width)
            np.testing.assert_allclose(engine.run(feeds)["prob"], _reference(path, feeds)["prob"],
                                       rtol=1e-4, atol=1e-5)


@needs_nchwc
@pytest.mark.parametrize("name", ["lane", "depth", "gated"])
def test_rdp_shapes_of_the_laid_out_graph_match_onnxruntime(name):
    """RDP's rules for onnxruntime's contrib ops (Reorder*, NCHWc Conv/Upsample/pools, FusedGemm)
    give every intermediate tensor's shape exactly, so the planner can place them."""
    skeleton, _ = laid_out_skeleton(load_for_backend("cpu", str(ensure_model(name))))
    result = analyze(skeleton)
    assert not result.unknown_ops
    full = onnx.load(str(nchwc_layout(ensure_model(name)).path))
    have = {o.name for o in full.graph.output}
    for node in full.graph.node:
        for out in node.output:
            info = result.tensors.get(out)
            if out and out not in have and info is not None and info.dtype:
                full.graph.output.append(helper.make_tensor_value_info(out, info.dtype, None))
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(full.SerializeToString(), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    checked = 0
    for height, width in ((224, 256), (480, 640)):
        feeds = example_inputs(name, height, width)
        env = result.bind({k: v.shape for k, v in feeds.items()})
        for tensor, value in zip(names, session.run(names, feeds)):
            assert result.tensor_shape(tensor, env) == value.shape, tensor
            checked += 1
    assert checked > 20


@needs_nchwc
def test_padded_channels_are_dropped_before_upsampling():
    """lane's 1-channel head is padded to the block size in NCHWc; upsampling it there would make a
    16x bigger full-resolution tensor. The rewrite resizes the narrow map instead, so the laid-out
    plan needs no more arena than the model as given."""
    skeleton = load_for_backend("cpu", str(ensure_model("lane")))
    laid_out, _ = laid_out_skeleton(skeleton)
    consumers = {name: node for node in laid_out.graph.node for name in node.input}
    for node in laid_out.graph.node:
        if node.domain == "com.microsoft.nchwc" and node.op_type == "Upsample":
            user = consumers.get(node.output[0])
            assert user is None or user.op_type != "ReorderOutput"
    shapes = {"image": (1, 3, 640, 640)}
    heights = {}
    for kind in ("nchwc", "as-given"):
        executor = create_planned_executor(skeleton, threads=1, layout=kind, cost_model=False)  # the finest cuts
        try:
            assert executor.options.layout == kind
            heights[kind] = executor.plan_for(shapes).height
        finally:
            executor.close()
    assert heights["nchwc"] <= heights["as-given"] * 1.02


@needs_nchwc
def test_layout_is_cached_and_reused(tmp_path, monkeypatch):
    path = _residual_chain(tmp_path / "residual.onnx")
    first = nchwc_layout(path)
    assert first.nchwc_nodes > 0 and first.block_size == cpu_block_size()

    def no_rewrite(*args, **kwargs):
        raise AssertionError("a cached layout must not be rewritten again")

    monkeypatch.setattr(layout, "_rewrite", no_rewrite)
    monkeypatch.setattr(layout.subprocess, "run", no_rewrite)
    assert nchwc_layout(path).path == first.path


def test_models_without_blocked_kernels_are_planned_as_given(tmp_path, monkeypatch):
    """No convolutions → nothing for NCHWc: the engine plans the model as given (same outputs).
    Cutting this model saves nothing, so the cost model is off to keep it planned."""
    monkeypatch.setattr(cpu_planned, "plan_profile", lambda: {"cost_model": False})
    graph = helper.make_graph([helper.make_node("Mul", ["x", "x"], ["y"]), helper.make_node("Relu", ["y"], ["z"])],
                              "elementwise", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["N", 8])])
    path = tmp_path / "elementwise.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    with Engine(str(path), threads=1) as engine:
        assert engine._executor.options.layout == "as-given"
        x = np.linspace(-1, 1, 24, dtype=np.float32).reshape(3, 8)
        np.testing.assert_allclose(engine.run({"x": x})["z"], np.maximum(x * x, 0))


def test_a_model_onnxruntime_cannot_rewrite_is_reported(tmp_path):
    path = tmp_path / "broken.onnx"
    path.write_bytes(b"\x08\x07not a model")
    with pytest.raises(ValueError, match="could not lay out"):
        nchwc_layout(path)


@needs_nchwc
def test_a_damaged_cache_entry_is_rebuilt(tmp_path):
    path = _residual_chain(tmp_path / "residual.onnx")
    first = nchwc_layout(path)
    first.path.write_bytes(first.path.read_bytes()[:100])  # truncated, as after a full disk
    skeleton, laid = laid_out_skeleton(load_for_backend("cpu", path))
    assert laid.path == first.path and any(n.domain == "com.microsoft.nchwc" for n in skeleton.graph.node)


def test_balanced_profile_runs_fewer_sessions_with_the_same_outputs(monkeypatch):
    """$DYNNET_PLAN_PROFILE=balanced: segments only at data-dependent ops and control flow, each with
    onnxruntime's own arena (near onnxruntime's speed, more memory than the default)."""
    path = str(ensure_model("pedestrian"))
    feeds = example_inputs("pedestrian", 224, 256)
    want = _reference(path, feeds)
    counts = {}
    for profile in ("memory", "balanced"):
        monkeypatch.setenv("DYNNET_PLAN_PROFILE", profile)
        with Engine(path, threads=1) as engine:
            got = engine.run(feeds)
            counts[profile] = len(engine._executor.segments)
            assert engine._executor.options.segment_arena == (profile == "balanced")
        for name, value in want.items():
            np.testing.assert_allclose(got[name], value, rtol=1e-4, atol=1e-5)
    assert counts["balanced"] < counts["memory"] / 2
    monkeypatch.setenv("DYNNET_PLAN_PROFILE", "fastest")
    with pytest.raises(ValueError, match="DYNNET_PLAN_PROFILE"):
        Engine(path, threads=1)
