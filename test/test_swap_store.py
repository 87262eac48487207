"""The block store: aligned layout, valid skeletons, and corrupt/stale stores detected and rebuilt."""
from __future__ import annotations

import json
import os

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from _swap_models import conv_chain
from dynnet_ros.swap.store import STORE_VERSION, Store, StoreError, ensure_store, model_digest, prepare
from dynnet_ros.swap.swapin import ALIGN


@pytest.fixture()
def model(tmp_path):
    return conv_chain(tmp_path / "chain.onnx")


@pytest.fixture()
def store(model, tmp_path):
    return prepare(model, tmp_path / "store", max_atoms=3)


def test_every_tensor_is_aligned_and_spans_tile_the_file(store):
    offset = 0
    for entry in store.atoms:
        assert entry.span_offset == offset and entry.span_offset % ALIGN == 0 and entry.span_bytes % ALIGN == 0
        for tensor in entry.tensors:
            assert tensor.offset % ALIGN == 0
            assert entry.span_offset <= tensor.offset and tensor.offset + tensor.nbytes <= entry.span_offset + entry.span_bytes
        offset += entry.span_bytes
    assert offset == store.weights_bytes == os.path.getsize(store.weights_path)


def test_skeletons_are_weightless_and_load_with_their_external_data(store):
    for entry in store.atoms:
        path = store.skeleton_path(entry.atom.index)
        assert os.path.getsize(path) < 64 * 1024
        full = onnx.load(str(path))  # external data resolved from weights.bin next to it
        values = {init.name: numpy_helper.to_array(init) for init in full.graph.initializer}
        raw = np.fromfile(store.weights_path, dtype=np.uint8)
        for tensor in entry.tensors:
            stored = raw[tensor.offset:tensor.offset + tensor.nbytes].view(tensor.dtype).reshape(tensor.shape)
            np.testing.assert_array_equal(values[tensor.name], stored)


def test_reopen_verifies(store, model):
    again = Store.open(store.path, expected_digest=model_digest(model))
    assert [e.crc32 for e in again.atoms] == [e.crc32 for e in store.atoms]


def test_truncated_weight_file_is_detected(store):
    with open(store.weights_path, "r+b") as handle:
        handle.truncate(store.weights_bytes - ALIGN)
    with pytest.raises(StoreError, match="truncated"):
        Store.open(store.path)


def test_flipped_byte_is_detected(store):
    entry = store.atoms[-1]
    position = entry.tensors[0].offset + 7
    with open(store.weights_path, "r+b") as handle:
        handle.seek(position)
        byte = handle.read(1)[0]
        handle.seek(position)
        handle.write(bytes([byte ^ 0x10]))
    with pytest.raises(StoreError, match=f"atom {entry.atom.index}.*crc32"):
        Store.open(store.path)


def test_edited_skeleton_is_detected(store):
    path = store.skeleton_path(0)
    path.write_bytes(path.read_bytes() + b"\0")
    with pytest.raises(StoreError, match="sha256"):
        Store.open(store.path)


def test_stale_model_and_old_format_are_detected(store, tmp_path):
    other = conv_chain(tmp_path / "other.onnx", seed=1)
    with pytest.raises(StoreError, match="stale: built from model"):
        Store.open(store.path, expected_digest=model_digest(other))
    index = json.loads((store.path / "index.json").read_text())
    index["version"] = STORE_VERSION - 1
    (store.path / "index.json").write_text(json.dumps(index))
    with pytest.raises(StoreError, match="stale: store format version"):
        Store.open(store.path)


def test_ensure_store_rebuilds_a_corrupt_store_and_says_why(store, model):
    with open(store.weights_path, "r+b") as handle:
        handle.truncate(10)
    rebuilt, reason = ensure_store(model, store.path)
    assert reason is not None and "truncated" in reason
    assert rebuilt.weights_bytes == os.path.getsize(rebuilt.weights_path)
    same, reason = ensure_store(model, store.path)
    assert reason is None and same.digest == rebuilt.digest


def test_not_a_store(tmp_path):
    with pytest.raises(StoreError, match="missing index.json"):
        Store.open(tmp_path)


def test_store_optimised_for_another_cpu_is_stale(store):
    index = json.loads((store.path / "index.json").read_text())
    assert index["optimized"] == "ort-all"
    index["cpu"] = "some-other-cpu"
    (store.path / "index.json").write_text(json.dumps(index))
    with pytest.raises(StoreError, match="stale: optimised for CPU"):
        Store.open(store.path)


def test_basic_store_keeps_onnx_domain_ops(model, tmp_path):
    basic = prepare(model, tmp_path / "basic", optimize="basic")
    for entry in basic.atoms:
        domains = {node.domain for node in onnx.load(str(basic.skeleton_path(entry.atom.index)),
                                                     load_external_data=False).graph.node}
        assert domains <= {"", "ai.onnx"}
    with pytest.raises(ValueError, match="optimize"):
        prepare(model, tmp_path / "bad", optimize="fast")


def test_make_ssa_gives_branch_names_model_wide_uniqueness():
    """add_initializer binds by name in every graph: branch-local names must not repeat."""
    from onnx import TensorProto, helper

    from dynnet_ros.swap.store import make_ssa

    def branch(value: float, tag: str) -> onnx.GraphProto:
        init = numpy_helper.from_array(np.full((2,), value, np.float32), "w")
        return helper.make_graph([helper.make_node("Add", ["x", "w"], ["t"]), helper.make_node("Relu", ["t"], ["y_" + tag])],
                                 tag, [], [helper.make_tensor_value_info("y_" + tag, TensorProto.FLOAT, [2])],
                                 initializer=[init])

    node = helper.make_node("If", ["c"], ["y"], then_branch=branch(1.0, "then"), else_branch=branch(-1.0, "else"))
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                                            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert make_ssa(model) >= 2
    names = []
    for attr in model.graph.node[0].attribute:
        names += [i.name for i in attr.g.initializer] + [o for n in attr.g.node for o in n.output]
    assert len(names) == len(set(names))
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.array([0.5, 2.0], np.float32)
    np.testing.assert_allclose(session.run(None, {"c": np.array(True), "x": x})[0], [1.5, 3.0])
    np.testing.assert_allclose(session.run(None, {"c": np.array(False), "x": x})[0], [0.0, 1.0])
