"""A budget holds at every input size the engine is fed (swap/streamed.py ``admit``): where the
minimum at a size fits, the window re-sizes; where it does not, the engine raises or flags it,
never silently. Also: the reference size before the first frame is one the model runs at
(rdp/solve.py), and budget changes stay within the larger of the two states they move between.

The memory figures are peak RSS growth in a fresh child process (commands/swap_bench_worker.py
``sequence`` and ``changes`` modes), as the swap benchmark measures them.
"""
from __future__ import annotations

import logging

import numpy as np
import onnx
import pytest
from _corpus import by_name
from _swap_models import conv_chain, image
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from dynnet_ros.bytesize import MB
from dynnet_ros.commands.swap_bench import run_worker
from dynnet_ros.engine import BudgetExceeded, Engine
from dynnet_ros.swap.budget_policy import reference_shapes
from dynnet_ros.zoo import ensure_model

pytestmark = pytest.mark.slow

#: peak RSS growth may exceed the budget by this factor (docs/swap.md)
TOLERANCE = 1.05
SMALL = {"image": (1, 3, 64, 96)}
LARGE = {"image": (1, 3, 128, 160)}
RECOGNISER = by_name("ppocr-text-recogniser")


@pytest.fixture(scope="module")
def swap_dir(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:  # children (calibration, workers) inherit it
        patch.setenv("DYNNET_SWAP_DIR", str(tmp_path_factory.getbasetemp() / "budget-shapes-stores"))
        yield


@pytest.fixture(scope="module")
def chain(tmp_path_factory, swap_dir) -> str:
    return conv_chain(tmp_path_factory.mktemp("budget-shapes") / "chain.onnx", channels=(3, 32, 64, 64, 32))


def _minimum(model: str, shapes: dict) -> float:
    with Engine(model, threads=1, swappable=True, input_shapes=shapes) as engine:
        return engine.min_budget_mb()


# ---------------------------------------------------------------------------- the policies
def test_raise_refuses_a_size_the_budget_cannot_hold_and_changes_nothing(chain):
    low, high = _minimum(chain, SMALL), _minimum(chain, LARGE)
    assert high > low
    engine = Engine(chain, threads=1, memory_budget_mb=low, input_shapes=SMALL, over_budget="raise")
    engine.run(image(64, 96))
    with pytest.raises(BudgetExceeded, match=r"minimum .* at input image=1x3x128x160") as refused:
        engine.run(image(128, 160))
    assert isinstance(refused.value, ValueError)
    assert refused.value.minimum_mb == pytest.approx(high) and refused.value.shapes == "image=1x3x128x160"
    stats = engine.engine_stats()
    assert stats.runs == 1 and stats.shape_signature == {"image": [1, 3, 64, 96]} and stats.over_budget is None
    engine.run(image(64, 96))  # a size that fits still runs
    engine.set_memory_budget(refused.value.minimum_mb)  # the minimum it named runs the large size
    engine.run(image(128, 160))
    assert engine.engine_stats().over_budget is None
    engine.close()


def test_run_flags_the_overshoot_until_a_frame_fits(chain):
    low, high = _minimum(chain, SMALL), _minimum(chain, LARGE)
    engine = Engine(chain, threads=1, memory_budget_mb=low, input_shapes=SMALL)  # over_budget="run" by default
    engine.run(image(64, 96))
    assert engine.stats()["over_budget"] is None
    out = engine.run(image(128, 160))["prob"]
    assert out.shape == (1, 1, 128, 160)
    flagged = engine.stats()["over_budget"]
    assert flagged["shapes"] == "image=1x3x128x160"
    assert flagged["minimum_mb"] == pytest.approx(high) and flagged["overshoot_mb"] == pytest.approx(high - low)
    engine.run(image(128, 160))
    assert engine.engine_stats().window.over_budget_frames == 2
    engine.run(image(64, 96))  # back within the budget: the flag clears
    assert engine.engine_stats().over_budget is None
    engine.run(image(128, 160))
    engine.set_memory_budget(high)  # raising the budget to the minimum clears it too
    assert engine.engine_stats().over_budget is None
    engine.close()


def test_over_budget_policy_is_checked(chain):
    with pytest.raises(ValueError, match="over_budget"):
        Engine(chain, over_budget="ignore")


def test_a_smaller_size_gives_back_the_larger_ones_activations_under_a_budget(chain):
    engine = Engine(chain, threads=1, memory_budget_mb=_minimum(chain, LARGE) * 1.2, input_shapes=SMALL)
    engine.run(image(128, 160))
    large = engine.engine_stats().executor_stats.arena_bytes
    engine.run(image(64, 96))
    small = engine.engine_stats().executor_stats.arena_bytes
    assert small < large and small == engine._swap.streamed.arena_bytes_at(SMALL)
    engine.close()


# ---------------------------------------------------------------------------- random shape sequences
#: model -> (path, the input shapes the sequences draw from)
SEQUENCE_CASES = {
    "lane": (lambda: str(ensure_model("lane")),
             [{"image": (1, 3, 96, 128)}, {"image": (1, 3, 160, 224)}, {"image": (1, 3, 224, 320)}]),
    "multiexit": (lambda: str(ensure_model("multiexit")),
                  [{"image": (1, 3, 96, 128)}, {"image": (1, 3, 160, 224)}, {"image": (1, 3, 224, 320)}]),
    RECOGNISER.name: (lambda: str(RECOGNISER.path()),
                      [{"x": (1, 3, 48, 160)}, {"x": (1, 3, 48, 320)}, {"x": (2, 3, 48, 320)}]),
}


@pytest.fixture(scope="module")
def levels(swap_dir) -> dict:
    """Per case: the minimum and the in-memory level at each of its shapes."""
    out = {}
    for name, (path, shapes) in SEQUENCE_CASES.items():
        if name == RECOGNISER.name and not RECOGNISER.available():
            continue
        with Engine(path(), threads=1, swappable=True, input_shapes=shapes[0]) as engine:
            out[name] = [(engine.min_budget_mb(s), engine._swap.footprint(s).inmemory_bytes() / MB)
                         for s in shapes]
    return out


def _check_frames(result: dict, policy: str) -> None:
    budget = result["budget_mb"]
    previous = None
    for frame in result["frames"]:
        fits = frame["minimum_mb"] <= budget
        where = f"{frame} at budget {budget:.2f} MB ({policy})"
        if frame["outcome"] == "raised":
            assert policy == "raise" and not fits, where
        elif frame["outcome"] == "flagged":
            assert policy == "run" and not fits, where
        else:
            assert fits, where  # never silent: a frame above its minimum is raised or flagged
            carried = previous is not None and previous["outcome"] == "flagged"
            # within the budget, or no higher than the flagged state the frame started from
            assert frame["peak_mb"] <= TOLERANCE * budget or \
                (carried and frame["peak_mb"] <= frame["held_before_mb"] + 0.5), where
        if policy == "raise":
            assert frame["peak_mb"] <= TOLERANCE * budget, where  # nothing ever ran above it
        previous = frame


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.skipif(
    n == RECOGNISER.name and not RECOGNISER.available(), reason=RECOGNISER.skip_reason)) for n in SEQUENCE_CASES])
