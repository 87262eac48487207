"""The planned CPU engine (engine/plan): equal outputs, plan cache, zero-copy arena, constraints."""
from __future__ import annotations

import glob
import json
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from dynnet_ros.commands.bench import make_feeds
from dynnet_ros.engine import Engine
from dynnet_ros.engine.backends.registry import load_for_backend
from dynnet_ros.engine.modelio.models import input_specs, load_model
from dynnet_ros.engine.modelio.ort_features import ort_features
from dynnet_ros.engine.plan.compile import reference_shapes
from dynnet_ros.engine.plan.graph import GraphIndex
from dynnet_ros.engine.plan.options import PlannerOptions
from dynnet_ros.engine.plan.simplify import simplify
from dynnet_ros.engine.runtime.control_flow import IfRunner
from dynnet_ros.engine.runtime.executor import PlannedExecutor
from dynnet_ros.zoo import MODEL_NAMES, ensure_model

RTOL, ATOL = 1e-3, 1e-4
SHAPES = [(224, 224), (480, 640), (352, 288)]


def _reference(path: str) -> ort.InferenceSession:
    return ort.InferenceSession(path, providers=["CPUExecutionProvider"])


def _assert_same(ours: dict, session: ort.InferenceSession, feeds: dict, what: str) -> None:
    expected = session.run(None, feeds)
    for out, value in zip(session.get_outputs(), expected):
        got = ours[out.name]
        assert got.shape == value.shape, f"{what}: {out.name} shape {got.shape} != {value.shape}"
        np.testing.assert_allclose(got, value, rtol=RTOL, atol=ATOL, err_msg=f"{what}: {out.name}")


@pytest.fixture(scope="module")
def engines():
    """One planned Engine per zoo model (building sessions is the slow part)."""
    made = {name: Engine(str(ensure_model(name)), threads=1) for name in MODEL_NAMES}
    yield made
    for engine in made.values():
        engine.close()


@pytest.mark.subset
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_zoo_outputs_equal_onnxruntime_across_shapes(engines, name):
    engine = engines[name]
    assert engine.stats()["executor"] == "cpu-planned"
    session = _reference(str(ensure_model(name)))
    rng = np.random.default_rng(1)
    for height, width in SHAPES + [SHAPES[0]]:  # revisiting a shape reuses its cached plan
        feeds = make_feeds(engine.inputs, height, width, rng)
        _assert_same(engine.run(feeds), session, feeds, f"{name} at {height}x{width}")
    stats = engine.stats()
    assert stats["arena_bytes"] > 0
    assert stats["plan"]["cache"]["hits"] >= 1
    assert stats["shape_signature"]["image"] == [1, 3, SHAPES[0][0], SHAPES[0][1]]


def _gate_values(path: str, feeds: dict) -> np.ndarray:
    model = onnx.load(path)
    gates = next(n.output[0] for n in model.graph.node if n.op_type == "Greater")
    model.graph.output.append(helper.make_tensor_value_info(gates, TensorProto.BOOL, None))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run([gates], feeds)[0]


def test_gated_runs_both_if_branches(engines):
    path = str(ensure_model("gated"))
    engine, session = engines["gated"], _reference(path)
    seen = []
    for fill in (0.0, 1.0):
        feeds = {"image": np.full((1, 3, 256, 320), fill, dtype=np.float32)}
        seen.append(_gate_values(path, feeds).ravel())
        _assert_same(engine.run(feeds), session, feeds, f"gated, image filled with {fill}")
    seen = np.stack(seen)
    assert seen.any(axis=0).all() and (~seen).any(axis=0).all(), f"each If must take both branches: {seen}"


