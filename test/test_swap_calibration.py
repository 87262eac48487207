"""Activation calibration (store.measure_activations): measured at the served sizes, the largest
measured/estimated ratio over the reference and comparable sizes sets it, with a margin."""
from __future__ import annotations

import onnx
import pytest

from _swap_models import conv_chain
from dynnet_ros.swap import blocks
from dynnet_ros.swap import store as store_mod


@pytest.fixture()
def model(tmp_path):
    return conv_chain(tmp_path / "chain.onnx")


def test_calibration_shapes_vary_symbolic_image_dims_only(model):
    graph = onnx.load(model)
    ref = {"image": (1, 3, 480, 640)}
    shapes = store_mod.calibration_shapes(graph, ref)
    assert shapes[0] == ref
    assert {s["image"][2:] for s in shapes[1:]} == set(store_mod.CALIBRATION_SIZES)
    assert all(s["image"][:2] == (1, 3) for s in shapes)
    fixed = onnx.load(model)
    for dim in fixed.graph.input[0].type.tensor_type.shape.dim[2:]:
        dim.dim_value = 480 if dim.dim_param == "H" else 640
    assert store_mod.calibration_shapes(fixed, ref) == [ref]


def test_largest_ratio_of_comparable_sizes_sets_the_calibration(model, tmp_path, monkeypatch):
    """Synthetic peaks (real ones depend on the heap) that dwarf the activations: none at the
    reference, 100 MB at 384x640, 1000 MB at 256x320. 384x640 sets the ratio; 256x320 (a quarter
    of the reference's pixels) is measured but does not."""
    mb = 2**20
    extra = {480: 0, 384: 100 * mb, 256: 1000 * mb}
    real = store_mod._atom_peak_bytes
    seen = set()

    def fake(session, outputs, feeds):
        _, results = real(session, outputs, feeds)
        height = max(v.shape[2] for v in feeds.values() if v.ndim == 4)
        seen.add(height)
        return extra[height], results

    monkeypatch.setattr(store_mod, "_atom_peak_bytes", fake)
    store = store_mod.prepare(model, tmp_path / "store", max_atoms=3)
    assert seen == {480, 384, 256}
    atoms = [e.atom for e in store.atoms]
    graph = store.graph()
    ref = blocks.atom_costs(graph, atoms, {"image": (1, 3, 480, 640)}).act_bytes
    mid = blocks.atom_costs(graph, atoms, {"image": (1, 3, 384, 640)}).act_bytes
    small = blocks.atom_costs(graph, atoms, {"image": (1, 3, 256, 320)}).act_bytes
    got = store.index["reference_costs"]["act_bytes_measured"]
    margin = store_mod.CALIBRATION_MARGIN
    for i in range(len(atoms)):
        lower = margin * extra[384] / mid[i] * ref[i]            # the entry activations only add
        upper = margin * (extra[384] + 4 * mid[i]) / mid[i] * ref[i]
        assert lower <= got[i] <= upper, (i, got[i], lower, upper)
        assert got[i] < margin * extra[256] / small[i] * ref[i] / 2  # the small size did not set it
    # the store's costs use it, never below the shape-inference estimate
    assert all(c >= e for c, e in zip(store.reference_costs().act_bytes, ref))


def test_without_clear_refs_there_is_no_calibration(model, tmp_path, monkeypatch):
    monkeypatch.setattr(store_mod, "_atom_peak_bytes", lambda session, outputs, feeds: None)
    store = store_mod.prepare(model, tmp_path / "store", max_atoms=3)
    assert store.index["reference_costs"]["act_bytes_measured"] is None
    ref = store.index["reference_costs"]["act_bytes"]
    assert list(store.reference_costs().act_bytes) == ref
