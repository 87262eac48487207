"""Per-engine accounting: an engine's minimum budget is exactly the smallest budget it accepts,
and the same in every process state — several engines, foreign allocations, any create/delete
order (swap/footprint.py)."""
from __future__ import annotations

import random

import numpy as np
import pytest
from _swap_models import conv_chain

from dynnet_ros.engine import Engine
from dynnet_ros.swap.footprint import Footprint

SMALL = {"image": (1, 3, 64, 96)}
LARGE = {"image": (1, 3, 128, 160)}


@pytest.fixture(autouse=True)
def isolated(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("DYNNET_SWAP_DIR", str(tmp_path_factory.getbasetemp() / "accounting-stores"))


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    return conv_chain(tmp_path_factory.mktemp("accounting") / "chain.onnx", channels=(3, 32, 64, 64, 32))


def _frame(shapes: dict) -> dict:
    return {"image": np.random.default_rng(0).random(shapes["image"], dtype=np.float32)}


def _check_exact(engine: Engine, expected: float) -> None:
    minimum = engine.min_budget_mb()
    assert minimum == pytest.approx(expected, abs=1e-9)  # independent of what else the process holds
    engine.set_memory_budget(minimum)                     # the minimum is accepted ...
    with pytest.raises(ValueError, match="below this model's minimum"):
        engine.set_memory_budget(minimum - 1.0)           # ... anything clearly below is refused
    assert engine.memory_budget_mb == minimum             # and the refusal keeps it


@pytest.mark.slow
def test_min_budget_is_accepted_and_process_independent_in_random_sequences(model):
    reference = {"small": Engine(model, input_shapes=SMALL).min_budget_mb(),
                 "large": Engine(model, input_shapes=LARGE).min_budget_mb()}
    assert reference["large"] > reference["small"]  # the arena grows with the input
    rng = random.Random(7)
    live: list[tuple[Engine, str]] = []
    foreign: list[np.ndarray] = []
    for _ in range(24):
        action = rng.choice(["create", "create", "delete", "allocate", "free", "run", "check"])
        if action == "create" or not live:
            kind, size = rng.choice(["plain", "swappable", "budget"]), rng.choice(["small", "large"])
            shapes = SMALL if size == "small" else LARGE
            if kind == "budget":
                engine = Engine(model, memory_budget_mb=reference[size] + 5, input_shapes=shapes)
            else:
                engine = Engine(model, swappable=kind == "swappable", input_shapes=shapes)
            live.append((engine, size))
        elif action == "delete":
            engine, _ = live.pop(rng.randrange(len(live)))
            engine.close()
            del engine
        elif action == "allocate":
            foreign.append(np.ones(50 * 2**20 // 8))  # 50 MB touched in this process
        elif action == "free" and foreign:
            foreign.pop()
        elif action == "run":
            engine, size = rng.choice(live)
            engine.run(_frame(SMALL if size == "small" else LARGE))
        engine, size = rng.choice(live)
        _check_exact(engine, reference[size])
    for engine, _ in live:
        engine.close()


@pytest.mark.slow
def test_min_budget_for_a_size_class_is_the_one_accepted_at_that_size(model):
    with Engine(model, swappable=True, input_shapes=SMALL) as engine:
        at_large = engine.min_budget_mb(LARGE)
        assert engine.min_budget_mb() < at_large  # asking about a size class changes nothing in force
        engine.run(_frame(LARGE))                 # the engine now runs the large size
        assert engine.min_budget_mb() == pytest.approx(at_large, abs=1e-9)
        engine.set_memory_budget(at_large)
        with pytest.raises(ValueError, match=r"at input image=1x3x128x160"):
            engine.set_memory_budget(at_large - 0.5)


def test_a_second_engine_after_delete_reports_the_same_minimum(model):
    first = Engine(model, swappable=True, input_shapes=LARGE)
    first.run(_frame(LARGE))
    minimum = first.min_budget_mb()
    first.close()
    del first
    second = Engine(model, swappable=True, input_shapes=LARGE)
    assert second.min_budget_mb() == pytest.approx(minimum, abs=1e-9)
    second.close()


def test_bad_shapes_for_a_minimum_are_refused_with_the_reason(model):
    with Engine(model) as engine:
        with pytest.raises(ValueError, match="unknown input"):
            engine.min_budget_mb({"nope": (1, 3, 64, 64)})
        with pytest.raises(ValueError, match="rank"):
            engine.min_budget_mb({"image": (64, 64)})


def test_calibration_arithmetic_keeps_minimum_and_allowance_consistent():
    cal = Footprint(nonweight_bytes=10 * 2**20, arena_bytes=4 * 2**20, min_stream_bytes=3 * 2**20,
                      weight_span=12 * 2**20)
    minimum = cal.minimum_bytes()
    assert cal.allowance(minimum) >= cal.min_stream_bytes      # the minimum leaves the smallest window
    assert cal.allowance(minimum - 1024) < cal.min_stream_bytes  # 1 KiB less would not
    assert cal.allowance(cal.inmemory_bytes()) >= cal.weight_span
    assert float(minimum) / 2**20 * 2**20 == minimum           # exact through a float MB round trip