def test_if_runs_only_the_taken_branch_through_its_own_plan():
    path = str(ensure_model("gated"))
    executor = PlannedExecutor.from_model(load_for_backend("cpu", path), PlannerOptions(threads=1, versions=False))
    try:
        if_runners = [r for r in executor.branch_runners.values() if isinstance(r, IfRunner)]
        assert len(if_runners) == 4
        feeds = {"image": np.zeros((1, 3, 224, 256), dtype=np.float32)}
        gates = _gate_values(path, feeds).ravel()
        _assert_same(executor.run(feeds), _reference(path), feeds, "gated through branch plans")
        for gate, runner in zip(gates, if_runners):
            taken, skipped = runner.branches[bool(gate)][0], runner.branches[not bool(gate)][0]
            assert taken.last_plan is not None and skipped.last_plan is None
            assert taken.arena is skipped.arena  # one arena for all branches
    finally:
        executor.close()


def test_bad_shape_names_the_constraint_and_engine_stays_usable(engines):
    engine = engines["lane"]
    with pytest.raises(ValueError, match="requirement|must|Concat"):
        engine.run({"image": np.zeros((1, 3, 100, 130), dtype=np.float32)})
    feeds = {"image": np.random.default_rng(0).random((1, 3, 224, 256), dtype=np.float32)}
    _assert_same(engine.run(feeds), _reference(str(ensure_model("lane"))), feeds, "lane after a bad shape")


def test_plan_cache_returns_same_plan_and_is_bounded():
    executor = PlannedExecutor.from_model(load_model(str(ensure_model("multiexit"))),
                                          PlannerOptions(threads=1, plan_cache_size=2, versions=False))
    try:
        a = executor.plan_for({"image": (1, 3, 224, 224)})
        assert executor.plan_for({"image": (1, 3, 224, 224)}) is a
        executor.plan_for({"image": (1, 3, 256, 256)})
        executor.plan_for({"image": (1, 3, 288, 288)})
        assert len(executor.plans) == 2 and executor.plans.evictions >= 1
        assert executor.plan_for({"image": (1, 3, 224, 224)}) is not a  # evicted, rebuilt
        plan = executor.plan_for({"image": (1, 3, 480, 640)})
        assert plan.lower_bound <= plan.height
        buffers = executor.plan_buffers(plan)  # one per buffer: in-place outputs share their root's
        offsets = {n: s.offset for n, s in plan.slots.items() if s.offset is not None}
        slots = [s for s in plan.slots.values() if s.offset is not None and s.alias_of is None]
        assert len(buffers) == len(slots)
        for (s1, e1, b1), x in zip(buffers, slots):  # planner validity on a real plan
            for (s2, e2, b2), y in zip(buffers, slots):
                if x is not y and s1 < e2 and s2 < e1:
                    assert offsets[x.name] + b1 <= offsets[y.name] or offsets[y.name] + b2 <= offsets[x.name]
    finally:
        executor.close()


def test_boundary_tensors_live_in_the_arena_without_copies():
    path = str(ensure_model("lane"))
    executor = PlannedExecutor.from_model(load_model(path), PlannerOptions(threads=1, versions=False))
    try:
        feeds = {"image": np.random.default_rng(2).random((1, 3, 224, 288), dtype=np.float32)}
        executor.run(feeds)
        plan = executor.last_plan
        planned = [s for s in plan.slots.values() if s.offset is not None]
        assert planned, "no boundary tensor was planned into the arena"
        # every output onnxruntime produced for a planned tensor sits at its arena offset
        for runner, io in zip(plan.runners, plan.bindings):
            if io is None:  # run by its own runner (the banded stem writes into the arena itself)
                continue
            for name, value in zip(runner.segment.outputs, io.get_outputs()):
                slot = plan.slots[name]
                if slot.offset is not None:
                    assert value.data_ptr() == executor.arena.address(slot.offset), name
        # and the arena holds the right values: compare an intermediate whose bytes no later tensor
        # reused (the arena recycles memory) with onnxruntime's value for it
        def intact(x):
            size = int(np.prod(x.shape)) * x.dtype.itemsize
            overwritten = any(y.alias_of in (x.name, x.alias_of) and y is not x and y.lifetime[0] >= x.lifetime[0]
                              for y in planned if y.alias_of)  # written over in place
            return not overwritten and not any(
                y.lifetime[0] >= x.lifetime[1] and y.offset < x.offset + size
                and x.offset < y.offset + int(np.prod(y.shape)) * y.dtype.itemsize for y in planned)
        slot = max((s for s in planned if intact(s)), key=lambda s: int(np.prod(s.shape)))
        model = onnx.load(path)
        model.graph.output.append(helper.make_tensor_value_info(slot.name, TensorProto.FLOAT, None))
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        expected = session.run([slot.name], feeds)[0]
        view = executor.arena_tensor(slot.name)
        assert executor.arena.contains(view.ctypes.data)
        np.testing.assert_allclose(view, expected, rtol=RTOL, atol=ATOL)
    finally:
        executor.close()


