"""The Engine accepts exactly the feeds onnxruntime accepts (engine/modelio/feeds.py), runs them with equal
outputs, and refuses the rest with a ValueError that names an input.

One hand-built model per rule of onnxruntime's input check, then a differential fuzzer that
feeds random valid and invalid inputs to both.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper as h

from dynnet_ros.engine import Engine
from dynnet_ros.engine.modelio.feeds import FeedCheck, plan_breach, validate_feeds
from dynnet_ros.engine.modelio.models import default_specs, input_specs

Dim = int | str | None


def tensor(name: str, elem: int, dims: list[Dim] | None) -> onnx.ValueInfoProto:
    """A tensor value info; dims: int (a value, -1 included), str (a dim_param, "" too), None
    (neither field set); ``dims=None``: no shape at all."""
    value = h.make_tensor_value_info(name, elem, None)
    if dims is not None:
        shape = value.type.tensor_type.shape
        shape.SetInParent()  # rank 0 is an empty shape, not a missing one
        for d in dims:
            dim = shape.dim.add()
            if isinstance(d, int):
                dim.dim_value = d
            elif isinstance(d, str):
                dim.dim_param = d
    return value


def model(nodes, inputs, outputs, initializers=(), opset: int = 17, extra_opsets=()) -> onnx.ModelProto:
    proto = h.make_model(h.make_graph(nodes, "feeds", inputs, outputs, list(initializers)),
                         opset_imports=[h.make_opsetid("", opset), *extra_opsets])
    proto.ir_version = 8
    onnx.checker.check_model(proto)
    return proto


class Pair:
    """One model in an Engine and in a plain onnxruntime session, built once."""

    def __init__(self, proto: onnx.ModelProto) -> None:
        self.proto = proto
        self.engine = Engine(proto)
        self.session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
        self.names = [v.name for v in proto.graph.input]

    def ort_run(self, feeds: dict[str, Any]) -> list | Exception:
        try:
            return self.session.run(None, dict(feeds))
        except Exception as exc:  # noqa: BLE001 - any refusal of onnxruntime's counts as one
            return exc

    def check(self, feeds: dict[str, Any]) -> str:
        """Same verdict as onnxruntime, equal outputs when it runs; returns "ran" or "refused"."""
        expected = self.ort_run(feeds)
        if isinstance(expected, Exception):
            with pytest.raises(ValueError) as info:
                self.engine.run(feeds)
            message = str(info.value)
            assert any(f"'{n}'" in message or f"{n}:" in message or f"'{n}'" in repr(message)
                       for n in [*self.names, *map(str, feeds)]), message
            return "refused"
        outputs = self.engine.run(feeds)
        assert list(outputs) == [o.name for o in self.proto.graph.output]
        # an empty input whose dim name is bound to another size elsewhere (a Concat of [1, 3] and
        # [0, 1]) is taken by onnxruntime, which leaves the output's part from it unwritten:
        # uninitialised memory, in its session as in ours, so only the shapes can agree
        unwritten = plan_breach(input_specs(self.proto), feeds) is not None and \
            any(isinstance(v, np.ndarray) and v.size == 0 for v in feeds.values())
        for got, want in zip(outputs.values(), expected):
            assert np.shape(got) == np.shape(want)
            if not unwritten:
                np.testing.assert_array_equal(got, want)  # element-wise ops only: bit-identical
        return "ran"


def f32(*shape: int, value: float = 1.5) -> np.ndarray:
    return np.full(shape, value, np.float32)


# ------------------------------------------------------------------ one fixture per rule
@pytest.fixture(scope="module")
def minus_one() -> Pair:
    return Pair(model([h.make_node("Relu", ["x"], ["y"])], [tensor("x", T.FLOAT, [-1, 3])],
                      [tensor("y", T.FLOAT, [-1, 3])]))


def test_minus_one_dims_take_any_size(minus_one):
    assert input_specs(minus_one.engine.proto)[0].dims == (None, 3)
    for batch in (1, 4, 0):
        assert minus_one.check({"x": f32(batch, 3)}) == "ran"
    assert minus_one.check({"x": f32(2, 4)}) == "refused"


def test_dims_without_value_or_name_and_empty_dim_param():
    pair = Pair(model([h.make_node("Relu", ["x"], ["y"])], [tensor("x", T.FLOAT, [None, ""])],
                      [tensor("y", T.FLOAT, [None, ""])]))
    assert pair.proto.graph.input[0].type.tensor_type.shape.dim[1].HasField("dim_param")
    for shape in [(2, 5), (3, 1), (1, 7)]:
        assert pair.check({"x": f32(*shape)}) == "ran"
    assert pair.check({"x": f32(2)}) == "refused"


def test_rank0_inputs_take_scalars_and_what_onnxruntime_lets_through():
    # onnxruntime checks no shape for a rank-0 input: (1,) broadcasts here, (2,) fails in Mul
    pair = Pair(model([h.make_node("Mul", ["a", "s"], ["y"])],
                      [tensor("a", T.FLOAT, ["N"]), tensor("s", T.FLOAT, [])], [tensor("y", T.FLOAT, ["N"])]))
    assert pair.check({"a": f32(3), "s": np.array(2.0, np.float32)}) == "ran"
    assert pair.check({"a": f32(3), "s": f32(1, value=2.0)}) == "ran"
    assert pair.check({"a": f32(3), "s": f32(2)}) == "refused"
    assert pair.check({"a": f32(3), "s": 2.0}) == "refused"             # a Python float: onnxruntime refuses it
    assert pair.check({"a": f32(3), "s": np.float32(2.0)}) == "refused"  # so is a numpy scalar


def test_inputs_without_a_shape_take_any_rank():
    # onnx's checker refuses a graph input without a shape (onnxruntime loads it), so an Engine
    # never holds such a model: the validation itself is compared with onnxruntime's
    proto = h.make_model(h.make_graph([h.make_node("Relu", ["x"], ["y"])], "feeds", [tensor("x", T.FLOAT, None)],
                                      [tensor("y", T.FLOAT, None)]),
                         opset_imports=[h.make_opsetid("", 17)], ir_version=8)
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    specs = input_specs(proto)
    assert specs[0].any_shape and "any shape" in specs[0].describe()
    for shape in [(), (4,), (2, 3, 4)]:
        x = f32(*shape, value=-1.0)
        assert validate_feeds(specs, {"x": x})["x"].shape == session.run(None, {"x": x})[0].shape == shape
    with pytest.raises(ValueError, match="dtype int64"):
        validate_feeds(specs, {"x": np.zeros(2, np.int64)})


def test_a_zero_dim_value_takes_only_empty_tensors():
    pair = Pair(model([h.make_node("Relu", ["x"], ["y"])], [tensor("x", T.FLOAT, [0, 2])],
                      [tensor("y", T.FLOAT, [0, 2])]))
    assert pair.check({"x": f32(0, 2)}) == "ran"
    assert pair.check({"x": f32(1, 2)}) == "refused"


def test_inputs_with_an_initializer_default_may_be_left_out_or_fed():
    pair = Pair(model([h.make_node("Add", ["x", "b"], ["y"])], [tensor("x", T.FLOAT, [2]), tensor("b", T.FLOAT, [2])],
                      [tensor("y", T.FLOAT, [2])], [h.make_tensor("b", T.FLOAT, [2], [10.0, 20.0])]))
    assert pair.check({"x": f32(2)}) == "ran"
    assert pair.check({"x": f32(2), "b": f32(2, value=-3.0)}) == "ran"
    assert pair.check({"x": f32(2), "b": f32(3)}) == "refused"
    with pytest.raises(ValueError, match="'b'"):
        pair.engine.run({"x": f32(2), "b": np.zeros(2, np.float64)})


def test_optional_inputs_may_be_left_out():
    optional = h.make_value_info("x", h.make_optional_type_proto(h.make_tensor_type_proto(T.FLOAT, [2])))
    pair = Pair(model([h.make_node("OptionalHasElement", ["x"], ["has"])], [optional],
                      [tensor("has", T.BOOL, [])], opset=18))
    assert pair.engine.plain_reason is not None and "optional" in pair.engine.plain_reason
    assert pair.check({}) == "ran"
    assert pair.check({"x": None}) == "ran"
    assert pair.check({"x": f32(2)}) == "ran"
    assert pair.engine.run({"x": f32(2)})["has"] and not pair.engine.run({})["has"]


def test_sequence_inputs_run_through_onnxruntime_or_are_refused_naming_the_input():
    sequence = h.make_value_info("s", h.make_sequence_type_proto(h.make_tensor_type_proto(T.FLOAT, None)))
    pair = Pair(model([h.make_node("ConcatFromSequence", ["s"], ["y"], axis=0)], [sequence],
                      [tensor("y", T.FLOAT, [None])]))
    assert pair.engine.backend == "ort" and "sequence" in (pair.engine.plain_reason or "")
    assert pair.check({"s": [f32(2), f32(3, value=0.5)]}) == "ran"
    assert pair.check({"s": f32(2, 2)}) == "refused"


def test_map_inputs_run_through_onnxruntime():
    mapping = h.make_value_info("m", h.make_map_type_proto(T.INT64, h.make_tensor_type_proto(T.FLOAT, None)))
    pair = Pair(model([h.make_node("DictVectorizer", ["m"], ["y"], domain="ai.onnx.ml", int64_vocabulary=[1, 2, 3])],
                      [mapping], [tensor("y", T.FLOAT, [1, 3])], extra_opsets=[h.make_opsetid("ai.onnx.ml", 3)]))
    assert pair.check({"m": {1: 0.5, 3: 2.0}}) == "ran"
    assert pair.engine.run({"m": {2: 4.0}})["y"].tolist() == [[0.0, 4.0, 0.0]]


@pytest.fixture(scope="module")
def shared_symbol() -> Pair:
    return Pair(model([h.make_node("Add", ["a", "b"], ["y"])],
                      [tensor("a", T.FLOAT, ["N"]), tensor("b", T.FLOAT, ["N"])], [tensor("y", T.FLOAT, ["N"])]))


def test_one_symbol_bound_to_two_sizes_runs_where_onnxruntime_runs_it(shared_symbol):
    # onnxruntime does not hold feeds to the model's dim names; the planned engine's plan does,
    # so those feeds go to plain onnxruntime
    assert shared_symbol.check({"a": f32(3), "b": f32(1)}) == "ran"
    assert shared_symbol.check({"a": f32(3), "b": f32(2)}) == "refused"
    assert shared_symbol.check({"a": f32(3), "b": f32(3)}) == "ran"
    assert shared_symbol.engine.stats()["runs"] == 2


@pytest.mark.parametrize("feeds, fragment", [
    ({"a": f32(3)}, "missing input"),
    ({"a": f32(3), "b": f32(3), "c": f32(3)}, "unknown input"),
    ({"a": np.ones(3, np.float64), "b": f32(3)}, "dtype float64"),
    ({"a": f32(3), "b": f32(3, 1)}, "rank 2"),
    ({"a": (1.0, 2.0, 3.0), "b": f32(3)}, "numpy array"),
    ({"a": [[1.0], [2.0, 3.0]], "b": f32(2)}, "list"),
])
def test_refusals_name_the_input(shared_symbol, feeds, fragment):
    assert shared_symbol.check(feeds) == "refused"
    with pytest.raises(ValueError, match=fragment):
        shared_symbol.engine.run(feeds)


def test_lists_and_strided_arrays_convert_as_in_onnxruntime(shared_symbol):
    assert shared_symbol.check({"a": [1, 2, 3], "b": f32(3)}) == "ran"
    assert shared_symbol.check({"a": np.arange(6, dtype=np.float32)[::2], "b": f32(3)}) == "ran"


def test_a_foreign_byte_order_is_read_as_its_values(shared_symbol):
    # onnxruntime accepts big-endian arrays but does not always swap their bytes: the engine
    # converts them, so the values are the array's
    out = shared_symbol.engine.run({"a": np.arange(3, dtype=">f4"), "b": f32(3)})
    np.testing.assert_array_equal(out["y"], np.arange(3, dtype=np.float32) + 1.5)


# ------------------------------------------------------------------ differential fuzzer
def _fuzz_model() -> onnx.ModelProto:
    """Inputs of every declared kind: a[N, 3], b[N, -1], s[] (rank 0), w[3] (initializer default)."""
    return model(
        [h.make_node("Relu", ["a"], ["r"]), h.make_node("Concat", ["r", "b"], ["y"], axis=1),
         h.make_node("Mul", ["a", "s"], ["z"]), h.make_node("Add", ["a", "w"], ["u"])],
        [tensor("a", T.FLOAT, ["N", 3]), tensor("b", T.FLOAT, ["N", -1]), tensor("s", T.FLOAT, []),
         tensor("w", T.FLOAT, [3])],
        [tensor("y", T.FLOAT, ["N", None]), tensor("z", T.FLOAT, ["N", 3]), tensor("u", T.FLOAT, ["N", 3])],
        [h.make_tensor("w", T.FLOAT, [3], [1.0, -2.0, 0.5])])


@pytest.fixture(scope="module")
def fuzz_pair() -> Pair:
    return Pair(_fuzz_model())


DECLARED_RANK = {"a": 2, "b": 2, "s": 0, "w": 1}


@st.composite
def feeds(draw) -> dict[str, Any]:
    out: dict[str, Any] = {}
    batch = draw(st.integers(0, 3))
    for name, rank in DECLARED_RANK.items():
        presence = draw(st.sampled_from(["fed"] * 6 + ["absent"]))
        if presence == "absent":
            continue
        if draw(st.integers(0, 4)) == 0:  # sometimes the wrong rank
            rank = draw(st.integers(0, 3))
        shape = [batch if axis == 0 and draw(st.booleans()) else draw(st.integers(0, 4)) for axis in range(rank)]
        if name in ("a", "w") and rank >= 1 and draw(st.integers(0, 2)):
            shape[-1] = 3  # mostly the declared size
        dtype = draw(st.sampled_from([np.float32] * 8 + [np.float64, np.int64]))
        seed = draw(st.integers(0, 2**16))
        out[name] = np.random.default_rng(seed).standard_normal(shape).astype(dtype)
    if draw(st.integers(0, 9)) == 0:
        out["extra"] = np.zeros(1, np.float32)
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(feeds())
def test_fuzz_engine_agrees_with_onnxruntime(fuzz_pair, feed):
    fuzz_pair.check(feed)


def test_fuzzer_reaches_both_verdicts(fuzz_pair):
    """The fuzzer's space holds runs and refusals on every path (planned, plain, validation)."""
    ran = fuzz_pair.check({"a": f32(2, 3), "b": f32(2, 0), "s": np.array(3.0, np.float32)})
    overridden = fuzz_pair.check({"a": f32(1, 3), "b": f32(1, 2), "s": f32(1), "w": f32(3)})
    refused = fuzz_pair.check({"a": f32(2, 3), "b": f32(1, 2), "s": np.array(3.0, np.float32)})
    assert (ran, overridden, refused) == ("ran", "ran", "refused")


