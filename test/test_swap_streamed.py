"""Streamed weights: the planned engine under a budget, on every zoo model and in both layouts."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from _swap_models import check_equal, zoo_case

from dynnet_ros.commands.swap_bench_worker import cached_bytes_of, make_feeds
from dynnet_ros.engine import Engine
from dynnet_ros.zoo import MODEL_NAMES, ensure_model

pytestmark = pytest.mark.slow

SIZES = [(96, 128), (64, 96)]


@pytest.fixture(autouse=True)
def isolated(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("DYNNET_SWAP_DIR", str(tmp_path_factory.getbasetemp() / "swap-stores"))


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_streamed_outputs_equal_in_memory_at_two_budgets_and_two_sizes(name):
    engine, feeds, want, names = zoo_case(name, SIZES)
    engine.run(feeds[SIZES[0]])
    top = engine.latency_table()[-1][0]
    engine.set_memory_budget(top * 0.999)  # below the in-memory level: streamed, every weight resident
    swap = engine.stats()["swap"]
    assert engine.stats()["executor"] == "swap" and swap["mode"] == "stream", swap
    for size in SIZES:
        check_equal(engine.run(feeds[size]), want[size], names)
    # budgets are judged at the input size run: one that serves both sizes covers the larger minimum
    minimum = max(engine.min_budget_mb({name: value.shape for name, value in feeds[size].items()})
                  for size in SIZES)
    for budget in (minimum * 1.001, minimum + 0.5 * (top - minimum)):
        engine.set_memory_budget(budget)
        for size in SIZES + SIZES[:1]:
            check_equal(engine.run(feeds[size]), want[size], names)
    # at the minimum, weights really are read per frame and most are not resident
    engine.set_memory_budget(engine.min_budget_mb() * 1.001)
    engine.run(feeds[SIZES[0]])
    stats = engine.stats()["swap"]
    assert stats["allowance_bytes"] < stats["weight_span_bytes"]
    assert stats["last_frame_read_mb"] > 0
    assert stats["resident_weight_bytes"] <= stats["allowance_bytes"]
    engine.close()


def test_budget_change_resizes_the_window_without_a_rebuild():
    engine = Engine(str(ensure_model("multiexit")), threads=1)
    feeds = make_feeds(engine.inputs, 96, 128, seed=2)
    engine.run(feeds)
    engine.set_memory_budget(engine.latency_table()[-1][0] * 0.999)
    streamed = engine._swap.streamed
    engine.run(feeds)
    low = engine.min_budget_mb() * 1.001
    engine.set_memory_budget(low)
    small = engine.stats()["swap"]["allowance_bytes"]
    engine.set_memory_budget(None)  # unlimited: every weight resident, same executor
    assert engine._swap.streamed is streamed and engine.memory_budget_mb is None
    assert engine.stats()["swap"]["allowance_bytes"] == engine.stats()["swap"]["weight_span_bytes"] > small
    engine.run(feeds)  # reads what was not resident, once
    engine.run(feeds)
    assert engine.stats()["swap"]["last_frame_read_mb"] == 0  # nothing streamed once all are resident
    engine.close()


def test_budget_below_minimum_is_rejected_and_previous_kept():
    engine = Engine(str(ensure_model("lane")), threads=1)
    feeds = make_feeds(engine.inputs, 96, 128, seed=3)
    engine.run(feeds)
    with pytest.raises(ValueError, match="below this model's minimum"):  # refused before any build
        engine.set_memory_budget(1.0)
    assert engine.memory_budget_mb is None and engine._swap.streamed is None
    engine.set_memory_budget(engine.latency_table()[-1][0] * 0.999)
    engine.run(feeds)
    budget = engine.memory_budget_mb
    allowance = engine.stats()["swap"]["allowance_bytes"]
    minimum = engine.min_budget_mb()
    with pytest.raises(ValueError, match="below this model's minimum"):
        engine.set_memory_budget(minimum * 0.9)
    assert engine.memory_budget_mb == budget
    assert engine.stats()["swap"]["allowance_bytes"] == allowance
    engine.close()


def test_engine_built_with_a_budget_streams_from_the_start_and_keeps_the_page_cache_clean():
    from dynnet_ros.procmem import status_bytes

    path = str(ensure_model("depth"))
    probe = Engine(path, threads=1)
    feeds = make_feeds(probe.inputs, 96, 128, seed=4)
    probe.close()
    baseline = status_bytes("VmRSS")
    engine = Engine(path, threads=1, memory_budget_mb=400)
    assert engine.stats()["executor"] == "swap"
    engine.run(feeds)
    engine.set_memory_budget(engine.min_budget_mb() * 1.001)
    for _ in range(3):
        engine.run(feeds)
    swap = engine.stats()["swap"]
    assert swap["last_frame_read_mb"] * 2**20 >= 0.5 * swap["weight_bytes"]
    weights = f"{swap['store']}/weights.bin"
    assert cached_bytes_of(weights) <= 0.1 * swap["weight_bytes"]
    growth = status_bytes("VmRSS") - baseline
    assert growth < swap["nonweight_bytes"] + swap["weight_bytes"]  # not all weights are in memory
    engine.close()


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_damaged_weight_file_is_detected_and_rebuilt(damage):
    from dynnet_ros.engine.modelio.loader import load_skeleton
    from dynnet_ros.swap.streamed import prepare_weight_file
    from dynnet_ros.swap.weight_file import StoreError, WeightFile

    model = load_skeleton(str(ensure_model("lane")))
    weights, _ = prepare_weight_file(model)
    path = weights.weights_path
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        path.write_bytes(bytes(data[: len(data) // 2]))
        reason = "truncated"
    else:
        tensor = max(weights.tensors.values(), key=lambda t: t.nbytes)
        data[tensor.offset + 17] ^= 0x40
        path.write_bytes(bytes(data))
        reason = "checksum mismatch"
    with pytest.raises(StoreError, match=reason):
        WeightFile(weights.directory).verify()
    rebuilt, why = prepare_weight_file(model)
    assert why is not None and reason in why
    rebuilt.verify()
    assert rebuilt.weights_path.stat().st_size == weights.size


@pytest.mark.parametrize("trans_b", [0, 1])
def test_split_fully_connected_layers_compute_the_same(trans_b):
    import onnx
    from onnx import helper, numpy_helper

    from dynnet_ros.swap.gemm_split import split_large_gemms

    rng = np.random.default_rng(trans_b)
    k, n = 64, 300
    w = rng.standard_normal((n, k) if trans_b else (k, n)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=trans_b), helper.make_node("Relu", ["y"], ["z"])],
        "fc", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, k])],
        [helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, [2, n])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    x = rng.standard_normal((2, k)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    split = onnx.ModelProto()
    split.CopyFrom(model)
    slices = split_large_gemms(split, max_bytes=w.nbytes // 3 - 1)  # just over 3 pieces: 4
    assert sum(1 for node in split.graph.node if node.op_type == "Gemm") == 4
    sources = {"w": w, "b": b}
    for tensor in split.graph.initializer:  # fill the placeholders from their slices, as the store writer does
        piece = slices.get(tensor.name)
        if piece is not None:
            index = [slice(None)] * sources[piece.source].ndim
            index[piece.axis] = slice(piece.start, piece.stop)
            tensor.CopyFrom(numpy_helper.from_array(np.ascontiguousarray(sources[piece.source][tuple(index)]),
                                                    tensor.name))
    got = ort.InferenceSession(split.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _mlp(path, rng) -> str:
    """Four 4 MB fully-connected layers: no convolution, so onnxruntime has no blocked layout."""
    import onnx
    from onnx import helper, numpy_helper

    weights = [(rng.standard_normal((1024, 1024)) / 32).astype(np.float32) for _ in range(4)]
    nodes, prev = [], "x"
    for k in range(4):
        nodes += [helper.make_node("MatMul", [prev, f"w{k}"], [f"m{k}"]),
                  helper.make_node("Relu", [f"m{k}"], [f"r{k}"])]
        prev = f"r{k}"
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 1024])],
                              [helper.make_tensor_value_info(prev, onnx.TensorProto.FLOAT, ["N", 1024])],
                              [numpy_helper.from_array(w, f"w{k}") for k, w in enumerate(weights)])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return str(path)


def _streams_within_budget(engine, feeds: dict, want: list, names: list[str]) -> None:
    """At the minimum budget the window reads weights every frame, holds less than all of them,
    what the engine holds stays inside the budget, and the outputs stay onnxruntime's."""
    engine.set_memory_budget(engine.min_budget_mb() * 1.001)
    for _ in range(3):
        check_equal(engine.run(feeds), want, names)
    stats = engine.engine_stats()
    window = stats.window
    assert stats.executor == "swap" and window is not None and window.layout == "as-given"
    assert window.allowance_bytes < window.weight_span_bytes
    assert window.last_frame_read_bytes > 0 and window.resident_weight_bytes <= window.allowance_bytes
    assert window.nonweight_bytes + window.resident_weight_bytes <= engine.memory_budget_mb * 2**20


