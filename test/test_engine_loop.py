"""Loop bodies planned per iteration shape (engine/runtime/loop.py) against onnxruntime's own Loop."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from dynnet_ros.engine import Engine
from dynnet_ros.engine.backends import cpu_planned
from dynnet_ros.engine.plan.options import PlannerOptions
from dynnet_ros.engine.runtime.executor import PlannedExecutor
from dynnet_ros.engine.runtime.loop import LoopRunner

RTOL, ATOL = 1e-3, 1e-4
F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def _model(nodes, inputs, outputs, inits=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "loop_test", inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    return model


def _body(nodes, carried, scans=(), inits=(), scan_rank=2) -> onnx.GraphProto:
    """Body with inputs (i, c_in, <name>_in...) and outputs (c_out, <name>_out..., scans...)."""
    inputs = [helper.make_tensor_value_info("i", I64, []), helper.make_tensor_value_info("c_in", B, [])]
    inputs += [helper.make_tensor_value_info(n + "_in", F, [None, None]) for n in carried]
    outputs = [helper.make_tensor_value_info("c_out", B, [])]
    outputs += [helper.make_tensor_value_info(n + "_out", F, [None, None]) for n in carried]
    outputs += [helper.make_tensor_value_info(n, F, [None] * scan_rank) for n in scans]
    return helper.make_graph(nodes, "body", inputs, outputs, list(inits))


def _const(name: str, value) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value), name)


X = helper.make_tensor_value_info("x", F, ["N", "C"])
KEEP = helper.make_node("Identity", ["c_in"], ["c_out"])


def fixed_trips() -> onnx.ModelProto:
    """(a) M = 4, one loop-carried tensor whose shape never changes."""
    body = _body([KEEP, helper.make_node("Mul", ["y_in", "k"], ["m"]), helper.make_node("Add", ["m", "b"], ["a"]),
                  helper.make_node("Tanh", ["a"], ["y_out"])], ["y"],
                 inits=[_const("k", np.float32(0.9)), _const("b", np.float32(0.1))])
    nodes = [helper.make_node("Loop", ["M", "", "x"], ["y"], body=body)]
    return _model(nodes, [X], [helper.make_tensor_value_info("y", F, [None, None])], [_const("M", np.int64(4))])


def growing() -> onnx.ModelProto:
    """(b) a loop-carried tensor that grows by x's rows every iteration (Concat), next to a fixed one."""
    body = _body([KEEP, helper.make_node("Relu", ["x"], ["r"]),
                  helper.make_node("Mul", ["s_in", "r"], ["p"]),
                  helper.make_node("Concat", ["acc_in", "p"], ["acc_out"], axis=0),
                  helper.make_node("Sigmoid", ["p"], ["s_out"])], ["acc", "s"])
    nodes = [helper.make_node("Neg", ["x"], ["nx"]),
             helper.make_node("Loop", ["M", "", "x", "nx"], ["acc", "s"], body=body)]
    outputs = [helper.make_tensor_value_info(n, F, [None, None]) for n in ("acc", "s")]
    return _model(nodes, [X], outputs, [_const("M", np.int64(3))])


def scanning() -> onnx.ModelProto:
    """(c) scan outputs; the trip count is x's column count (a parent activation, not a constant)."""
    body = _body([KEEP, helper.make_node("Sigmoid", ["y_in"], ["y_out"]),
                  helper.make_node("Cast", ["i"], ["fi"], to=F),
                  helper.make_node("Add", ["y_in", "fi"], ["s"]),
                  helper.make_node("ReduceSum", ["y_in"], ["t"], keepdims=0)], ["y"], scans=["s", "t"])
    body.output[-1].CopyFrom(helper.make_tensor_value_info("t", F, []))
    nodes = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Gather", ["shape", "one"], ["M"], axis=0),
             helper.make_node("Loop", ["M", "", "x"], ["y", "s", "t"], body=body)]
    outputs = [helper.make_tensor_value_info(n, F, [None] * r) for n, r in (("y", 2), ("s", 3), ("t", 1))]
    return _model(nodes, [X], outputs, [_const("one", np.int64(1))])


def until() -> onnx.ModelProto:
    """(d) no trip count: runs while max(y) < 100 (zero iterations when x already is), doubling y."""
    body = _body([helper.make_node("Mul", ["y_in", "two"], ["y_out"]),
                  helper.make_node("ReduceMax", ["y_out"], ["peak"], keepdims=0),
                  helper.make_node("Less", ["peak", "limit"], ["c_out"]),
                  helper.make_node("Identity", ["peak"], ["peaks"])], ["y"], scans=["peaks"], scan_rank=0,
                 inits=[_const("two", np.float32(2)), _const("limit", np.float32(100))])
    nodes = [helper.make_node("ReduceMax", ["x"], ["start"], keepdims=0),
             helper.make_node("Less", ["start", "limit0"], ["go"]),
             helper.make_node("Loop", ["", "go", "x"], ["y", "peaks"], body=body)]
    outputs = [helper.make_tensor_value_info("y", F, [None, None]), helper.make_tensor_value_info("peaks", F, [None])]
    return _model(nodes, [X], outputs, [_const("limit0", np.float32(100))])


