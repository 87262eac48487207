"""Assembly by reference with onnxruntime: what copies and what does not (ORT as installed)."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
import onnx

from _swap_models import conv_chain, image
from dynnet_ros.swap.assembly import OrtAtom, atom_session_options, decide_tensorrt, trt_builder_flags
from dynnet_ros.swap.store import prepare
from dynnet_ros.swap.swapin import HostArena, WeightReader


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("asm")
    return prepare(conv_chain(path / "chain.onnx"), path / "store", max_atoms=3)


def _chain(atoms, feeds):
    env = dict(feeds)
    for atom in atoms:
        env.update(atom.run(env))
    return env["prob"]


def test_sessions_read_weights_from_the_arena_by_reference(store):
    """Scaling a weight in the arena after session creation changes the output: no copy."""
    arena = HostArena(store.weights_bytes)
    reader = WeightReader(store.weights_path)
    for entry in store.atoms:
        reader.read_into(arena.view(entry.span_offset, entry.span_bytes), entry.span_offset)
    atoms = [OrtAtom(store, entry, arena, threads=1) for entry in store.atoms]
    feeds = image(32, 32)
    before = _chain(atoms, feeds)
    reference = ort.InferenceSession(store.index["model_path"], providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(before, reference.run(["prob"], feeds)[0], rtol=1e-5, atol=1e-6)
    for entry in store.atoms:  # every bound tensor is seen: zero them all, output collapses
        for tensor in entry.tensors:
            arena.array[tensor.offset:tensor.offset + tensor.nbytes] = 0
    after = _chain(atoms, feeds)
    assert not np.allclose(before, after)
    for atom in atoms:
        atom.close()
    reader.close()
    arena.close()


def _matmul_model():
    init = TensorProto()
    init.name, init.data_type = "m", TensorProto.FLOAT
    init.dims.extend([64, 64])
    init.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "weights.bin"), ("offset", "0"), ("length", str(64 * 64 * 4))):
        entry = init.external_data.add()
        entry.key, entry.value = key, value
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "m"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])], initializer=[init])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("api,prepack,by_reference", [
    ("add_initializer", False, True),
    ("add_initializer", True, False),            # prepacking makes a private copy
    ("add_external_initializers", False, False),  # always copies in ORT 1.32
])
def test_onnxruntime_copy_behaviour_is_as_documented(tmp_path, api, prepack, by_reference):
    weights = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    weights.tofile(tmp_path / "weights.bin")
    onnx.save(_matmul_model(), tmp_path / "skeleton.onnx")
    buffer = weights.copy()
    options = atom_session_options(1)
    if prepack:
        options.add_session_config_entry("session.disable_prepacking", "0")
    value = ort.OrtValue.ortvalue_from_numpy(buffer)
    if api == "add_initializer":
        options.add_initializer("m", value)
    else:
        options.add_external_initializers(["m"], [value])
    session = ort.InferenceSession(str(tmp_path / "skeleton.onnx"), options, providers=["CPUExecutionProvider"])
    x = np.ones((1, 64), np.float32)
    first = session.run(["y"], {"x": x})[0]
    buffer *= 2
    second = session.run(["y"], {"x": x})[0]
    assert np.allclose(second, 2 * first) is by_reference


def test_tensorrt_decision_without_cuda():
    assert not decide_tensorrt(False).use
    no_trt = decide_tensorrt(True, tensorrt_importable=False, pycuda_importable=True)
    assert not no_trt.use and "tensorrt" in no_trt.reason
    assert decide_tensorrt(True, tensorrt_importable=True, pycuda_importable=True).use


def test_tensorrt_builder_flags_are_strip_and_refit_identical():
    class Flags:
        STRIP_PLAN, REFIT_IDENTICAL = "strip", "refit-identical"

    class FakeTrt:
        BuilderFlag = Flags

    assert trt_builder_flags(FakeTrt) == ["strip", "refit-identical"]