@settings(max_examples=3, deadline=None, derandomize=True)
@given(first=st.integers(0, 2), rest=st.lists(st.integers(0, 2), min_size=2, max_size=4),
       share=st.floats(0.0, 1.0), policy=st.sampled_from(["raise", "run"]))
def test_random_shape_sequences_hold_the_budget_or_say_so(levels, name, first, rest, share, policy):
    """Budgets accepted at the first shape (from its minimum to its in-memory level), then a
    random sequence of shapes: every frame is within 1.05x the budget, or raised, or flagged."""
    path, shapes = SEQUENCE_CASES[name]
    low, top = levels[name][first]
    budget = low + share * (top - low)
    sequence = [shapes[first]] + [shapes[k] for k in rest]
    result = run_worker({"mode": "sequence", "model": path(), "threads": 1, "budget_mb": budget,
                         "sequence": [{n: list(s) for n, s in shape.items()} for shape in sequence],
                         "over_budget": policy})
    _check_frames(result, policy)


# ---------------------------------------------------------------------------- reference shapes
@pytest.mark.skipif(not RECOGNISER.available(), reason=RECOGNISER.skip_reason)
def test_the_recogniser_gets_a_reference_size_it_runs_at(swap_dir):
    """Its line height must fit one 48-row stripe (RDP: max((h + 15)//48, 1) == 1): with no
    input_shapes, budgets refer to a height of 48, not the generic 224 it cannot run."""
    path = str(RECOGNISER.path())
    assert reference_shapes(onnx.load(path, load_external_data=False)) == {"x": (1, 3, 48, 224)}
    with Engine(path, threads=1, swappable=True) as engine:
        minimum = engine.min_budget_mb()
    with Engine(path, threads=1, memory_budget_mb=minimum) as engine:
        out = engine.run({"x": np.zeros((1, 3, 48, 224), np.float32)})
        assert engine.engine_stats().over_budget is None
        assert next(iter(out.values())).shape[:2] == (1, 28)


