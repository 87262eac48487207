"""The Engine's budget policy (swap/budget_policy.py): the in-memory level, the latency table, an
in-memory ModelProto under a budget. Streaming itself: test_swap_streamed.py."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from _swap_models import conv_chain, image

from dynnet_ros.commands.swap_bench_worker import make_feeds
from dynnet_ros.engine import Engine
from dynnet_ros.swap.budget_policy import inmemory_estimate_bytes
from dynnet_ros.zoo import ensure_model


@pytest.fixture(autouse=True)
def isolated(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("DYNNET_SWAP_DIR", str(tmp_path_factory.getbasetemp() / "swap-stores"))


@pytest.mark.slow
def test_inmemory_level_prices_the_planned_engine():
    """The in-memory level (top of the latency table, what the budget manager sees) is the
    engine's own footprint with every weight resident — weights + what it holds besides them at
    the input size run (arena included), measured once in a clean process — not a plain
    onnxruntime session's footprint (which counts the weights twice)."""
    engine = Engine(str(ensure_model("depth")), threads=1)
    feeds = make_feeds(engine.inputs, 64, 96)
    engine.run(feeds)  # the table needs one frame's latency
    arena = engine._executor.arena_bytes_at({name: value.shape for name, value in feeds.items()})
    assert arena is not None
    level = engine.latency_table()[-1][0]
    calibration = engine._swap.footprint({name: value.shape for name, value in feeds.items()})
    assert level * 2**20 == calibration.inmemory_bytes()
    assert calibration.nonweight_bytes >= arena and calibration.weight_span >= engine.weight_bytes
    assert level * 2**20 < inmemory_estimate_bytes(engine.weight_bytes, None)
    assert engine.min_budget_mb() <= level
    engine.close()


@pytest.mark.slow
def test_latency_table_tops_out_with_the_measured_in_memory_level():
    engine = Engine(str(ensure_model("lane")), threads=1)
    feeds = make_feeds(engine.inputs, 64, 96)
    expected = engine.run(feeds)["lane_prob"]
    engine.run(feeds)  # the first frame at a size is set-up, the second a sample
    measured = engine.engine_stats().last_latency_ms
    table = engine.latency_table()
    (inmem_mb, inmem_ms), (low_mb, _) = table[-1], table[0]
    assert inmem_mb > low_mb and [mb for mb, _ in table] == sorted(mb for mb, _ in table)
    assert inmem_ms == pytest.approx(measured)
    engine.set_memory_budget(table[-2][0])
    assert engine.engine_stats().executor == "swap"
    np.testing.assert_allclose(engine.run(feeds)["lane_prob"], expected, rtol=1e-4, atol=1e-5)
    engine.close()


@pytest.mark.slow
def test_in_memory_model_proto_streams_under_a_budget(tmp_path):
    proto = onnx.load(conv_chain(tmp_path / "chain.onnx"))
    engine = Engine(proto, threads=1)
    feeds = image(64, 64)
    expected = engine.run(feeds)["prob"]
    engine.set_memory_budget(engine.latency_table()[-1][0] * 0.999)
    assert engine.engine_stats().executor == "swap"
    np.testing.assert_allclose(engine.run(feeds)["prob"], expected, rtol=1e-4, atol=1e-5)
    engine.set_memory_budget(None)  # unlimited: the same executor, every weight resident
    assert engine.engine_stats().executor == "swap" and engine.memory_budget_mb is None
    np.testing.assert_allclose(engine.run(feeds)["prob"], expected, rtol=1e-4, atol=1e-5)
    engine.close()


@pytest.mark.slow
def test_stats_dict_is_derived_from_the_typed_stats():
    engine = Engine(str(ensure_model("lane")), threads=1, swappable=True)
    engine.run(make_feeds(engine.inputs, 64, 96))
    typed, stats = engine.engine_stats(), engine.stats()
    assert {"backend", "executor", "last_latency_ms", "shape_signature", "runs", "versions", "arena_bytes",
            "weight_bytes", "blocks", "memory_budget_mb"} <= set(stats)
    assert stats["executor"] == typed.executor == "swap" and stats["runs"] == typed.runs == 1
    assert stats["swap"]["allowance_bytes"] == typed.window.allowance_bytes == typed.window.weight_span_bytes
    assert stats["arena_bytes"] == typed.executor_stats.arena_bytes > 0
    engine.close()
