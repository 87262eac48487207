"""compile_plan: planning as a pure function of the model and the options; the executor runs its Plan."""
from __future__ import annotations

import dataclasses

import numpy as np
import onnxruntime as ort
import pytest

from dynnet_ros.engine.backends import cpu_planned
from dynnet_ros.engine.modelio.models import load_model
from dynnet_ros.engine.plan.compile import Plan, compile_plan
from dynnet_ros.engine.plan.options import PlannerOptions
from dynnet_ros.engine.runtime.executor import NothingToSave, PlannedExecutor
from dynnet_ros.engine.runtime.ort_executor import OrtExecutor
from dynnet_ros.zoo import ensure_model, example_inputs


@pytest.fixture(scope="module")
def lane():
    return load_model(str(ensure_model("lane")))


def _options() -> PlannerOptions:
    return PlannerOptions(threads=1, versions=False)


def test_compile_plan_is_pure(lane, monkeypatch):
    created = []

    class Spy(ort.InferenceSession):
        def __init__(self, *args, **kwargs):
            created.append(args)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(ort, "InferenceSession", Spy)
    before = lane.SerializeToString()
    first, second = compile_plan(lane, _options()), compile_plan(lane, _options())
    assert created == []  # planning builds no onnxruntime session
    assert lane.SerializeToString() == before  # the model handed in is left as it was
    assert isinstance(first, Plan) and first == second
    assert first.segments and first.cut_choice is not None and not first.one_session
    other = compile_plan(lane, dataclasses.replace(_options(), granularity="coarse"))
    assert other != first  # the options are an input: another granularity, another plan
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.segments = ()  # type: ignore[misc]


def test_an_executor_built_from_a_plan_runs_like_the_model_path(lane):
    feeds = example_inputs("lane")
    plan = compile_plan(lane, _options())
    segments = plan.segments
    from_plan = PlannedExecutor(plan)
    from_model = PlannedExecutor.from_model(lane, _options())
    reference = OrtExecutor(lane, threads=1)
    try:
        assert tuple(from_plan.segments) == segments == tuple(from_model.segments)
        expected = reference.run(feeds)
        for got in (from_plan.run(feeds), from_model.run(feeds)):
            assert set(got) == set(expected)
            for name, value in expected.items():
                np.testing.assert_allclose(got[name], value, rtol=1e-4, atol=1e-5)
    finally:
        for executor in (from_plan, from_model, reference):
            executor.close()


def test_a_plan_builds_one_executor(lane):
    plan = compile_plan(lane, _options())
    executor = PlannedExecutor(plan)
    try:
        with pytest.raises(ValueError, match="compile the model again"):
            PlannedExecutor(plan)
    finally:
        executor.close()


def test_a_one_session_plan_is_a_value_the_backend_reads(lane):
    plan = compile_plan(lane, _options())
    assert plan.cut_choice is not None
    single = dataclasses.replace(plan, cut_choice=dataclasses.replace(plan.cut_choice,
                                                                        chosen=plan.cut_choice.onnxruntime))
    assert single.one_session
    with pytest.raises(NothingToSave):
        PlannedExecutor(single)  # an executor has no segments to run for it
    executor = cpu_planned._run(lane, 1, single)  # the backend runs one plain session instead
    try:
        assert isinstance(executor, OrtExecutor)
    finally:
        executor.close()