def test_no_runnable_reference_size_names_the_input():
    """A pooling window of 5000 samples: no size up to the search bound runs it."""
    graph = helper.make_graph([helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[5000])], "pool",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, "n"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(ValueError, match=r"input 'x' axis 2.*input_shapes"):
        reference_shapes(model)


def test_a_negative_declared_dim_is_dynamic():
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 3, "h", "w"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert reference_shapes(model) == {"x": (1, 3, 224, 224)}


# ---------------------------------------------------------------------------- budget changes
def test_budget_changes_of_a_swappable_engine_stay_within_the_larger_state(swap_dir):
    """Lowered, raised, unlimited and back: the change (to the end of the first frame after it)
    never peaks above the larger of the states it moves between."""
    path = str(ensure_model("depth"))
    shapes = {"image": (1, 3, 96, 128), "lidar_depth": (1, 1, 96, 128)}
    with Engine(path, threads=1, swappable=True, input_shapes=shapes) as engine:
        low, top = engine.min_budget_mb(), engine._swap.footprint(shapes).inmemory_bytes() / MB
    mid = (low + top) / 2
    result = run_worker({"mode": "changes", "model": path, "threads": 1, "swappable": True,
                         "shapes": {n: list(s) for n, s in shapes.items()},
                         "changes": [low * 1.01, mid, low * 1.01, None, mid]})
    states = result["states"]
    for before, after in zip(states, states[1:]):
        larger = max(before["state_peak_mb"], after["state_peak_mb"])
        assert after["change_peak_mb"] <= TOLERANCE * larger, (before, after)
        if after["budget_mb"] is not None:
            assert after["state_peak_mb"] <= TOLERANCE * after["budget_mb"], after


def test_a_plain_engine_says_its_first_budget_cannot_bound_the_process(chain, caplog):
    engine = Engine(chain, threads=1)
    engine.run(image(64, 96))
    with caplog.at_level(logging.WARNING, logger="dynnet_ros.swap.budget_policy"):
        engine.set_memory_budget(_minimum(chain, SMALL) * 1.1)
    warning = " ".join(r.getMessage() for r in caplog.records)
    assert "swappable=True" in warning and "memory_budget_mb" in warning
    engine.set_memory_budget(None)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="dynnet_ros.swap.budget_policy"):
        engine.set_memory_budget(_minimum(chain, SMALL) * 1.1)  # a window resize from now on: no warning
    assert not [r for r in caplog.records if "swappable" in r.getMessage()]
    engine.close()
