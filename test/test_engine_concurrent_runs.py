"""Engine runs at once (``Engine(concurrent_runs=N)``): each run in a lane of its own (an arena,
its own bindings of the shared plans) over the same sessions, while no budget holds the engine;
under a budget runs take turns through the streamed weights window."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from dynnet_ros.engine import Engine
from dynnet_ros.engine.plan.options import default_threads
from dynnet_ros.perception.serving import engine_runs
from dynnet_ros.zoo import ensure_model

SHAPE = (2, 3, 64, 96)


@pytest.fixture(autouse=True)
def isolated(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("DYNNET_SWAP_DIR", str(tmp_path_factory.getbasetemp() / "swap-stores"))


@pytest.fixture
def engine():
    """The lane model as a node builds it (swappable) for two runs at once."""
    with Engine(str(ensure_model("lane")), swappable=True, concurrent_runs=2) as built:
        yield built


def _planned(engine: Engine):
    executor = engine._executor
    return getattr(executor, "planned", executor)


def _inputs(count: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(7)
    return [{"image": rng.random(SHAPE, dtype=np.float32)} for _ in range(count)]


def test_two_runs_at_once_give_what_runs_one_at_a_time_give(engine):
    inputs = _inputs(4)
    expected = [engine.run(feeds) for feeds in inputs]   # the first run also brings every weight in
    assert _planned(engine).lanes == 2 and engine._executor.runs_concurrently()
    mismatches: list[int] = []
    errors: list[BaseException] = []

    def hammer(offset: int) -> None:
        try:
            for step in range(12):
                index = (offset + step) % len(inputs)
                got = engine.run(inputs[index])
                if any(not np.array_equal(got[name], expected[index][name]) for name in got):
                    mismatches.append(index)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=hammer, args=(offset,)) for offset in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not errors and not mismatches and engine.engine_stats().runs == 4 + 24


def test_runs_that_never_overlap_hold_one_arena(engine):
    for feeds in _inputs(3):
        engine.run(feeds)
    assert engine._executor.runs_concurrently()
    first, second = (lane.arena.capacity for lane in _planned(engine)._lanes)
    assert first > 0 and second == 0


def test_a_run_goes_on_in_the_second_lane_while_the_first_is_busy(engine):
    """A run holding the first lane (taken out of the free lanes, as a run in flight holds it)
    does not hold up another: that one runs in the second lane, with an arena of its own."""
    feeds = _inputs(1)[0]
    expected = engine.run(feeds)
    planned = _planned(engine)
    busy = planned._free_lanes.get()   # the lane a run in flight would hold
    assert busy == 0
    try:
        got = engine.run(feeds)
    finally:
        planned._free_lanes.put(busy)
    assert all(np.array_equal(got[name], expected[name]) for name in got)
    first, second = (lane.arena.capacity for lane in planned._lanes)
    assert first > 0 and second == first
    assert engine.engine_stats().executor_stats.arena_bytes == first + second


def test_under_a_budget_runs_take_turns_in_one_arena(engine):
    feeds = _inputs(1)[0]
    engine.run(feeds)
    planned = _planned(engine)
    busy = planned._free_lanes.get()
    try:
        engine.run(feeds)   # the second lane's arena, as two runs at once hold it
    finally:
        planned._free_lanes.put(busy)
    engine.set_memory_budget(engine.min_budget_mb({"image": SHAPE}) + 50)
    assert not engine._executor.runs_concurrently()
    assert planned._lanes[1].arena.capacity == 0   # a budget counts one run's activations
    engine.run(feeds)
    assert planned._lanes[1].arena.capacity == 0
    engine.set_memory_budget(None)
    engine.run(feeds)   # all weights in again
    assert engine._executor.runs_concurrently()


def test_runs_share_the_cpus_unless_threads_are_given():
    with Engine(str(ensure_model("lane")), concurrent_runs=2) as shared:
        assert shared.threads == max(1, default_threads() // 2)
    with Engine(str(ensure_model("lane")), concurrent_runs=2, threads=3) as given:
        assert given.threads == 3
    with pytest.raises(ValueError, match="concurrent_runs"):
        Engine(str(ensure_model("lane")), concurrent_runs=0)


def test_a_node_runs_one_engine_run_per_batch_in_flight():
    assert engine_runs({"cameras": ["front", "left", "right", "rear"], "batches_in_flight": 2}) == 2
    assert engine_runs({"cameras": ["front", "left"], "batches_in_flight": 1}) == 1
    assert engine_runs({"cameras": [], "batches_in_flight": 2}) == 1   # one camera: one batch in flight


def test_a_segmenter_serves_two_batches_at_once_as_it_serves_them_in_turn():
    """The perception core leaves turn-taking to an engine built for runs at once (its own lock
    then holds no run), and each thread's batch comes back as one run at a time gives it."""
    from dynnet_ros.perception.segmenter import Segmenter
    rng = np.random.default_rng(3)
    batches = [[rng.integers(0, 256, (64, 96, 3), dtype=np.uint8) for _ in range(2)] for _ in range(2)]
    with Segmenter(str(ensure_model("lane")), swappable=True, concurrent_runs=2) as core:
        assert core.engine.concurrent_runs == 2
        expected = [[result.probability for result in core.batch(frames)] for frames in batches]
        assert core.engine.runs_overlap
        got: dict[int, list[np.ndarray]] = {}

        def serve(index: int) -> None:
            for _ in range(5):
                got[index] = [result.probability for result in core.batch(batches[index])]

        threads = [threading.Thread(target=serve, args=(index,)) for index in (0, 1)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=300)
    for index, frames in enumerate(expected):
        assert all(np.array_equal(a, b) for a, b in zip(got[index], frames))