def test_a_model_without_the_blocked_layout_streams_the_model_as_given(tmp_path):
    rng = np.random.default_rng(5)
    path = _mlp(tmp_path / "mlp.onnx", rng)
    x = rng.standard_normal((4, 1024)).astype(np.float32)
    reference = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [o.name for o in reference.get_outputs()]
    want = reference.run(names, {"x": x})
    engine = Engine(path, threads=1)
    check_equal(engine.run({"x": x}), want, names)
    in_memory = engine.engine_stats().executor   # the planned engine, or one session where cuts save nothing
    with pytest.raises(ValueError, match="below this model's minimum"):
        engine.set_memory_budget(1.0)  # refused before anything is built: still in memory
    assert engine.memory_budget_mb is None and engine.engine_stats().executor == in_memory
    engine.set_memory_budget(engine.latency_table()[-1][0] * 0.999)
    _streams_within_budget(engine, {"x": x}, want, names)
    engine.close()


@pytest.mark.parametrize("name", ["lane", "depth"])
def test_the_as_given_layout_streams_through_the_same_window(name):
    """Forced onto the model as given (what a CPU without NCHWc kernels runs): same window."""
    path = str(ensure_model(name))
    reference = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [o.name for o in reference.get_outputs()]
    engine = Engine(path, threads=1, layout="as-given", swappable=True)
    feeds = make_feeds(engine.inputs, *SIZES[0], seed=1)
    want = reference.run(names, feeds)
    check_equal(engine.run(feeds), want, names)
    assert engine.engine_stats().window.layout == "as-given"
    _streams_within_budget(engine, feeds, want, names)
    engine.close()