def test_the_engines_feed_check_agrees_with_validate_feeds_on_usual_and_unusual_feeds():
    """FeedCheck passes the usual feed in one loop and hands everything else to validate_feeds:
    both give the same arrays, and the same refusal."""
    proto = model([h.make_node("Add", ["a", "b"], ["y"])],
                  [tensor("a", T.FLOAT, [2, "W"]), tensor("b", T.FLOAT, [2, -1])], [tensor("y", T.FLOAT, [2, "W"])])
    specs = input_specs(proto)
    check = FeedCheck(specs, default_specs(proto))
    usual = {"a": np.zeros((2, 3), np.float32), "b": np.ones((2, 3), np.float32)}
    strided = {name: np.zeros((2, 6), np.float32)[:, ::2] for name in usual}
    listed = {name: [[0.0] * 3] * 2 for name in usual}
    swapped = {name: value.astype(">f4") for name, value in usual.items()}
    for feeds in (usual, strided, listed, swapped):
        got, want = check(feeds), validate_feeds(specs, feeds)
        assert got.keys() == want.keys() and got is not feeds
        for name in want:
            assert got[name].flags.c_contiguous and got[name].dtype == want[name].dtype
            np.testing.assert_array_equal(got[name], want[name])
    for bad in ({**usual, "a": np.zeros((2, 3), np.float64)}, {**usual, "a": np.zeros((3, 3), np.float32)},
                {**usual, "a": np.zeros((2, 3, 1), np.float32)}, {"a": usual["a"]},
                {**usual, "extra": usual["a"]}, {"a": usual["a"], "c": usual["b"]}):
        with pytest.raises(ValueError) as fast:
            check(bad)
        with pytest.raises(ValueError) as slow:
            validate_feeds(specs, bad)
        assert str(fast.value) == str(slow.value)
