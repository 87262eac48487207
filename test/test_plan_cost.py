"""The planner's cut choice (plan/cost_model.py): synthetic cost tables in, expected cut sets out.

No clock is read here: every table is given, so each decision follows from the arithmetic alone.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from dynnet_ros.engine.backends.cpu_planned import create_planned_executor
from dynnet_ros.engine.plan.cost_model import (
    CostTable,
    CutPoint,
    ModelFacts,
    NodeCost,
    choose,
    evaluate,
    merge_curve,
    onnxruntime_activation,
    single_session,
)
from dynnet_ros.engine.runtime.executor import PlannedExecutor
from dynnet_ros.engine.runtime.ort_executor import OrtExecutor

MB = 1 << 20
KB = 1 << 10


def table(run_s: float = 1e-4, fault_s_per_mb: float = 1e-3, arena_factor: float = 3.0) -> CostTable:
    return CostTable(run_overhead_s=run_s, fault_s_per_mb=fault_s_per_mb, mac_s=1e-10, byte_s=1e-10,
                     ort_arena_factor=arena_factor)


def chain(sizes: list[int]) -> ModelFacts:
    """x -> n0 -> t0 -> n1 -> t1 ... : node k reads t(k-1) (x for k = 0) and writes t(k)."""
    nodes = [NodeCost(("x",) if k == 0 else (f"t{k - 1}",), (f"t{k}",), moved_bytes=size)
             for k, size in enumerate(sizes)]
    return ModelFacts(nodes, {f"t{k}": s for k, s in enumerate(sizes)}, frozenset({f"t{len(sizes) - 1}"}))


def test_a_chain_of_small_tensors_merges_into_one_segment():
    # every crossing is below the mmap threshold: a cut saves no memory and costs a Run
    facts = chain([8 * KB] * 6)
    curve = merge_curve(facts, table(), [[k] for k in range(6)])
    assert [len(p.groups) for p in curve] == [6, 5, 4, 3, 2, 1]
    assert all(b.latency_s < a.latency_s for a, b in zip(curve, curve[1:]))
    assert all(b.activation_bytes <= a.activation_bytes for a, b in zip(curve, curve[1:]))


def test_cuts_at_big_tensors_stay_when_page_faults_cost_more_than_a_run():
    # 4 MB tensors between the nodes: inside a segment each is faulted in on every run
    facts = chain([4 * MB, 4 * MB, 4 * MB])
    curve = merge_curve(facts, table(run_s=1e-4, fault_s_per_mb=1e-3), [[0], [1], [2]])
    assert len(curve) == 1 and len(curve[0].groups) == 3


def test_cheap_faults_and_a_costly_run_merge_big_tensors_too():
    facts = chain([4 * MB, 4 * MB, 4 * MB])
    curve = merge_curve(facts, table(run_s=1e-2, fault_s_per_mb=1e-6), [[0], [1], [2]])
    assert len(curve[-1].groups) == 1
    # merging hides the 4 MB tensors from the arena: the curve trades memory for time
    assert curve[-1].activation_bytes > curve[0].activation_bytes
    assert curve[-1].latency_s < curve[0].latency_s


def test_fixed_segments_and_the_weight_cap_are_never_merged():
    facts = chain([8 * KB] * 4)
    curve = merge_curve(facts, table(), [[0], [1], [2], [3]], mergeable=lambda s: s != 2)
    assert curve[-1].groups == ((0, 1), (2,), (3,))
    capped = ModelFacts(facts.nodes, facts.sizes, facts.graph_outputs, weights={0: 600, 1: 600, 2: 600, 3: 600},
                        max_segment_weight_bytes=1000)
    assert all(len(g) == 1 for g in merge_curve(capped, table(), [[0], [1], [2], [3]])[-1].groups)


def test_activation_prediction_counts_boundary_and_internal_tensors():
    facts = chain([1 * MB, 2 * MB, 1 * MB])
    cut = evaluate(facts, table(), [[0], [1], [2]])
    one = evaluate(facts, table(), [[0, 1, 2]])
    # cut: the arena holds t0+t1, then t1+t2 (3 MB at most); one segment: t0+t1 inside it (3 MB)
    # while the graph output t2 (1 MB) is the caller's array, added on top (an upper bound)
    assert cut.activation_bytes == 3 * MB + 3 * facts.session_bytes
    assert one.activation_bytes == 1 * MB + 3 * MB + facts.session_bytes
    assert onnxruntime_activation(facts) == 3 * MB
    assert single_session(facts, table(arena_factor=2.0)).activation_bytes == 6 * MB + facts.session_bytes


def point(segments: int, latency_ms: float, activation_mb: float) -> CutPoint:
    return CutPoint(tuple((k,) for k in range(segments)), latency_ms / 1e3, int(activation_mb * MB))


ORT = CutPoint(((0,),), 0.010, 100 * MB, single_session=True)


def test_choice_takes_the_fastest_point_within_the_memory_target():
    curve = [point(30, 14.0, 40), point(20, 12.0, 55), point(10, 11.0, 70)]
    choice = choose(curve, ORT, memory_target=0.6)
    assert choice.chosen == curve[1] and not choice.fallback
    assert choose(curve, ORT, memory_target=0.8).chosen == curve[2]


def test_choice_without_a_point_in_the_target_takes_the_leanest():
    curve = [point(30, 14.0, 75), point(20, 12.0, 85)]
    choice = choose(curve, ORT, memory_target=0.6)
    assert choice.chosen == curve[0] and "no cut set reaches" in choice.reason


def test_nothing_to_save_falls_back_to_one_session():
    curve = [point(30, 14.0, 95), point(10, 11.0, 120)]
    choice = choose(curve, ORT, memory_target=0.6, fallback_min_saving=0.1)
    assert choice.fallback and choice.chosen is ORT
    assert "one onnxruntime session" in choice.reason and "0.95x" in choice.reason
    unsized = choose([point(30, 14.0, 0)], ORT, sized=False)
    assert unsized.fallback and "no tensor of the graph has a known size" in unsized.reason


LEAN = CutPoint(((0,),), 0.010, 60 * MB, single_session=True, lean=True)


def test_a_cut_set_must_save_against_the_lean_session_it_would_replace():
    saves_against_ort_only = [point(30, 14.0, 58), point(10, 11.0, 80)]
    choice = choose(saves_against_ort_only, ORT, session=LEAN, fallback_min_saving=0.1)
    assert choice.fallback and choice.chosen is LEAN and choice.session is LEAN
    assert choice.reason.startswith("one lean onnxruntime session: the leanest cut set would hold 0.58x")
    assert "one lean onnxruntime session 0.60x" in choice.reason
    assert choice.curve[-2:] == (ORT, LEAN)  # both single sessions on the curve, for `dynnet plan`
    saves_against_lean = [point(30, 14.0, 40), point(10, 11.0, 80)]
    kept = choose(saves_against_lean, ORT, session=LEAN, memory_target=0.6)
    assert kept.chosen == saves_against_lean[0] and "(0.40x, 30 segments)" in kept.reason


def test_the_lean_session_does_not_compete_within_the_memory_target():
    """Its figure is a factor measured on a small model, a cut set's is planned: within the target
    the cut sets are weighed, and the "auto" profile times the pick (cut_timing.py)."""
    curve = [point(30, 14.0, 40)]
    lean_within = CutPoint(((0,),), 0.001, 50 * MB, single_session=True, lean=True)
    assert choose(curve, ORT, session=lean_within, memory_target=0.6).chosen == curve[0]


def test_a_lean_session_that_saves_too_little_is_not_the_fallback():
    """It allocates every tensor on every run: where it holds about what onnxruntime's defaults
    hold, the fallback is onnxruntime's defaults, and a cut set must save against those."""
    lean_equal = CutPoint(((0,),), 0.010, 95 * MB, single_session=True, lean=True)
    choice = choose([point(30, 14.0, 95)], ORT, session=lean_equal, fallback_min_saving=0.1)
    assert choice.fallback and choice.chosen is ORT and choice.session is ORT and not choice.chosen.lean
    assert choice.reason.startswith("one onnxruntime session: ") and lean_equal not in choice.curve
    cuts = [point(30, 14.0, 85)]  # saves 15% against onnxruntime, and so against no lean session
    assert choose(cuts, ORT, session=lean_equal, fallback_min_saving=0.1).chosen == cuts[0]


