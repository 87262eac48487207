"""Streamed prefetch: the scheduler's time-varying allowance and the pipeline that honours it."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from _swap_models import conv_chain, image

from dynnet_ros.swap import blocks, pipeline
from dynnet_ros.swap.delay_model import DelayModel
from dynnet_ros.swap.executor import SwappedExecutor
from dynnet_ros.swap.scheduler import MB, AtomTable, LookupTable, MemoryModel, Scheduler
from dynnet_ros.swap.store import prepare

DELAY = DelayModel(alpha=0.5e-9, beta=5e-5, gamma=1e-11, eta=5e-6)

# Shallow atoms: big activations, small weights; deep atoms: small activations, big weights
# (the shape of an encoder).  One atom at a time is far below the budget used below; whole-block
# prefetch of the 24 MB atom is not.
ENCODER = AtomTable(weight_bytes=(6 * MB, 9 * MB, 4 * MB, 24 * MB, 7 * MB), depth=(4, 4, 2, 2, 4),
                    flops=(3 * 10**9, 10**9, 10**7, 10**7, 7 * 10**8),
                    act_bytes=(30 * MB, 17 * MB, 16 * MB, 16 * MB, 25 * MB))


def encoder_scheduler(overhead: int = 15 * MB) -> Scheduler:
    return Scheduler(ENCODER, DELAY, MemoryModel(overhead, act_factor=1.0))


def check_allowance(sched: Scheduler, bounds, pinned, budget, ahead, wrap):
    """Bytes read ahead during block k, less the blocks consumed since, fit every later block."""
    spans = list(zip(bounds[:-1], bounds[1:]))
    weights = [0 if p else sched.w(*s) for s, p in zip(spans, pinned)]
    room = budget - sched.memory.overhead_bytes - sum(sched.w(*s) for s, p in zip(spans, pinned) if p)
    carried = sched.wrap_block(pinned, 2) if wrap else None
    for k in range(len(spans)):
        assert sched.act(*spans[k]) + weights[k] + ahead[k] <= room
        later = list(range(k + 1, len(spans))) + (list(range(carried + 1)) if carried is not None else [])
        consumed = 0
        for j in later:
            consumed += weights[j]
            assert max(0, ahead[k] - consumed) + sched.act(*spans[j]) + weights[j] <= room, (k, j)


@pytest.mark.parametrize("budget_mb", [62, 66, 70, 80])
def test_ahead_limits_are_time_varying_and_feasible(budget_mb):
    sched = encoder_scheduler()
    budget = budget_mb * MB
    bounds, pinned = tuple(range(sched.n + 1)), (False,) * sched.n
    for wrap in (False, True):
        ahead = sched.ahead_limits(bounds, pinned, budget, wrap)
        assert ahead is not None
        check_allowance(sched, bounds, pinned, budget, ahead, wrap)
        latency, peak = sched.predict_streamed(bounds, pinned, ahead, wrap)
        assert peak <= budget
    # The allowance follows the activations: more read-ahead behind the small-activation atoms.
    ahead = sched.ahead_limits(bounds, pinned, budget)
    assert ahead[1] > ahead[0]


def test_streaming_reaches_prefetch_that_whole_blocks_cannot():
    sched = encoder_scheduler()
    budget = 60 * MB  # 45 MB for weights + activations: the 24 MB atom never fits whole next to atom 2
    bounds, pinned = tuple(range(sched.n + 1)), (False,) * sched.n
    whole_latency, whole_peak = sched.predict(bounds, pinned, 2)
    assert whole_peak > budget  # whole-block prefetch of the finest grouping does not fit here
    ahead = sched.ahead_limits(bounds, pinned, budget, wrap=True)
    streamed_latency, streamed_peak = sched.predict_streamed(bounds, pinned, ahead, wrap=True)
    assert streamed_peak <= budget
    no_prefetch, _ = sched.predict(bounds, pinned, 1)
    assert streamed_latency < no_prefetch
    plan = sched.plan(budget)
    assert plan.predicted_peak_bytes <= budget
    assert plan.ahead is not None  # the fastest fitting plan streams
    assert plan.predicted_ms <= no_prefetch * 1e3


def test_ahead_limits_reject_a_block_that_does_not_fit_and_lut_stays_monotonic():
    sched = encoder_scheduler()
    bounds, pinned = (0, 5), (False,)
    assert sched.ahead_limits(bounds, pinned, 60 * MB) is None  # 50 MB weights + 30 MB acts
    lut = LookupTable(sched, levels=16)
    latencies = [ms for _, ms in lut.latency_table()]
    assert all(b <= a * (1 + 1e-9) for a, b in zip(latencies, latencies[1:]))
    assert all(p.predicted_peak_bytes <= level for level, p in zip(lut.levels, lut.partitions))


def test_wrap_counts_the_carried_block_at_the_last_block():
    sched = encoder_scheduler()
    bounds, pinned = tuple(range(sched.n + 1)), (False,) * sched.n
    _, plain = sched.predict(bounds, pinned, 2)
    t_wrap, wrapped = sched.predict(bounds, pinned, 2, wrap=True)
    t_plain, _ = sched.predict(bounds, pinned, 2)
    last = sched.act(4, 5) + sched.w(4, 5) + sched.w(0, 1) + sched.memory.overhead_bytes
    assert wrapped == max(plain, last)
    assert t_wrap < t_plain  # the first block's load no longer opens the frame
    assert Scheduler.wrap_block((True, False, False), 2) == 1
    assert Scheduler.wrap_block((False,), 2) is None and Scheduler.wrap_block((False, False), 1) is None


# ------------------------------------------------------------------------------ pipeline
@pytest.fixture(scope="module")
def executor(tmp_path_factory):
    root = tmp_path_factory.mktemp("stream")
    model = conv_chain(root / "chain.onnx", channels=(3, 32, 64, 64, 32))
    store = prepare(model, root / "store", max_atoms=4)
    ex = SwappedExecutor(store, budget_mb=None, threads=1, delay=DELAY)
    yield ex, model
    ex.close()


def force_streamed(ex: SwappedExecutor, budget: int | None, wrap: bool, feeds,
                   pinned: tuple[bool, ...] | None = None) -> blocks.Partition:
    """Install a one-atom-per-block streamed partition (``budget`` None: the minimum plus every
    atom's span, i.e. room to stream everything)."""
    shapes = {k: tuple(v.shape) for k, v in feeds.items()}
    ex.run(feeds)  # settle the tables for this input size
    sched = ex._table(shapes)[0]
    bounds = tuple(range(sched.n + 1))
    pinned = pinned or (False,) * sched.n
    if budget is None:
        budget = sched.min_budget_bytes() + sum(e.span_bytes for e in ex.store.atoms)
    ahead = sched.ahead_limits(bounds, pinned, budget, wrap)
    assert ahead is not None
    partition = blocks.Partition(bounds, pinned, resident_limit=2, wrap=wrap, ahead=ahead).build(
        [e.atom for e in ex.store.atoms])
    with ex._lock:
        ex.partition = partition
        ex.pipeline.apply(partition)
    return partition


@pytest.mark.parametrize("wrap", [False, True])
def test_streamed_frames_stay_within_the_allowance_and_outputs_match(executor, monkeypatch, wrap):
    ex, model = executor
    monkeypatch.setattr(pipeline, "STREAM_CHUNK", 8192)  # several chunks per atom
    feeds = image(48, 64, seed=3)
    reference = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(["prob"], feeds)[0]
    spans = [e.span_bytes for e in ex.store.atoms]
    offsets = [e.span_offset for e in ex.store.atoms]
    loaded = dict.fromkeys(range(len(spans)), 0)
    read, release = ex.reader.read_into, ex.pipeline.arena.release

    def counting_read(view, offset):
        atom = max(i for i, start in enumerate(offsets) if start <= offset)
        loaded[atom] += len(view)
        return read(view, offset)

    def counting_release(offset, nbytes):
        for i, start in enumerate(ex.arena_offsets):
            if start == offset:
                loaded[i] = 0
        return release(offset, nbytes)

    monkeypatch.setattr(ex.reader, "read_into", counting_read)
    monkeypatch.setattr(ex.pipeline.arena, "release", counting_release)
    # A budget between one atom at a time and all weights resident, so the allowance binds.
    sched = ex._table({"image": (1, 3, 48, 64)})[0]
    total = sum(spans)
    for budget in (sched.min_budget_bytes() + total // 3, sched.min_budget_bytes() + total):
        partition = force_streamed(ex, budget, wrap, feeds)
        ahead_seen = []
        run_atom = ex._run_atom

        def checking_run(i, env, partition=partition):
            k = next(b for b, block in enumerate(partition.blocks) if i in block.atoms)
            ahead_seen.append((k, sum(v for j, v in loaded.items() if j != i)))
            return run_atom(i, env)

        monkeypatch.setattr(ex, "_run_atom", checking_run)
        for _ in range(3):
            out = ex.run(feeds)["prob"]
            np.testing.assert_allclose(out, reference, rtol=1e-4, atol=1e-5)
            assert ex.stats()["streamed"]
        monkeypatch.setattr(ex, "_run_atom", run_atom)
        assert ahead_seen and all(seen <= partition.ahead[k] for k, seen in ahead_seen), ahead_seen
        ex.pipeline.drain()
        carried = set(partition.blocks[0].atoms) if wrap else set()
        assert ex.pipeline.resident_atoms() <= carried
    # A new partition drops whatever the stream left resident.
    ex.set_budget(None)
    force_streamed(ex, sched.min_budget_bytes() + total // 3, wrap, feeds)
    assert ex.pipeline.resident_atoms() == set()


def test_executor_chooses_streaming_and_matches_at_two_budgets(executor):
    ex, model = executor
    feeds = image(48, 64, seed=4)
    reference = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(["prob"], feeds)[0]
    ex.run(feeds)
    lut = ex._table({"image": (1, 3, 48, 64)})[1]
    streamed = [level for level, p in zip(lut.levels, lut.partitions) if p.ahead is not None]
    budgets = [lut.levels[0], *streamed[:1], lut.levels[-1]]
    for level in budgets:
        ex.set_budget(level / MB)
        for _ in range(2):
            np.testing.assert_allclose(ex.run(feeds)["prob"], reference, rtol=1e-4, atol=1e-5)
        assert ex.partition.predicted_peak_bytes <= level


def test_streaming_can_be_switched_off(executor, monkeypatch):
    ex, _ = executor
    store = ex.store
    monkeypatch.setenv("DYNNET_SWAP_STREAM", "0")
    off = SwappedExecutor(store, budget_mb=None, threads=1, delay=DELAY)
    try:
        feeds = image(48, 64, seed=5)
        off.run(feeds)
        lut = off._table({"image": (1, 3, 48, 64)})[1]
        assert not off.stream and all(p.ahead is None for p in lut.partitions)
    finally:
        off.close()


def test_streamed_frames_with_a_pinned_block_between_swapped_ones(executor):
    ex, model = executor
    feeds = image(40, 56, seed=6)
    reference = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(["prob"], feeds)[0]
    n = len(ex.store.atoms)
    pinned = tuple(i == 1 for i in range(n))
    force_streamed(ex, None, True, feeds, pinned)
    for _ in range(3):
        np.testing.assert_allclose(ex.run(feeds)["prob"], reference, rtol=1e-4, atol=1e-5)
    ex.pipeline.drain()
    assert 1 in ex.pipeline.resident_atoms()  # the pinned atom stays
    assert ex.pipeline.resident_atoms() <= {0, 1}  # plus at most the wrapped first block
    ex.set_budget(None)


def test_an_error_mid_frame_drops_the_stream_and_the_next_frame_works(executor, monkeypatch):
    ex, model = executor
    feeds = image(40, 56, seed=7)
    reference = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(["prob"], feeds)[0]
    force_streamed(ex, None, True, feeds)
    run_atom = ex._run_atom

    def failing(i, env):
        if i == 1:
            raise RuntimeError("atom failed")
        return run_atom(i, env)

    monkeypatch.setattr(ex, "_run_atom", failing)
    with pytest.raises(RuntimeError, match="atom failed"):
        ex.run(feeds)
    assert ex.pipeline.resident_atoms() == set() and not ex.pipeline._touched
    monkeypatch.setattr(ex, "_run_atom", run_atom)
    np.testing.assert_allclose(ex.run(feeds)["prob"], reference, rtol=1e-4, atol=1e-5)
    ex.set_budget(None)


def test_bound_outputs_match_and_wrong_shapes_fall_back(executor):
    ex, model = executor
    feeds = image(40, 56, seed=8)
    reference = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(["prob"], feeds)[0]
    ex.set_budget(None)
    assert ex.bind_outputs
    np.testing.assert_allclose(ex.run(feeds)["prob"], reference, rtol=1e-4, atol=1e-5)
    specs = ex._specs_for({"image": (1, 3, 40, 56)})
    assert specs is ex._run_specs and all(s is not None for s in specs)
    assert specs[-1]["prob"] == ((1, 1, 40, 56), np.dtype(np.float32))
    # A wrong inferred shape (as for a data-dependent output): onnxruntime refuses the binding,
    # the atom falls back to its own allocation and the frame is still right.
    name = next(iter(specs[0]))
    shape, dtype = specs[0][name]
    specs[0][name] = (tuple(d + 1 for d in shape), dtype)
    np.testing.assert_allclose(ex.run(feeds)["prob"], reference, rtol=1e-4, atol=1e-5)
    assert ex._run_specs[0] is None