def test_kernel_versions_build_in_background_and_stay_correct():
    path = str(ensure_model("gated"))  # weights read from the file: versions can load their own copies
    executor = PlannedExecutor.from_model(load_for_backend("cpu", path),
                                          PlannerOptions(threads=1, hot_after=2, version_budget_mb=64))
    try:
        feeds = {"image": np.random.default_rng(3).random((1, 3, 224, 224), dtype=np.float32)}
        for _ in range(2):
            executor.run(feeds)  # the second use schedules a build; neither run waits for it
        executor.versions.wait(timeout=120)
        out = executor.run(feeds)  # installs and uses the specialised version
        assert executor.versions.stats()["built"] == 1
        assert executor.last_plan.bound_version is not None
        _assert_same(out, _reference(path), feeds, "gated with a specialised version")
        other = {"image": np.random.default_rng(4).random((1, 3, 256, 224), dtype=np.float32)}
        _assert_same(executor.run(other), _reference(path), other, "gated, generic plan, new shape")
    finally:
        executor.close()


def _shape_chain_model() -> onnx.ModelProto:
    """x[1,C,H,W] -> Relu -> Reshape(to [1, C, H*W] via Shape/Gather/Concat) -> Identity -> Cast(float)."""
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Shape", ["r"], ["s"]),
        helper.make_node("Gather", ["s", "i1"], ["c"], axis=0),
        helper.make_node("Concat", ["one", "c", "minus1"], ["target"], axis=0),
        helper.make_node("Reshape", ["r", "target"], ["flat"]),
        helper.make_node("Identity", ["flat"], ["flat2"]),
        helper.make_node("Cast", ["flat2"], ["y"], to=TensorProto.FLOAT),
    ]
    inits = [numpy_helper.from_array(np.array([1], np.int64), "i1"),
             numpy_helper.from_array(np.array([1], np.int64), "one"),
             numpy_helper.from_array(np.array([-1], np.int64), "minus1")]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, "H", "W"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, None])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return model


def test_simplify_folds_shape_chains_and_noops_and_keeps_outputs():
    model = _shape_chain_model()
    simplified, report = simplify(model)
    ops = [n.op_type for n in simplified.graph.node]
    assert "Shape" not in ops and "Gather" not in ops and "Concat" not in ops, ops
    assert "Identity" not in ops and "Cast" not in ops, ops
    assert report.nodes_after < report.nodes_before
    x = np.random.default_rng(5).standard_normal((1, 8, 6, 10)).astype(np.float32)
    a = _reference_bytes(model).run(None, {"x": x})[0]
    b = _reference_bytes(simplified).run(None, {"x": x})[0]
    np.testing.assert_array_equal(a, b)


def _reference_bytes(model: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def test_simplify_fuses_conv_add_relu_when_shapes_are_proven():
    model = onnx.load(str(ensure_model("multiexit")))
    simplified, report = simplify(model)
    assert report.fused.get("conv_add_relu", 0) + report.fused.get("conv_add", 0) >= 1
    assert any(n.op_type == "FusedConv" for n in simplified.graph.node)
    feeds = {"image": np.random.default_rng(6).random((1, 3, 224, 256), dtype=np.float32)}
    options = ort.SessionOptions()
    if not ort_features().nchwc_fused_conv_sum:
        # this onnxruntime's NCHWc rewrite drops a FusedConv's sum input; segments.py runs such
        # graphs at EXTENDED, and so does this check
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    fused = ort.InferenceSession(simplified.SerializeToString(), sess_options=options,
                                 providers=["CPUExecutionProvider"])
    for a, b in zip(_reference_bytes(model).run(None, feeds), fused.run(None, feeds)):
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL)