def test_a_table_without_a_lean_factor_predicts_the_lean_session_as_onnxruntimes():
    facts = chain([4 * MB, 4 * MB])
    given = table(arena_factor=3.0)
    assert single_session(facts, given, lean=True).activation_bytes == single_session(facts, given).activation_bytes
    measured = replace(given, lean_arena_factor=1.5)
    lean = single_session(facts, measured, lean=True)
    assert lean.lean and lean.activation_bytes < single_session(facts, measured).activation_bytes


def test_choice_rejects_bad_knobs():
    with pytest.raises(ValueError):
        choose([point(3, 1.0, 1.0)], ORT, memory_target=0.0)
    with pytest.raises(ValueError):
        choose([point(3, 1.0, 1.0)], ORT, fallback_min_saving=1.0)
    with pytest.raises(ValueError):
        choose([], ORT)


def _attention_model(tokens: int = 64, width: int = 32) -> onnx.ModelProto:
    """Self-attention over a sequence: its [L, L] scores are the peak in any order or cut."""
    rng = np.random.default_rng(0)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["L", width])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["L", width])
    weights = [helper.make_tensor(n, TensorProto.FLOAT, [width, width],
                                  (rng.standard_normal(width * width) * 0.1).astype(np.float32))
               for n in ("wq", "wk", "wv")]
    nodes = [helper.make_node("MatMul", ["x", "wq"], ["q"]), helper.make_node("MatMul", ["x", "wk"], ["k"]),
             helper.make_node("MatMul", ["x", "wv"], ["v"]), helper.make_node("Transpose", ["k"], ["kt"]),
             helper.make_node("MatMul", ["q", "kt"], ["s"]), helper.make_node("Softmax", ["s"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["y"])]
    model = helper.make_model(helper.make_graph(nodes, "attention", [x], [y], weights),
                              opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return model


def test_a_model_with_nothing_to_save_runs_as_one_onnxruntime_session_and_says_so():
    model = _attention_model()
    # onnxruntime's arena holding exactly what is live (factor 1): no cut set can hold less; the
    # lean session, predicted at half of that, is the fallback
    lean_table = replace(table(arena_factor=1.0), lean_arena_factor=0.5)
    executor = create_planned_executor(model, layout="as-given", cost_table=lean_table)
    try:
        assert isinstance(executor, OrtExecutor) and executor.lean
        plan = executor.executor_stats().details["plan"]
        assert plan["fallback"] and plan["reason"].startswith("one lean onnxruntime session: ")
        assert plan["lean"] is True
        assert plan["cuts"]["curve"][-1]["single_session"] and plan["cuts"]["curve"][-1]["lean"]
        feeds = {"x": np.random.default_rng(1).standard_normal((100, 32)).astype(np.float32)}
        reference = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        np.testing.assert_allclose(executor.run(feeds)["y"], reference.run(None, feeds)[0], rtol=1e-5, atol=1e-6)
    finally:
        executor.close()


def test_without_a_predicted_saving_the_one_session_keeps_onnxruntimes_defaults():
    # no lean factor measured: the lean session is predicted to hold what onnxruntime holds
    executor = create_planned_executor(_attention_model(), layout="as-given", cost_table=table(arena_factor=1.0))
    try:
        assert isinstance(executor, OrtExecutor) and not executor.lean
        plan = executor.executor_stats().details["plan"]
        assert plan["fallback"] and plan["reason"].startswith("one onnxruntime session: ")
        assert plan["lean"] is False and not any(p["lean"] for p in plan["cuts"]["curve"])
    finally:
        executor.close()


def test_the_same_model_is_planned_where_onnxruntime_would_hold_more():
    model = _attention_model()
    executor = create_planned_executor(model, layout="as-given", cost_table=table(arena_factor=4.0))
    try:
        assert isinstance(executor, PlannedExecutor)
        cuts = executor.executor_stats().details["plan"]["cuts"]
        assert not cuts["fallback"] and cuts["curve"][cuts["chosen"]]["segments"] == len(executor.segments)
        feeds = {"x": np.random.default_rng(2).standard_normal((80, 32)).astype(np.float32)}
        reference = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        np.testing.assert_allclose(executor.run(feeds)["y"], reference.run(None, feeds)[0], rtol=1e-5, atol=1e-6)
    finally:
        executor.close()