def outer_scope() -> onnx.ModelProto:
    """(e) the body reads an outer activation (z = Relu(x)) and an outer weight (W, 64x64)."""
    x = helper.make_tensor_value_info("x", F, ["N", 64])
    weight = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32) / 8
    body = _body([KEEP, helper.make_node("MatMul", ["y_in", "W"], ["m"]), helper.make_node("Add", ["m", "z"], ["a"]),
                  helper.make_node("Tanh", ["a"], ["y_out"])], ["y"])
    nodes = [helper.make_node("Relu", ["x"], ["z"]),
             helper.make_node("Loop", ["M", "", "x"], ["y"], body=body),
             helper.make_node("Add", ["y", "z"], ["out"])]
    return _model(nodes, [x], [helper.make_tensor_value_info("out", F, ["N", 64])],
                  [_const("M", np.int64(3)), numpy_helper.from_array(weight, "W")])


def nested() -> onnx.ModelProto:
    """(f) a Loop whose body holds another Loop (reading the outer body's input) and an If."""
    inner = _body([helper.make_node("Identity", ["d_in"], ["d_out"]), helper.make_node("Mul", ["z_in", "half"], ["h"]),
                   helper.make_node("Add", ["h", "y_in"], ["z_out"])], ["z"], inits=[_const("half", np.float32(0.5))])
    inner.input[0].name, inner.input[1].name, inner.output[0].name = "j", "d_in", "d_out"
    then_branch = helper.make_graph([helper.make_node("Neg", ["w"], ["t"])], "then", [],
                                    [helper.make_tensor_value_info("t", F, [None, None])])
    else_branch = helper.make_graph([helper.make_node("Sigmoid", ["w"], ["e"])], "else", [],
                                    [helper.make_tensor_value_info("e", F, [None, None])])
    outer = _body([KEEP, helper.make_node("Loop", ["M3", "", "y_in"], ["w"], body=inner),
                   helper.make_node("ReduceSum", ["w"], ["total"], keepdims=0),
                   helper.make_node("Greater", ["total", "zero"], ["positive"]),
                   helper.make_node("If", ["positive"], ["y_out"], then_branch=then_branch, else_branch=else_branch)],
                  ["y"], inits=[_const("M3", np.int64(3)), _const("zero", np.float32(0))])
    return _model([helper.make_node("Loop", ["M", "", "x"], ["y"], body=outer)], [X],
                  [helper.make_tensor_value_info("y", F, [None, None])], [_const("M", np.int64(4))])


@pytest.fixture(autouse=True)
def _always_planned(monkeypatch):
    """These models are too small for any cut to save memory, so the cost model would run them as
    one plain session; the planner's Loop runner is what these tests check, so it always plans."""
    monkeypatch.setattr(cpu_planned, "plan_profile", lambda: {"cost_model": False})


def _loop_runners(engine: Engine) -> list[LoopRunner]:
    executor = engine._executor
    assert isinstance(executor, PlannedExecutor)
    return [r for r in executor.branch_runners.values() if isinstance(r, LoopRunner)]


def _check(model: onnx.ModelProto, feeds_list: list[dict]) -> tuple[Engine, list[dict]]:
    engine = Engine(model, backend="cpu", threads=1)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    outputs = []
    for feeds in feeds_list:
        got = engine.run(feeds)
        expected = session.run(None, feeds)
        for out, value in zip(session.get_outputs(), expected):
            assert got[out.name].shape == value.shape, f"{out.name}: {got[out.name].shape} != {value.shape}"
            np.testing.assert_allclose(got[out.name], value, rtol=RTOL, atol=ATOL, err_msg=out.name)
        outputs.append(got)
    return engine, outputs


def _x(rows: int, cols: int, seed: int = 0, scale: float = 1.0) -> dict:
    return {"x": (np.random.default_rng(seed).standard_normal((rows, cols)) * scale).astype(np.float32)}


# Inputs above PlannerOptions.small_bytes (64 KiB): smaller loops go to onnxruntime's Loop.
SHAPES = {fixed_trips: [(256, 128), (300, 96), (256, 128)], growing: [(256, 128), (300, 96), (256, 128)],
          scanning: [(4096, 5), (6000, 3), (4096, 5)], outer_scope: [(512, 64), (300, 64), (512, 64)]}


@pytest.mark.parametrize("build", list(SHAPES), ids=lambda f: f.__name__)
def test_loop_equals_onnxruntime_across_shapes(build):
    shapes = SHAPES[build]
    engine, _ = _check(build(), [_x(r, c, seed=k) for k, (r, c) in enumerate(shapes)])
    try:
        runners = _loop_runners(engine)
        assert len(runners) == 1, "the Loop must run through LoopRunner, not onnxruntime's Loop"
        trips = [c for _, c in shapes] if build is scanning else [{fixed_trips: 4}.get(build, 3)] * len(shapes)
        assert runners[0].stats.runs == len(shapes) and runners[0].stats.onnxruntime_runs == 0
        assert runners[0].stats.iterations == sum(trips)
    finally:
        engine.close()


