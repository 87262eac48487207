"""Banded stem (engine/plan/banded.py): the first conv and its readers computed in row bands."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from dynnet_ros.engine.backends.cpu_planned import create_planned_executor
from dynnet_ros.engine.backends.registry import load_for_backend
from dynnet_ros.engine.plan.banded import BandedRunner, RowGeometry, plan_bands
from dynnet_ros.engine.runtime.executor import PlannedExecutor
from dynnet_ros.zoo import ensure_model

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _private_layout_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DYNNET_LAYOUT_DIR", str(tmp_path / "layout"))


geometries = st.builds(lambda k, s, p: RowGeometry(k, s, min(p, k - 1), min(p, k - 1)),
                       st.sampled_from([1, 3, 5, 7]), st.integers(1, 3), st.integers(0, 3))


@settings(max_examples=200, deadline=None)
@given(height=st.integers(8, 200), first=geometries, second=geometries, bands=st.integers(1, 9))
def test_bands_tile_the_output_and_read_exactly_the_rows_they_need(height, first, second, bands):
    if first.out_rows(height) < second.kernel - second.pad_top - second.pad_bottom or first.out_rows(height) < 1:
        return
    out_rows = second.out_rows(first.out_rows(height))
    if out_rows < 1:
        return
    plan = plan_bands(height, first, second, bands)
    assert plan[0].out[0] == 0 and plan[-1].out[1] == out_rows
    for band, after in zip(plan, plan[1:]):
        assert band.out[1] == after.out[0]
    for band in plan:
        rows_mid, rows_in = band.mid[1] - band.mid[0], band.image[1] - band.image[0]
        # each band's convs, with its own vertical padding, produce exactly its rows
        assert second.out_rows(rows_mid, *band.mid_pads) == band.out[1] - band.out[0]
        assert first.out_rows(rows_in, *band.image_pads) == rows_mid
        assert 0 <= band.image[0] <= band.image[1] <= height
        assert all(0 <= p <= g for p, g in zip(band.mid_pads, (second.pad_top, second.pad_bottom)))


def _stem_model(path, k1: int, s1: int, p1: int, k2: int, s2: int, p2: int, readers: int = 1) -> str:
    """conv (3 -> 16) → relu → `readers` convs (16 -> 32) → relu → sigmoid each."""
    rng = np.random.default_rng(k1 * 100 + s2)

    def w(name, shape):
        return onnx.numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)

    nodes = [helper.make_node("Conv", ["image", "w0", "b0"], ["c0"], kernel_shape=[k1, k1], strides=[s1, s1],
                              pads=[p1, p1, p1, p1]),
             helper.make_node("Relu", ["c0"], ["r0"])]
    inits = [w("w0", (16, 3, k1, k1)), w("b0", (16,))]
    outputs = []
    for i in range(readers):
        nodes += [helper.make_node("Conv", ["r0", f"w{i + 1}"], [f"c{i + 1}"], kernel_shape=[k2, k2],
                                   strides=[s2, s2], pads=[p2, p2, p2, p2]),
                  helper.make_node("Relu", [f"c{i + 1}"], [f"r{i + 1}"]),
                  helper.make_node("Sigmoid", [f"r{i + 1}"], [f"out{i}"])]
        inits.append(w(f"w{i + 1}", (32, 16, k2, k2)))
        outputs.append(helper.make_tensor_value_info(f"out{i}", TensorProto.FLOAT, [1, 32, "h", "w"]))
    graph = helper.make_graph(nodes, "stem", [helper.make_tensor_value_info("image", TensorProto.FLOAT,
                                                                            [1, 3, "H", "W"])], outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, path)
    return str(path)


@pytest.mark.parametrize("layout", ["nchwc", "as-given"])
@pytest.mark.parametrize("geometry,readers", [((3, 2, 1, 3, 2, 1), 1), ((5, 1, 2, 3, 2, 0), 2),
                                              ((7, 2, 3, 1, 1, 0), 1), ((3, 1, 1, 3, 3, 1), 2)])
def test_banded_stem_matches_onnxruntime(tmp_path, layout, geometry, readers):
    path = _stem_model(tmp_path / "stem.onnx", *geometry, readers=readers)
    executor = create_planned_executor(load_for_backend("cpu", path), threads=1, layout=layout,
                                       stem_min_bytes=0, stem_min_gain=-1.0, versions=False)
    try:
        assert isinstance(executor, PlannedExecutor)
        banded = [r for r in executor.branch_runners.values() if isinstance(r, BandedRunner)]
        assert len(banded) == 1 and executor.segments[0].kind == "banded"
        session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        for height, width in ((64, 48), (97, 61), (160, 128)):
            feeds = {"image": np.random.default_rng(height).random((1, 3, height, width), dtype=np.float32)}
            got = executor.run(feeds)
            for i, want in enumerate(session.run(None, feeds)):
                np.testing.assert_allclose(got[f"out{i}"], want, rtol=1e-5, atol=1e-6)
        assert banded[0].stats.bands >= 3 * 4
    finally:
        executor.close()


def test_gated_stem_is_banded_and_its_arena_shrinks():
    """gated's peak was its stem (a 32-channel half-resolution map next to the 64-channel quarter-
    resolution one: 18.75 MB at 640x640); banded, only a band of the first exists at a time."""
    skeleton = load_for_backend("cpu", str(ensure_model("gated")))
    heights = {}
    for bands in (0, 4):
        executor = create_planned_executor(skeleton, threads=1, stem_bands=bands, versions=False)
        try:
            heights[bands] = executor.plan_for({"image": (1, 3, 640, 640)}).height
            assert (executor.segments[0].kind == "banded") == (bands > 0)
        finally:
            executor.close()
    assert heights[4] < 0.6 * heights[0]


def test_stems_that_do_not_set_the_peak_are_left_alone():
    """lane's peak is at its decoder's concatenation, not the stem: banding would only cost time."""
    executor = create_planned_executor(load_for_backend("cpu", str(ensure_model("lane"))), threads=1, versions=False)
    try:
        assert not any(s.kind == "banded" for s in executor.segments)
    finally:
        executor.close()