LIGHT = sorted(glob.glob(os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light",
                                      "light_*.onnx")))
LIGHT_FAST = [p for p in LIGHT if os.path.basename(p) in ("light_squeezenet.onnx", "light_inception_v1.onnx",
                                                          "light_shufflenet.onnx")]


@pytest.mark.skipif(not LIGHT_FAST, reason="this onnx build ships no light models")
@pytest.mark.parametrize("path", LIGHT_FAST, ids=os.path.basename)
def test_onnx_light_models_match_onnxruntime(path):
    engine = Engine(onnx.load(path), threads=1)
    try:
        spec = input_specs(engine.proto)[0]
        x = np.random.default_rng(7).random([d if isinstance(d, int) else 1 for d in spec.dims], dtype=np.float32)
        _assert_same(engine.run({spec.name: x}), _reference(path), {spec.name: x}, os.path.basename(path))
    finally:
        engine.close()


def test_plain_onnxruntime_backend_is_still_available():
    with Engine(str(ensure_model("multiexit")), backend="ort", threads=1) as engine:
        assert engine.stats()["executor"] == "cpu"
        feeds = {"image": np.zeros((1, 3, 224, 224), dtype=np.float32)}
        assert set(engine.run(feeds)) == {"exit0", "exit1", "exit2"}


