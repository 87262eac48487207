"""Models the planner has nothing to save on run as one plain onnxruntime session, and cost no more
memory than onnxruntime itself: the verdict is taken once per model file in a child process
(backends/cut_verdict.py), so the serving process never plans such a model, and the weightless
loader keeps weights stored as top-level ``Constant`` nodes (paddle2onnx) out of Python too.
"""
from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap
import types

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from dynnet_ros.engine import Engine
from dynnet_ros.engine.backends import cpu_planned
from dynnet_ros.engine.modelio.loader import load_skeleton

pytestmark = pytest.mark.graph

WIDTH = 1024  # a 4 MiB weight: held in Python it would show against onnxruntime's peak


def _unsized_model() -> onnx.ModelProto:
    """x reshaped by a fed shape, then a MatMul with a weight stored as a Constant node (as
    paddle2onnx does), and an If whose branch holds a small Constant of its own. The fed shape
    leaves every tensor's size unknown before a run, so the cost model runs one plain session."""
    rng = np.random.default_rng(0)

    def constant(name: str, shape: tuple[int, ...]) -> onnx.NodeProto:
        value = (rng.standard_normal(shape) * 0.01).astype(np.float32)
        return helper.make_node("Constant", [], [name], value=onnx.numpy_helper.from_array(value, name))

    branch_out = helper.make_tensor_value_info("b", TensorProto.FLOAT, ["R", WIDTH])
    then_graph = helper.make_graph([constant("w2", (WIDTH,)), helper.make_node("Add", ["h", "w2"], ["b"])], "then",
                                   [], [branch_out])
    else_graph = helper.make_graph([helper.make_node("Identity", ["h"], ["b"])], "else", [], [branch_out])
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["xr"]), constant("w1", (WIDTH, WIDTH)),
             helper.make_node("MatMul", ["xr", "w1"], ["h"]),
             helper.make_node("If", ["flag"], ["y"], then_branch=then_graph, else_branch=else_graph)]
    graph = helper.make_graph(nodes, "unsized", [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N"]),
        helper.make_tensor_value_info("shape", TensorProto.INT64, [2]),
        helper.make_tensor_value_info("flag", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["R", WIDTH])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return model


def _feeds(rows: int, flag: bool) -> dict[str, np.ndarray]:
    x = np.random.default_rng(rows).standard_normal(rows * WIDTH).astype(np.float32)
    return {"x": x, "shape": np.array([rows, WIDTH], np.int64), "flag": np.array(flag)}


@pytest.fixture()
def model_file(tmp_path, monkeypatch):
    monkeypatch.setenv("DYNNET_LAYOUT_DIR", str(tmp_path / "cache"))  # a verdict cache of this test's own
    path = tmp_path / "unsized.onnx"
    onnx.save(_unsized_model(), path)
    return str(path)


def test_constant_weights_load_as_file_references(model_file):
    skeleton = load_skeleton(model_file)
    assert skeleton.ByteSize() < 64 * 1024  # the 4 MiB weight is not held by the proto
    assert [t.name for t in skeleton.graph.initializer] == ["w1"]
    assert skeleton.graph.initializer[0].data_location == TensorProto.EXTERNAL
    assert [n.op_type for n in skeleton.graph.node] == ["Reshape", "MatMul", "If"]
    # inside a branch a Constant stays a node: the streamed-weights store writes subgraphs as they are
    then_branch = next(a.g for a in skeleton.graph.node[-1].attribute if a.name == "then_branch")
    assert [n.op_type for n in then_branch.node] == ["Constant", "Add"]


def test_a_model_with_nothing_to_save_is_never_planned_in_the_serving_process(model_file, monkeypatch):
    session = ort.InferenceSession(model_file, providers=["CPUExecutionProvider"])
    with Engine(model_file) as first:  # decides in a child process and caches the verdict
        plan = first.stats()["plan"]
        assert first.stats()["executor"] == "cpu" and plan["fallback"]
        assert "no tensor of the graph has a known size" in plan["reason"]

    def planning(*args, **kwargs):
        raise AssertionError("a model with a single-session verdict was analysed in this process")

    monkeypatch.setattr(cpu_planned, "PlannedExecutor", planning)
    monkeypatch.setattr(cpu_planned, "laid_out_skeleton", planning)
    with Engine(model_file) as engine:
        assert engine.stats()["plan"]["fallback"]
        for rows, flag in ((3, True), (5, False)):
            feeds = _feeds(rows, flag)
            np.testing.assert_allclose(engine.run(feeds)["y"], session.run(None, feeds)[0], rtol=1e-5, atol=1e-6)


_PEAK = textwrap.dedent("""
    import json, sys
    import numpy as np, onnxruntime as ort
    from dynnet_ros.engine import Engine
    from dynnet_ros.procmem import reset_peak_rss, status_bytes
    path, side, width = sys.argv[1], sys.argv[2], int(sys.argv[3])
    feeds = [{"x": np.ones(r * width, np.float32), "shape": np.array([r, width], np.int64), "flag": np.array(True)}
             for r in (4, 16, 8)]
    reset_peak_rss()
    base = status_bytes("VmRSS")
    if side == "engine":
        run = Engine(path, threads=1).run
    else:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        session = ort.InferenceSession(path, sess_options=options, providers=["CPUExecutionProvider"])
        run = lambda f: session.run(None, f)
    for f in feeds:
        run(f)
    print(json.dumps((status_bytes("VmHWM") - base) / 2**20))
""")


def _peak_mb(path: str, side: str) -> float:
    proc = subprocess.run([sys.executable, "-c", _PEAK, path, side, str(WIDTH)], capture_output=True, text=True,
                          check=True, env=dict(os.environ))
    return float(json.loads(proc.stdout.strip().splitlines()[-1]))


def test_a_single_session_engine_holds_no_more_than_onnxruntime(model_file):
    """Fresh processes, peak above the baseline after imports, the smaller of two per side: the
    engine's is within 5 % (+0.5 MB of page granularity) of a plain session's; the model's 4 MiB
    Constant weight held once more in Python would break that."""
    with Engine(model_file):
        pass  # the verdict, cached for the children (they inherit DYNNET_LAYOUT_DIR)
    ours = min(_peak_mb(model_file, "engine") for _ in range(2))
    plain = min(_peak_mb(model_file, "onnxruntime") for _ in range(2))
    assert plain > 4.0  # the weight is in onnxruntime's peak
    assert ours <= 1.05 * plain + 0.5, (ours, plain)


def _protos_reachable(root: object) -> list[str]:
    """Type names of the ONNX protobuf messages reachable from ``root`` through its attributes,
    containers, bound methods and closures (not through modules, classes or function globals,
    which reach everything)."""
    protos = (onnx.ModelProto, onnx.GraphProto, onnx.NodeProto, onnx.TensorProto)
    seen: set[int] = set()
    found: list[str] = []
    stack = [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, (types.ModuleType, type)):
            continue
        seen.add(id(obj))
        if isinstance(obj, protos):
            found.append(type(obj).__name__)
            continue
        if isinstance(obj, types.FunctionType):
            stack += [cell.cell_contents for cell in obj.__closure__ or ()]
            continue
        stack += gc.get_referents(obj)
    return found


def test_a_single_session_engine_holds_no_graph_until_a_budget_needs_it(model_file):
    """The weightless graph (here with the branch Constant inside it) is dropped before the
    session is built and read from the file again where a budget asks for it."""
    with Engine(model_file) as engine:
        assert engine.stats()["plan"]["fallback"]
        assert _protos_reachable(engine) == []
        assert engine.outputs == ["y"] and [spec.name for spec in engine.inputs] == ["x", "shape", "flag"]
        assert engine.proto.graph.node[-1].op_type == "If"  # read again from the file on demand
        assert "ModelProto" in _protos_reachable(engine)
    with Engine(onnx.load(model_file)) as in_memory:  # no file to read it from: the graph is held
        assert "ModelProto" in _protos_reachable(in_memory)