def test_small_loop_runs_through_onnxruntime_loop():
    engine, _ = _check(fixed_trips(), [_x(5, 3), _x(17, 8)])
    try:
        stats = _loop_runners(engine)[0].stats
        assert (stats.onnxruntime_runs, stats.runs) == (2, 0)
        engine.run(_x(256, 128))  # the same Loop over bigger tensors: its body's plans
        assert (stats.onnxruntime_runs, stats.runs, stats.iterations) == (2, 1, 4)
    finally:
        engine.close()


def test_nested_loop_and_if_in_a_loop_body_are_planned_too():
    engine, _ = _check(nested(), [_x(256, 128), _x(300, 96, seed=1)])
    try:
        outer = _loop_runners(engine)[0]
        inner = [r for r in outer.executor.branch_runners.values() if isinstance(r, LoopRunner)]
        assert outer.stats.iterations == 2 * 4 and len(inner) == 1 and inner[0].stats.iterations == 2 * 4 * 3
        assert len(outer.executor.branch_runners) == 2  # the inner Loop and the If
    finally:
        engine.close()


def test_cond_terminated_loop_runs_data_dependent_iterations():
    # max(x) around 1: several doublings; scaled by 1e3: no iteration at all (scan output (0,))
    feeds = [_x(128, 200, scale=1.0), _x(100, 300, seed=1, scale=0.01), _x(128, 200, scale=1e3),
             _x(120, 250, seed=2, scale=30.0)]
    engine, outputs = _check(until(), feeds)
    try:
        runner = _loop_runners(engine)[0]
        counts = [len(o["peaks"]) for o in outputs]
        assert counts[2] == 0 and outputs[2]["peaks"].shape == (0,)
        assert min(counts[:2]) > 1 and counts[1] > counts[0]
        assert runner.stats.iterations == sum(counts)
    finally:
        engine.close()


def test_growing_carried_tensor_gets_one_cached_plan_per_iteration_shape():
    engine, _ = _check(growing(), [_x(256, 128)])
    try:
        runner = _loop_runners(engine)[0]
        body = runner.executor
        seen = {p.signature: p for p in body.plans.values()}
        acc_rows = sorted(dict(sig)["acc_in"][0] for sig in seen if dict(sig).get("acc_in", (0,))[1:] == (128,))
        assert {256, 512, 768} <= set(acc_rows)  # one plan per iteration's shape
        count = len(body.plans)
        engine.run(_x(256, 128, seed=7))  # same shapes again: no new plan, the very same Plan objects
        assert len(body.plans) == count
        for signature, plan in seen.items():
            assert body.plan_for(dict(signature)) is plan
        engine.run(_x(300, 128))  # a new input shape: new per-iteration plans
        assert len(body.plans) > count
    finally:
        engine.close()


def test_outputs_survive_the_next_run():
    """Carried values ping-pong through reused buffers: results handed out must not alias them."""
    engine = Engine(growing(), backend="cpu", threads=1)
    try:
        first = engine.run(_x(256, 128, seed=1))
        kept = {k: v.copy() for k, v in first.items()}
        engine.run(_x(256, 128, seed=2))
        for name, value in kept.items():
            np.testing.assert_array_equal(first[name], value)
        # dropped results give their buffer back: the next run writes its results into it
        address = first["acc"].ctypes.data
        del first
        assert engine.run(_x(256, 128, seed=3))["acc"].ctypes.data == address
    finally:
        engine.close()


def test_unplannable_body_falls_back_to_onnxruntime_loop():
    # the carried value's rank is unknown (Reshape to a runtime-length shape), and the body says none
    model = fixed_trips()
    body = model.graph.node[0].attribute[0].g
    body.input[2].type.tensor_type.ClearField("shape")
    model.graph.input.append(helper.make_tensor_value_info("target", I64, ["K"]))
    model.graph.node.insert(0, helper.make_node("Reshape", ["x", "target"], ["start"]))
    model.graph.node[1].input[2] = "start"
    model.graph.output[0].type.tensor_type.ClearField("shape")
    model.graph.output[0].type.tensor_type.shape.SetInParent()  # rank unknown, shape present
    feeds = [{**_x(5, 3), "target": np.array([3, 5], np.int64)}, {**_x(6, 2), "target": np.array([2, 2, 3], np.int64)}]
    engine, _ = _check(model, feeds)
    try:
        assert _loop_runners(engine) == []
    finally:
        engine.close()
    executor = PlannedExecutor.from_model(growing(), PlannerOptions(threads=1, plan_branches=False, cost_model=False))
    try:
        assert executor.branch_runners == {}
        feeds = _x(5, 3)
        session = ort.InferenceSession(growing().SerializeToString(), providers=["CPUExecutionProvider"])
        expected = session.run(None, feeds)
        np.testing.assert_allclose(executor.run(feeds)["acc"], expected[0], rtol=RTOL, atol=ATOL)
    finally:
        executor.close()
