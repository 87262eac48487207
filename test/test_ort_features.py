"""onnxruntime features probed at run time (engine/modelio/ort_features.py) and the fallbacks they pick.

The probes run against the installed runtime; ``ort_features.override`` then forces each
fallback on a runtime that does not need it, so every branch runs on every supported version
(`make PYTHON=python3.10 ORT=1.17 test-subset` runs them on the oldest).
"""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from _swap_models import check_equal

from dynnet_ros.commands.swap_bench_worker import make_feeds
from dynnet_ros.engine import Engine
from dynnet_ros.engine.backends.cpu_planned import create_planned_executor
from dynnet_ros.engine.modelio.loader import external_data_dir, load_skeleton
from dynnet_ros.engine.modelio.ort_features import EXTERNAL_FOLDER_KEY, ort_features, override, probe
from dynnet_ros.engine.plan.options import PlannerOptions
from dynnet_ros.engine.runtime.executor import PlannedExecutor
from dynnet_ros.engine.runtime.segments import has_fused_sum
from dynnet_ros.zoo import ensure_model

pytestmark = pytest.mark.subset
ALL = ort.GraphOptimizationLevel.ORT_ENABLE_ALL


@pytest.fixture(autouse=True)
def isolated(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("DYNNET_SWAP_DIR", str(tmp_path_factory.getbasetemp() / "swap-stores"))


def _reference(name: str, height: int, width: int):
    path = str(ensure_model(name))
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    feeds = make_feeds(Engine(path, backend="ort").inputs, height, width, seed=4)
    return path, feeds, session.run(names, feeds), names


def _as_given(path: str) -> PlannedExecutor:
    """The model as given, as a CPU without NCHWc kernels plans it (cost model off: always cut)."""
    return PlannedExecutor.from_model(load_skeleton(path), PlannerOptions(threads=1, cost_model=False))


def test_probes_describe_this_runtime():
    features = ort_features()
    assert features.version == ort.__version__
    assert probe() == features  # deterministic: a second probe agrees
    assert set(features.to_json()) == {"version", "external_data_folder", "initializer_by_reference",
                                       "nchwc_fused_conv_sum"}


def test_external_data_probe_agrees_with_loading_a_skeleton():
    skeleton = load_skeleton(str(ensure_model("depth")))
    options = ort.SessionOptions()
    options.add_session_config_entry(EXTERNAL_FOLDER_KEY, external_data_dir(skeleton))
    try:
        ort.InferenceSession(skeleton.SerializeToString(), options, providers=["CPUExecutionProvider"])
        loads = True
    except Exception:  # noqa: BLE001 - onnxruntime raises its own types
        loads = False
    assert loads == ort_features().external_data_folder


def test_fused_sum_probe_agrees_with_the_planned_engine():
    """With the gate held open (the probe forced True), segments with a FusedConv sum run at
    ORT_ENABLE_ALL: their outputs equal onnxruntime's exactly when the real probe says so."""
    truth = ort_features().nchwc_fused_conv_sum
    path, feeds, want, names = _reference("multiexit", 96, 128)
    with override(nchwc_fused_conv_sum=True):
        executor = _as_given(path)
    try:
        fused = [r for r in executor.runners if r.session is not None
                 and has_fused_sum([executor.graph.nodes[n] for n in r.segment.nodes])]
        assert any(r.session.get_session_options().graph_optimization_level == ALL for r in fused)
        got = executor.run(feeds)
        equal = all(np.allclose(got[n], w, rtol=1e-4, atol=1e-5) for n, w in zip(names, want))
    finally:
        executor.close()
    assert equal == truth


def test_fused_sum_segments_leave_nchwc_where_the_runtime_drops_the_sum():
    path, feeds, want, names = _reference("multiexit", 96, 128)
    with override(nchwc_fused_conv_sum=False):
        executor = _as_given(path)
    try:
        fused = [r for r in executor.runners if r.session is not None
                 and has_fused_sum([executor.graph.nodes[n] for n in r.segment.nodes])]
        assert fused, "multiexit's simplified graph has Conv + Add fusions"
        assert all(r.session.get_session_options().graph_optimization_level != ALL for r in fused)
        check_equal(executor.run(feeds), want, names)
    finally:
        executor.close()


@pytest.mark.parametrize("layout", ["nchwc", "as-given"])
def test_without_the_folder_key_segments_read_weights_from_maps_of_the_model_file(layout):
    path, feeds, want, names = _reference("pedestrian", 128, 96)
    with override(external_data_folder=False):
        executor = create_planned_executor(load_skeleton(path), threads=1, layout=layout, cost_model=False)
    try:
        assert isinstance(executor, PlannedExecutor)
        mapped = [value for r in executor.runners for value in getattr(r, "file_weights", {}).values()]
        assert mapped, "file-backed weights are mapped, not handed to onnxruntime's folder lookup"
        check_equal(executor.run(feeds), want, names)
    finally:
        executor.close()


def test_streaming_is_refused_with_the_reason_where_initializers_are_copied():
    path, feeds, want, names = _reference("lane", 96, 128)
    with override(initializer_by_reference=False):
        engine = Engine(path, threads=1)
        try:
            engine.run(feeds)
            with pytest.raises(ValueError, match="add_initializer"):
                engine.set_memory_budget(1000.0)
            assert engine.memory_budget_mb is None
            check_equal(engine.run(feeds), want, names)
        finally:
            engine.close()