def test_plan_command_reports_partitions_and_memory(tmp_path, capsys):
    from dynnet_ros.cli import main

    out = tmp_path / "plan.json"
    assert main(["plan", str(ensure_model("lane")), "--input-shape", "image=1x3x480x640", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    mem = report["memory_plan"]
    assert mem["lower_bound_bytes"] <= mem["arena_bytes"] <= mem["greedy_by_size_bytes"] or \
        mem["arena_bytes"] <= mem["greedy_by_size_bytes"]
    assert report["partitions"] and all(p["label"] in ("all-known", "mixed-symbolic", "nac")
                                        for p in report["partitions"])
    assert "arena" in capsys.readouterr().out
    assert main(["plan", str(ensure_model("lane")), "--input-shape", "image=1x3x100x130"]) == 2


@pytest.mark.slow
def test_bench_command_runs_both_sides_in_fresh_processes(tmp_path):
    from dynnet_ros.cli import main

    out, png = tmp_path / "bench.json", tmp_path / "bench.png"
    assert main(["bench", "zoo:gated", "--shapes", "224x224,256x288", "--samples", "3", "--steady-runs", "1",
                 "--threads", "1", "--json", str(out), "--plot", str(png)]) == 0
    result = json.loads(out.read_text())
    for side in ("engine", "onnxruntime"):
        assert result[side]["peak_mb"] > 0 and len(result[side]["latencies_ms"]) == 3
    assert result["engine"]["engine_stats"]["executor"] == "cpu-planned"
    assert png.stat().st_size > 1000


def _elementwise_chain_model() -> onnx.ModelProto:
    """t1 = conv(x), t2 = conv(x), t3 = t1 + t2, t4 = t3 * t2, y = conv(t4): Add and Mul each get a
    segment of their own (big tensors), t1 dies at the Add, t3 at the Mul, t2 is still read by the Mul."""
    rng = np.random.default_rng(7)
    weights = [numpy_helper.from_array(rng.standard_normal((4, 4, 3, 3)).astype(np.float32), f"w{i}")
               for i in range(3)]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["t1"], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["x", "w1"], ["t2"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["t1", "t2"], ["t3"]),
             helper.make_node("Mul", ["t3", "t2"], ["t4"]),
             helper.make_node("Conv", ["t4", "w2"], ["y"], pads=[1, 1, 1, 1])]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, "H", "W"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_elementwise_segments_write_in_place_over_dying_inputs():
    model = _elementwise_chain_model()
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {"x": np.random.default_rng(3).random((1, 4, 96, 160), dtype=np.float32)}
    heights = {}
    for in_place in (True, False):
        options = PlannerOptions(threads=1, versions=False, simplify=False, in_place=in_place)
        executor = PlannedExecutor.from_model(model, options)
        try:
            assert any(len(s.nodes) == 1 and executor.graph.nodes[s.nodes[0]].op_type == "Add"
                       for s in executor.segments), "the Add must run as its own segment for this test"
            _assert_same(executor.run(feeds), session, feeds, f"in_place={in_place}")
            plan = executor.last_plan
            aliases = {n: s.alias_of for n, s in plan.slots.items() if s.alias_of}
            if in_place:
                # t3 over t1 (t1 dies at the Add); t4 over t3's bytes, i.e. t1's; never over t2 at the Add
                assert aliases == {"t3": "t1", "t4": "t1"}
                assert plan.slots["t3"].offset == plan.slots["t4"].offset == plan.slots["t1"].offset
            else:
                assert aliases == {}
            buffers = executor.plan_buffers(plan)
            roots = [s for s in plan.slots.values() if s.offset is not None and s.alias_of is None]
            for (s1, e1, b1), x in zip(buffers, roots):  # no two live buffers overlap
                for (s2, e2, b2), y in zip(buffers, roots):
                    if x is not y and s1 < e2 and s2 < e1:
                        assert x.offset + b1 <= y.offset or y.offset + b2 <= x.offset
            heights[in_place] = plan.height
            # a second run over the same arena stays correct
            _assert_same(executor.run(feeds), session, feeds, f"in_place={in_place}, second run")
        finally:
            executor.close()
    assert heights[True] < heights[False]  # three tensors live at the Add without in-place, two with


def test_nchwc_kernels_only_for_segments_with_small_tensors():
    """Segments whose tensors stay small get onnxruntime's NCHWc level (ALL); big ones EXTENDED."""
    model = _elementwise_chain_model()  # 4x640x640 float tensors at the reference side: 6.5 MB
    for limit, level in ((2**20, ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED),
                         (2**30, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)):
        executor = PlannedExecutor.from_model(model, PlannerOptions(threads=1, versions=False, simplify=False,
                                                                    nchwc_max_bytes=limit))
        try:
            assert {executor._session_options(s).graph_optimization_level for s in executor.segments} == {level}
        finally:
            executor.close()


def test_planner_chooses_the_cheaper_granularity(engines):
    """"choose" keeps whichever of the auto/fine cuts costs less (arena lower bound at the
    reference shape + per-session overhead), and the fine cut never has a larger lower bound."""
    from dynnet_ros.engine.plan.compile import SESSION_BYTES
    from dynnet_ros.engine.plan.segmentation import cut_segments

    chosen = {}
    for name in ("multiexit", "lane"):
        executor = engines[name]._executor
        assert isinstance(executor, PlannedExecutor) and executor.options.granularity == "choose"
        costs = {}
        for granularity in ("auto", "fine"):
            segments = cut_segments(executor.graph, executor.order, executor.reference_sizes,
                                    executor.shape_source.dims, small_bytes=executor.options.small_bytes,
                                    granularity=granularity, category=executor.shape_source.category)
            costs[granularity] = executor.compiled.reference_lower_bound(segments) + SESSION_BYTES * len(segments)
            if granularity == executor.granularity:  # same cut (a banded stem merges its first segments)
                assert [n for s in segments for n in s.nodes] == [n for s in executor.segments for n in s.nodes]
        assert costs[executor.granularity] == min(costs.values())
        chosen[name] = executor.granularity
    assert chosen == {"multiexit": "fine", "lane": "auto"}  # 12.5 -> 9.4 MB lower bound vs no gain on lane


def _normalised_model(first: str) -> onnx.ModelProto:
    """``first`` (Conv, ConvTranspose or Add) -> BatchNormalization -> Relu, then a Conv, at 8 channels."""
    rng = np.random.default_rng(0)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, "H", "W"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 8, 3, 3)).astype(np.float32) * 0.1, "w"),
             numpy_helper.from_array(rng.standard_normal((8, 8, 2, 2)).astype(np.float32) * 0.1, "wt"),
             numpy_helper.from_array(rng.standard_normal((8, 8, 3, 3)).astype(np.float32) * 0.1, "w2")]
    inits += [numpy_helper.from_array(np.abs(rng.standard_normal(8)).astype(np.float32) + 0.5, n)
              for n in ("scale", "bias", "mean", "var")]
    head = {"Conv": helper.make_node("Conv", ["x", "w"], ["a"], pads=[1, 1, 1, 1]),
            "ConvTranspose": helper.make_node("ConvTranspose", ["x", "wt"], ["a"], strides=[2, 2]),
            "Add": helper.make_node("Add", ["x", "x"], ["a"])}[first]
    nodes = [head, helper.make_node("BatchNormalization", ["a", "scale", "bias", "mean", "var"], ["n"]),
             helper.make_node("Relu", ["n"], ["r"]), helper.make_node("Conv", ["r", "w2"], ["y"], pads=[1, 1, 1, 1])]
    model = helper.make_model(helper.make_graph(nodes, "normalised", [x], [y], inits),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("first, together", [("Conv", ["Conv", "BatchNormalization", "Relu"]),
                                             ("ConvTranspose", ["ConvTranspose", "BatchNormalization"]),
                                             ("Add", [])])
def test_only_pairs_onnxruntime_fuses_share_a_segment(first, together):
    """A BatchNormalization's activation joins it only after a Conv that folds it (onnxruntime has no
    BN+activation kernel, nor ConvTranspose+activation): elsewhere the intermediate would be a big
    tensor allocated inside the segment on every run, where a cut puts it in the arena."""
    model = _normalised_model(first)
    executor = PlannedExecutor.from_model(model, PlannerOptions(threads=1, granularity="fine", simplify=False,
                                                                cost_model=False, stem_bands=0))
    try:
        groups = [[executor.graph.nodes[n].op_type for n in s.nodes] for s in executor.segments]
        shared = [g for g in groups if len(g) > 1]
        assert shared == ([together] if together else []), groups
        feeds = {"x": np.random.default_rng(1).standard_normal((1, 8, 24, 32)).astype(np.float32)}
        expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
        np.testing.assert_allclose(executor.run(feeds)["y"], expected[0], rtol=1e-4, atol=1e-5)
    finally:
        executor.close()


def test_reference_shapes_size_a_batch_of_one_however_the_exporter_names_it():
    """The planner weighs cuts at one image: a first dim of a rank >= 3 input is the batch whatever
    its name (paddle2onnx writes ``p2o.DynamicDimension.0``); other dynamic dims at the side."""
    inputs = [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["p2o.DynamicDimension.0", 3, "h", "w"]),
              helper.make_tensor_value_info("tokens", TensorProto.INT64, ["length", "width"]),
              helper.make_tensor_value_info("audio", TensorProto.FLOAT, ["batch", "samples"]),
              helper.make_tensor_value_info("legacy", TensorProto.FLOAT, [-1, 3, 8]),
              helper.make_tensor_value_info("series", TensorProto.FLOAT, ["time"])]
    nodes = [helper.make_node("Identity", [i.name], [f"{i.name}_out"]) for i in inputs]
    outputs = [helper.make_tensor_value_info(f"{i.name}_out", i.type.tensor_type.elem_type, None) for i in inputs]
    model = helper.make_model(helper.make_graph(nodes, "inputs", inputs, outputs),
                              opset_imports=[helper.make_opsetid("", 17)])
    assert reference_shapes(GraphIndex.build(model), 640) == {
        "image": (1, 3, 640, 640), "tokens": (640, 640), "audio": (1, 640), "legacy": (1, 3, 8), "series": (640,)}
