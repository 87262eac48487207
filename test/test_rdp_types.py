"""Every tensor onnxruntime can type has the same element type in RDP (rdp/types.py), on the zoo and
the real-model corpus, as given and after the blocked-layout rewrite; and the planner types what
RDP does not from onnxruntime itself (plan/ort_types.py), so a cut never lacks a type."""
from __future__ import annotations

import contextlib
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from _corpus import pytest_params
from onnx import TensorProto as T
from onnx import helper as h

from dynnet_ros.engine.backends.registry import load_for_backend
from dynnet_ros.engine.plan.graph import GraphIndex
from dynnet_ros.engine.plan.layout import laid_out_skeleton
from dynnet_ros.engine.plan.ort_types import ort_element_types
from dynnet_ros.engine.rdp import analyze
from dynnet_ros.zoo import MODEL_NAMES, ensure_model

MODELS = [pytest.param(name, id=name) for name in MODEL_NAMES] + pytest_params()


def _path(model) -> str:
    return str(ensure_model(model)) if isinstance(model, str) else str(model.path())


def _variants(path: str) -> list[tuple[str, onnx.ModelProto]]:
    skeleton = load_for_backend("cpu", path)
    variants = [("as given", skeleton)]
    with contextlib.suppress(ValueError):  # no NCHWc kernels here, or none for this model: nothing more to check
        variants.append(("nchwc", laid_out_skeleton(skeleton)[0]))
    return variants


@pytest.mark.parametrize("model", MODELS)
def test_rdp_types_every_tensor_onnxruntime_types(model):
    for variant, graph in _variants(_path(model)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = analyze(graph)
        names = [out for node in graph.graph.node for out in node.output if out]
        expected = ort_element_types(graph, names)
        assert len(expected) == len(names), f"{variant}: onnxruntime typed {len(expected)} of {len(names)}"
        untyped = [n for n in names if not result.tensors[n].dtype]
        wrong = [(n, result.tensors[n].dtype, t) for n, t in expected.items()
                 if result.tensors[n].dtype and result.tensors[n].dtype != t]
        assert not untyped and not wrong, (variant, untyped[:5], wrong[:5])


def _model(nodes, inputs, outputs, opsets=(("", 17),)) -> onnx.ModelProto:
    proto = h.make_model(h.make_graph(nodes, "types", inputs, outputs),
                         opset_imports=[h.make_opsetid(domain, version) for domain, version in opsets])
    proto.ir_version = 8
    return proto


def _types(proto: onnx.ModelProto) -> dict[str, int]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {name: info.dtype for name, info in analyze(proto).tensors.items()}


def test_types_survive_rules_that_give_up_on_the_shape():
    # x has no known rank: Unsqueeze, Concat, Shape and Cast cannot give shapes, but do give types
    unranked = h.make_tensor_value_info("x", T.FLOAT16, None)
    proto = _model([h.make_node("Unsqueeze", ["x", "axes"], ["u"]), h.make_node("Concat", ["u", "u"], ["c"], axis=0),
                    h.make_node("Shape", ["c"], ["s"]), h.make_node("Cast", ["c"], ["i"], to=T.INT32),
                    h.make_node("Equal", ["i", "i"], ["e"])],
                   [unranked, h.make_tensor_value_info("axes", T.INT64, [1])],
                   [h.make_tensor_value_info("e", T.BOOL, None), h.make_tensor_value_info("s", T.INT64, None)])
    types = _types(proto)
    assert (types["u"], types["c"], types["s"], types["i"], types["e"]) == \
        (T.FLOAT16, T.FLOAT16, T.INT64, T.INT32, T.BOOL)


def test_if_outputs_take_the_branches_declared_types():
    def branch(value: float) -> onnx.GraphProto:
        return h.make_graph([h.make_node("Unsqueeze", ["x", "axes"], ["out"])], "branch", [],
                            [h.make_tensor_value_info("out", T.DOUBLE, None)])
    proto = _model([h.make_node("If", ["c"], ["y"], then_branch=branch(1.0), else_branch=branch(0.0))],
                   [h.make_tensor_value_info("c", T.BOOL, []), h.make_tensor_value_info("x", T.DOUBLE, None),
                    h.make_tensor_value_info("axes", T.INT64, [1])],
                   [h.make_tensor_value_info("y", T.DOUBLE, None)])
    assert _types(proto)["y"] == T.DOUBLE


def test_contrib_ops_take_their_types_and_fused_matmul_its_shape():
    """FusedMatMul (what onnxruntime writes for MatMul after Transpose) with transB: RDP's shape and
    type equal onnxruntime's at two sizes; an unknown contrib op is typed by onnxruntime."""
    proto = _model([h.make_node("FusedMatMul", ["a", "b"], ["y"], domain="com.microsoft", transB=1, alpha=0.5),
                    h.make_node("MurmurHash3", ["y"], ["hash"], domain="com.microsoft"),
                    h.make_node("Cast", ["hash"], ["hashed"], to=T.FLOAT)],
                   [h.make_tensor_value_info("a", T.FLOAT, ["B", "S", 8]),
                    h.make_tensor_value_info("b", T.FLOAT, ["B", "S", 8])],
                   [h.make_tensor_value_info("y", T.FLOAT, None), h.make_tensor_value_info("hashed", T.FLOAT, None)],
                   opsets=(("", 17), ("com.microsoft", 1)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = analyze(proto)
    assert result.tensors["y"].dtype == T.FLOAT and not result.tensors["hash"].dtype  # hash: RDP has no rule
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    for batch, seq in ((1, 5), (3, 2)):
        a = np.random.default_rng(seq).standard_normal((batch, seq, 8)).astype(np.float32)
        y = session.run(["y"], {"a": a, "b": a})[0]
        assert result.tensor_shape("y", result.bind({"a": a.shape, "b": a.shape})) == y.shape == (batch, seq, seq)
    assert ort_element_types(proto, ["y", "hash"]) == {"y": T.FLOAT, "hash": T.UINT32}
    # an intermediate tensor neither RDP nor onnx's schemas type: the planner asks onnxruntime
    assert GraphIndex.build(proto).elem_types["hash"] == T.UINT32
