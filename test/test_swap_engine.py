"""Engine.set_memory_budget with per-block sessions (DYNNET_SWAP_MODE=blocks) on every zoo model:
equal outputs, rejection, LUT switch. The default streamed mode: test_swap_streamed.py."""
from __future__ import annotations

import numpy as np
import pytest

from dynnet_ros.engine import Engine
from dynnet_ros.swap.bench import cached_bytes_of, make_feeds
from dynnet_ros.zoo import MODEL_NAMES, ensure_model

from _swap_models import check_equal, zoo_case

SIZES = [(96, 128), (64, 96)]  # the larger first: budgets are set against its minimum


@pytest.fixture(autouse=True)
def isolated(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("DYNNET_SWAP_DIR", str(tmp_path_factory.getbasetemp() / "swap-stores"))
    monkeypatch.setenv("DYNNET_SWAP_PROFILE", str(tmp_path_factory.getbasetemp() / "no-profile.yaml"))
    monkeypatch.setenv("DYNNET_SWAP_MODE", "blocks")


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_swapped_outputs_equal_in_memory_at_two_budgets_and_two_sizes(name):
    engine, feeds, want, names = zoo_case(name, SIZES)
    for size in SIZES:
        check_equal(engine.run(feeds[size]), want[size], names)
    engine.run(feeds[SIZES[0]])
    minimum = engine.min_budget_mb()
    top = engine.latency_table()[-1][0]
    partitions = []
    for budget in (minimum, minimum + 0.5 * (top - minimum)):
        engine.set_memory_budget(budget)
        stats = engine.stats()
        assert stats["executor"] == "swap", stats
        for size in SIZES + SIZES[:1]:
            check_equal(engine.run(feeds[size]), want[size], names)
        stats = engine.stats()
        partitions.append(tuple(stats["swap"]["partition"]))
        assert stats["blocks"] == len(stats["swap"]["partition"]) - 1
    # At the minimum budget blocks really are swapped per frame.
    engine.set_memory_budget(minimum)
    engine.run(feeds[SIZES[0]])
    stats = engine.stats()
    assert stats["swap"]["pinned_blocks"] < stats["blocks"]
    assert stats["resident_weight_bytes"] < stats["swap"]["weight_bytes"] or stats["swap"]["weight_bytes"] == 0
    engine.close()


def test_budget_below_minimum_is_rejected_and_previous_kept():
    path = str(ensure_model("lane"))
    engine = Engine(path, threads=1)
    feeds = make_feeds(engine.inputs, 64, 96)
    expected = engine.run(feeds)["lane_prob"]
    minimum = engine.min_budget_mb()
    engine.set_memory_budget(minimum * 1.2)
    partition = engine.stats()["swap"]["partition"]
    with pytest.raises(ValueError, match="below this model's minimum"):
        engine.set_memory_budget(minimum * 0.5)
    assert engine.memory_budget_mb == pytest.approx(minimum * 1.2)
    assert engine.stats()["swap"]["partition"] == partition
    np.testing.assert_allclose(engine.run(feeds)["lane_prob"], expected, rtol=1e-4, atol=1e-5)
    # From in-memory too: the in-memory executor stays.
    engine.set_memory_budget(None)
    assert engine.stats()["executor"] != "swap"
    with pytest.raises(ValueError, match="minimum"):
        engine.set_memory_budget(minimum * 0.5)
    assert engine.memory_budget_mb is None and engine.stats()["executor"] != "swap"
    engine.close()


def test_budget_changes_switch_partitions_from_the_table():
    path = str(ensure_model("depth"))
    engine = Engine(path, threads=1)
    feeds = make_feeds(engine.inputs, 64, 96)
    expected = engine.run(feeds)["depth"]
    table = engine.latency_table()[:-1]  # the last level is the in-memory executor (tested below)
    assert len(table) >= 2 and table[0][0] == pytest.approx(engine.min_budget_mb())
    seen = set()
    for budget, predicted_ms in table + table[::-1]:
        engine.set_memory_budget(budget * 1.0001)
        stats = engine.stats()["swap"]
        assert stats["predicted_ms"] == pytest.approx(predicted_ms)
        assert stats["predicted_peak_bytes"] <= budget * 1.0001 * 2**20
        seen.add(tuple(stats["partition"]) + (stats["pinned_blocks"],))
        np.testing.assert_allclose(engine.run(feeds)["depth"], expected, rtol=1e-4, atol=1e-5)
    assert len(seen) >= 2
    # Swapped weights never sit in the page cache (direct I/O or fadvise(DONTNEED)).
    store = engine.stats()["swap"]["store"]
    assert cached_bytes_of(f"{store}/weights.bin") <= 0.1 * engine.stats()["swap"]["weight_bytes"]
    engine.set_memory_budget(None)
    assert engine.stats()["executor"] != "swap"
    np.testing.assert_allclose(engine.run(feeds)["depth"], expected, rtol=1e-4, atol=1e-5)
    engine.close()


def test_engine_built_with_a_small_budget_swaps_from_the_start():
    path = str(ensure_model("multiexit"))
    probe = Engine(path, threads=1)
    budget = probe.min_budget_mb() * 1.1  # before any run: at the reference input size (480x640)
    feeds = make_feeds(probe.inputs, 64, 64)
    expected = probe.run(feeds)
    probe.close()
    engine = Engine(path, threads=1, memory_budget_mb=budget)
    assert engine.stats()["executor"] == "swap"
    for name, value in engine.run(feeds).items():
        np.testing.assert_allclose(value, expected[name], rtol=1e-4, atol=1e-5)
    engine.close()


def test_in_memory_model_proto_round_trip(tmp_path):
    import onnx

    from _swap_models import conv_chain, image

    proto = onnx.load(conv_chain(tmp_path / "chain.onnx"))
    engine = Engine(proto, threads=1)
    feeds = image(64, 64)
    expected = engine.run(feeds)["prob"]
    engine.set_memory_budget(engine.min_budget_mb())
    assert engine.stats()["executor"] == "swap"
    np.testing.assert_allclose(engine.run(feeds)["prob"], expected, rtol=1e-4, atol=1e-5)
    engine.set_memory_budget(None)
    assert engine.stats()["executor"] != "swap"
    np.testing.assert_allclose(engine.run(feeds)["prob"], expected, rtol=1e-4, atol=1e-5)
    engine.close()


def test_latency_table_tops_out_with_the_in_memory_level():
    path = str(ensure_model("lane"))
    engine = Engine(path, threads=1)
    feeds = make_feeds(engine.inputs, 64, 96)
    expected = engine.run(feeds)["lane_prob"]
    assert engine.latency_table()[-1][1] < 1e6  # no in-memory sample yet (warm-up run): predicted
    engine.run(feeds)
    measured = engine.stats()["last_latency_ms"]
    table = engine.latency_table()
    (inmem_mb, inmem_ms), (swap_mb, _) = table[-1], table[-2]
    assert inmem_mb > swap_mb and [mb for mb, _ in table] == sorted(mb for mb, _ in table)
    assert inmem_ms == pytest.approx(measured)  # calibrated by the in-memory frame just run
    engine.set_memory_budget(swap_mb * 1.0001)
    assert engine.stats()["executor"] == "swap"
    np.testing.assert_allclose(engine.run(feeds)["lane_prob"], expected, rtol=1e-4, atol=1e-5)
    assert engine.latency_table()[-1] == pytest.approx((inmem_mb, inmem_ms))  # swapped runs don't move it
    engine.set_memory_budget(inmem_mb)  # the in-memory level: back to the in-memory executor
    assert engine.stats()["executor"] != "swap" and engine.stats()["swap"] is None
    np.testing.assert_allclose(engine.run(feeds)["lane_prob"], expected, rtol=1e-4, atol=1e-5)
    engine.close()
    # built with that budget: in memory from the start, no swapped executor on the way
    engine = Engine(path, threads=1, memory_budget_mb=inmem_mb * 4)
    assert engine.stats()["executor"] != "swap" and engine.memory_budget_mb == pytest.approx(inmem_mb * 4)
    engine.close()


def test_store_variant_crossing_reuses_a_warm_executor(monkeypatch):
    import dynnet_ros.swap.control as control

    path = str(ensure_model("lane"))
    engine = Engine(path, threads=1)
    feeds = make_feeds(engine.inputs, 64, 96)
    expected = engine.run(feeds)["lane_prob"]
    swap = engine._swap
    monkeypatch.setattr(control, "VARIANT_MIN_GAP_BYTES", 10**12)  # a leaner variant never pays off
    assert swap._useful_levels() == ["all"]
    monkeypatch.setattr(control, "VARIANT_MIN_GAP_BYTES", -10**12)  # ...or always does: both in use
    assert swap._useful_levels() == ["all", "basic"]
    top = engine.latency_table()[-2][0]  # the largest swapped level
    variant = ["basic"]  # which variant the budget "needs" (the crossing itself is data-dependent)
    monkeypatch.setattr(swap, "_level_for", lambda budget_bytes: variant[0])
    engine.set_memory_budget(top)
    first = swap.swapped
    assert engine.stats()["swap"]["optimized"] == "ort-basic"
    variant[0] = "all"
    engine.set_memory_budget(top)  # a roomy budget: the preferred variant, the other kept warm
    stats = engine.stats()["swap"]
    assert stats["optimized"] == "ort-all" and stats["warm_variants"] == ["basic"]
    assert stats["predicted_peak_bytes"] + stats["warm_bytes"] <= top * 2**20
    warm = swap.parked["basic"]
    assert warm is first and warm.pipeline.resident_atoms() == set()  # sessions only, no weights
    # the crossing back down: the warm executor is taken, not rebuilt
    variant[0] = "basic"
    engine.set_memory_budget(top * 0.99)
    assert swap.swapped is warm and engine.stats()["swap"]["optimized"] == "ort-basic"
    np.testing.assert_allclose(engine.run(feeds)["lane_prob"], expected, rtol=1e-4, atol=1e-5)
    engine.set_memory_budget(None)
    assert swap.parked == {} and swap.swapped is None
    engine.close()


def test_inmemory_level_prices_the_planned_engine():
    """The in-memory level (top of the latency table, what the budget manager sees) is the planned
    engine's weights + its arena at the reference shape + its runtime base, not a plain
    onnxruntime session's footprint (which counts weights and activations twice)."""
    from dynnet_ros.swap import blocks
    from dynnet_ros.swap.control import PLANNED_BASE_BYTES, inmemory_estimate_bytes

    engine = Engine(str(ensure_model("depth")), threads=1)
    arena = engine._executor.plan_for(blocks.reference_shapes(engine.proto)).height
    level = engine.latency_table()[-1][0]
    assert level * 2**20 == pytest.approx(engine.weight_bytes + arena + PLANNED_BASE_BYTES, rel=1e-6)
    assert level * 2**20 < 0.7 * inmemory_estimate_bytes(engine.weight_bytes, arena)
    assert engine.min_budget_mb() <= level
    engine.close()
