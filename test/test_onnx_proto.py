"""engine/modelio/onnx_proto.py: onnx's protobuf classes without the onnx package, interchangeable with it.

The shim registers onnx's generated module under onnx's own name, so whichever of the shim and
``import onnx`` comes first, both use one set of classes; each order runs in a fresh interpreter.
Its helpers build and read the same bytes and arrays as onnx.helper / onnx.numpy_helper.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from dynnet_ros.engine.modelio import onnx_proto

ORDER_CHILD = textwrap.dedent("""
    import sys
    if sys.argv[1] == "shim-first":
        from dynnet_ros.engine.modelio import onnx_proto
        assert "onnx" not in sys.modules and "ml_dtypes" not in sys.modules, sorted(sys.modules)
        import onnx
    else:
        import onnx
        from dynnet_ros.engine.modelio import onnx_proto
    from onnx import onnx_ml_pb2
    from onnx import helper, numpy_helper
    import numpy as np
    assert onnx_proto.ModelProto is onnx.ModelProto is onnx_ml_pb2.ModelProto
    assert onnx_proto.TensorProto is onnx.TensorProto
    ours = onnx_proto.make_model(onnx_proto.make_graph(
        [onnx_proto.make_node("Relu", ["x"], ["y"])], "g",
        [onnx_proto.make_tensor_value_info("x", onnx_proto.TensorProto.FLOAT, [1, 3])],
        [onnx_proto.make_tensor_value_info("y", onnx_proto.TensorProto.FLOAT, [1, 3])],
        [onnx_proto.from_array(np.ones((1, 3), np.float32), "w")]), opset_imports=[onnx_proto.make_opsetid("", 17)])
    assert isinstance(ours, onnx.ModelProto)
    onnx.checker.check_model(ours)                      # onnx's C++ reads the shim's model
    theirs = helper.make_model(ours.graph, opset_imports=[helper.make_opsetid("", 17)])
    assert isinstance(theirs, onnx_proto.ModelProto)   # and the shim's class is onnx's
    assert onnx_proto.to_array(theirs.graph.initializer[0]).tolist() == [[1.0, 1.0, 1.0]]
    assert onnx.load_from_string(ours.SerializeToString()) == ours
    print("ok")
""")


@pytest.mark.parametrize("order", ["shim-first", "onnx-first"])
def test_the_shim_and_onnx_share_their_classes_in_either_import_order(order):
    result = subprocess.run([sys.executable, "-c", ORDER_CHILD, order], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "ok"


def _model(make, arrays, tp):
    """The same model built by ``make`` (onnx.helper or the shim) and ``arrays`` (numpy_helper or the shim)."""
    node = make.make_node("Conv", ["x", "w"], ["y"], name="conv", alpha=0.5, kernel_shape=[3, 3], auto_pad="SAME",
                          scales=[1.0, 2], names=["a", b"b"], value=arrays.from_array(np.arange(3, dtype=np.int64)))
    initializers = [
        arrays.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "f32"),
        arrays.from_array(np.array([True, False]), "bool_raw"),
        arrays.from_array(np.arange(4, dtype=np.float16), "f16_raw"),
        make.make_tensor("f16", tp.FLOAT16, [2], [1.5, -2.0]),
        make.make_tensor("b", tp.BOOL, [2], [True, False]),
        make.make_tensor("i8", tp.INT8, [3], [-1, 0, 7]),
        make.make_tensor("u16", tp.UINT16, [2], [1, 65535]),
        make.make_tensor("d", tp.DOUBLE, [1], [2.5]),
        make.make_tensor("u64", tp.UINT64, [1], [7]),
        make.make_tensor("i64", tp.INT64, [2, 1], [3, -4]),
        make.make_tensor("c64", tp.COMPLEX64, [1], [1 + 2j]),
        make.make_tensor("raw", tp.FLOAT, [2], np.ones(2, np.float32).tobytes(), raw=True),
        make.make_tensor("bf16", tp.BFLOAT16, [1], [1.0]),     # a type numpy lacks: onnx's own helper
    ]
    graph = make.make_graph([node], "g", [make.make_tensor_value_info("x", tp.FLOAT, [1, "n", None])],
                            [make.make_tensor_value_info("y", tp.FLOAT, [])], initializers, doc_string="d")
    return make.make_model(graph, opset_imports=[make.make_opsetid("", 17)], producer_name="p")


def test_the_helpers_build_what_onnx_builds():
    ours = _model(onnx_proto, onnx_proto, onnx_proto.TensorProto)
    theirs = _model(helper, numpy_helper, onnx.TensorProto)
    assert ours.SerializeToString() == theirs.SerializeToString()
    for tensor in theirs.graph.initializer:
        mine, want = onnx_proto.to_array(tensor), numpy_helper.to_array(tensor)
        assert mine.dtype == want.dtype and mine.shape == want.shape and np.array_equal(mine, want), tensor.name
    for attr in theirs.graph.node[0].attribute:
        assert onnx_proto.get_attribute_value(attr) == helper.get_attribute_value(attr), attr.name
    for elem, (dtype, _field) in onnx_proto.NATIVE_TYPES.items():
        assert onnx_proto.tensor_dtype_to_np_dtype(elem) == helper.tensor_dtype_to_np_dtype(elem)
        if elem != onnx_proto.TensorProto.STRING:  # numpy's object dtype holds strings only by convention
            assert onnx_proto.np_dtype_to_tensor_dtype(dtype) == helper.np_dtype_to_tensor_dtype(dtype)


def test_the_helpers_reject_what_onnx_rejects():
    with pytest.raises(ValueError, match="empty iterator"):
        onnx_proto.make_attribute("a", [])
    with pytest.raises(TypeError, match="not an accepted attribute value"):
        onnx_proto.make_attribute("a", object())
    with pytest.raises(ValueError, match="does not match tensor dimensions"):
        onnx_proto.make_tensor("t", onnx_proto.TensorProto.FLOAT, [3], [1.0])
    with pytest.raises(TypeError, match="UNDEFINED"):
        onnx_proto.to_array(onnx_proto.TensorProto())


def test_load_and_save_round_trip_and_read_external_weights(tmp_path):
    model = _model(helper, numpy_helper, onnx.TensorProto)
    onnx_proto.save(model, tmp_path / "m.onnx")
    assert onnx_proto.load(tmp_path / "m.onnx") == onnx.load(tmp_path / "m.onnx") == model
    onnx.save(model, tmp_path / "ext.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
              location="ext.bin", size_threshold=0)
    loaded = onnx_proto.load(tmp_path / "ext.onnx")
    weights = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert not any(onnx_proto.uses_external_data(t) for t in loaded.graph.initializer)
    assert np.array_equal(onnx_proto.to_array(loaded.graph.initializer[0]), weights)
    skeleton = onnx_proto.load(tmp_path / "ext.onnx", load_external_data=False)
    first = skeleton.graph.initializer[0]
    assert onnx_proto.uses_external_data(first) and not first.raw_data
    assert np.array_equal(onnx_proto.to_array(first, str(tmp_path)), weights)
    first.external_data[0].value = "../outside.bin"   # onnx refuses a location outside the model's folder
    with pytest.raises(ValueError):
        onnx_proto.to_array(first, str(tmp_path))