@pytest.mark.parametrize("name", ["lane", "depth"])
def test_batches_stream_through_the_window_at_their_own_minimum(name):
    """Batches of 1, 2 and 4 frames (the zoo's batching models): the minimum grows with the batch,
    and under a budget that holds batch 4 every batch size equals onnxruntime's output."""
    path = str(ensure_model(name))
    reference = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [o.name for o in reference.get_outputs()]
    engine = Engine(path, threads=1, swappable=True,
                    input_shapes={i.name: (4, i.shape[1], *SIZES[0]) for i in reference.get_inputs()})
    one = make_feeds(engine.inputs, *SIZES[0], seed=5)
    feeds = {batch: {key: np.concatenate([one[key] * (i + 1) / batch for i in range(batch)]) for key in one}
             for batch in (1, 2, 4)}
    minimum = {batch: engine.min_budget_mb({k: v.shape for k, v in f.items()}) for batch, f in feeds.items()}
    assert minimum[1] < minimum[2] < minimum[4]
    engine.set_memory_budget(minimum[4] * 1.001)
    for batch in (4, 1, 2, 4):
        check_equal(engine.run(feeds[batch]), reference.run(names, feeds[batch]), names)
    assert engine.stats()["executor"] == "swap" and engine.stats()["over_budget"] is None
    engine.close()


def test_budgets_on_other_backends_are_refused_with_the_reason():
    engine = Engine(str(ensure_model("lane")), backend="ort", threads=1)
    with pytest.raises(ValueError, match="cpu backend only"):
        engine.set_memory_budget(500)
    assert engine.memory_budget_mb is None and engine.engine_stats().executor == "cpu"
    engine.close()


@pytest.mark.parametrize("name", ["multiexit", "depth"])
def test_random_budget_changes_between_frames_never_stall(name):
    """Budgets from the minimum to unlimited, at random between frames of three sizes: every
    frame completes and matches the in-memory output (a stalled window would hang here)."""
    import random
    import threading

    sizes = [(96, 128), (128, 160), (64, 96)]
    engine, feeds, want, names = zoo_case(name, sizes)
    engine.set_memory_budget(None)
    engine.run(feeds[sizes[0]])
    rng = random.Random(3)
    done = threading.Event()
    failures: list[BaseException] = []

    def frames():
        try:
            engine.set_memory_budget(engine.latency_table()[-1][0] * 0.999)
            for i in range(24):
                if i % 2 == 0:
                    low, top = engine.min_budget_mb(), engine.latency_table()[-1][0]
                    engine.set_memory_budget(rng.choice([low * 1.02, (low + top) / 2, top, None]))
                size = rng.choice(sizes)
                check_equal(engine.run(feeds[size]), want[size], names)
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)
        done.set()

    worker = threading.Thread(target=frames, daemon=True)
    worker.start()
    worker.join(timeout=180)
    assert done.is_set(), "a frame stalled"
    assert not failures, failures
    engine.close()


def test_engine_refused_at_construction_leaves_no_executor_behind():
    import threading

    def windows() -> int:
        return sum(1 for t in threading.enumerate() if t.name == "weight-window")

    before = windows()
    with pytest.raises(ValueError, match="below this model's minimum"):
        Engine(str(ensure_model("lane")), threads=1, memory_budget_mb=1.0)
    assert windows() == before
