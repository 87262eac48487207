"""RDP API contract: JSON schema, control flow Merge, partitions, CLI."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from dynnet_ros.cli import main as cli_main
from dynnet_ros.engine.rdp import analyze, eval_str


def _conv_model(path=None):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "height", "?"])
    w = numpy_helper.from_array(np.zeros((16, 3, 3, 3), np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["conv1_out"], kernel_shape=[3, 3], strides=[2, 2],
                              pads=[1, 1, 1, 1]),
             helper.make_node("Shape", ["conv1_out"], ["s"]),
             helper.make_node("NonZero", ["conv1_out"], ["nz"]),
             helper.make_node("Relu", ["nz"], ["r"])]
    g = helper.make_graph(nodes, "g", [x], [helper.make_tensor_value_info("r", TensorProto.INT64, None)], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    if path:
        onnx.save(m, path)
    return m


def test_json_contract():
    res = analyze(_conv_model())
    j = res.to_json()
    json.dumps(j)
    assert set(j) >= {"model", "seconds", "symbols", "inputs", "tensors", "nodes", "stats"}
    assert j["symbols"]["height"] == {"input": "x", "axis": 2, "original": "height"}
    gen = [k for k in j["symbols"] if k != "height"][0]
    assert gen.isidentifier() and j["symbols"][gen]["original"] == "?"
    assert j["inputs"]["x"] == [1, 3, "height", gen]
    t = j["tensors"]["conv1_out"]
    assert t["rank"] == 4 and t["dims"][:2] == [1, 16] and t["kind"] == "symbolic"
    assert eval_str(t["dims"][2], {"height": 480}) == (480 + 2 - 3) // 2 + 1
    assert j["tensors"]["s"]["value"][:2] == [1, 16]
    assert j["tensors"]["nz"]["dims"] == [4, None] and j["tensors"]["nz"]["kind"] == "nac"
    assert j["nodes"]["Conv_0"]["category"] == "ISDOS" and j["nodes"]["Shape_1"]["category"] == "ISDO"
    assert j["nodes"]["NonZero_2"]["category"] == "EDO"
    assert j["stats"] == {"tensors": 5, "known": 1, "symbolic": 2, "nac": 2}
    labels = {r.label for r in res.partitions}
    assert labels == {"mixed-symbolic", "contains-nac"}
    assert res.node_category("Conv_0") == "ISDOS"
    env = res.bind({"x": (1, 3, 480, 640)})
    assert res.tensor_shape("conv1_out", env) == (1, 16, 240, 320)
    assert res.tensor_shape("nz", env) is None
    with pytest.raises(ValueError):
        res.bind({"x": (2, 3, 480, 640)})


def _if_model(then_shape, else_shape, cond_value=None):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])

    def branch(name, shape):
        c = numpy_helper.from_array(np.array(shape, np.int64), f"{name}_s")
        n = helper.make_node("Reshape", ["x", f"{name}_s"], [f"{name}_y"])
        return helper.make_graph([n], name, [], [helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, None)],
                                 [c])

    inputs = [x]
    inits = []
    if cond_value is None:
        inputs.append(helper.make_tensor_value_info("c", TensorProto.BOOL, []))
    else:
        inits.append(numpy_helper.from_array(np.array(cond_value), "c"))
    node = helper.make_node("If", ["c"], ["y"], then_branch=branch("then", then_shape),
                            else_branch=branch("else", else_shape))
    g = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_if_merge():
    same = analyze(_if_model([-1, 4, 2], [-1, 4, 2]))
    assert [str(d) if not isinstance(d, int) else d for d in same.tensor_dims("y")] == ["N", 4, 2]
    diff = analyze(_if_model([-1, 4, 2], [-1, 2, 4]))
    assert diff.tensor_dims("y")[1:] == [None, None] and "Merge" in diff.tensors["y"].reason
    taken = analyze(_if_model([-1, 4, 2], [-1, 2, 4], cond_value=False))
    assert taken.tensor_dims("y")[1:] == [2, 4]
    rank = analyze(_if_model([-1, 8], [-1, 4, 2]))
    assert rank.tensor_dims("y") is None


def test_loop_with_constant_trip_count():
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Add", ["acc_in", "one"], ["acc_out"]),
         helper.make_node("Identity", ["acc_in"], ["scan_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, ["N"])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("scan_out", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.ones(1, np.float32), "one")])
    g = helper.make_graph([helper.make_node("Loop", ["M", "cond", "x"], ["acc", "scans"], body=body)], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N"])],
                          [helper.make_tensor_value_info("scans", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(np.array(5, np.int64), "M"),
                           numpy_helper.from_array(np.array(True), "cond")])
    res = analyze(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8))
    assert [d if isinstance(d, int) else str(d) for d in res.tensor_dims("scans")] == [5, "N"]
    assert [str(d) for d in res.tensor_dims("acc")] == ["N"]


def test_cli_analyze_and_ops(tmp_path, capsys):
    p = tmp_path / "m.onnx"
    _conv_model(str(p))
    out = tmp_path / "r.json"
    assert cli_main(["analyze", str(p), "--input-shape", "x=1x3x480x640", "--json", str(out)]) == 0
    j = json.loads(out.read_text())
    assert j["tensors"]["conv1_out"]["dims"] == [1, 16, 240, 320]
    assert "unresolved" in capsys.readouterr().out
    assert cli_main(["analyze", "--ops", "--markdown"]) == 0
    table = capsys.readouterr().out
    assert "| Reshape | ai.onnx | ISVDOS |" in table and "| NonZero | ai.onnx | EDO |" in table
    assert cli_main(["analyze", str(p), "--input-shape", "x=bad"]) == 2
    assert cli_main(["analyze", str(tmp_path / "missing.onnx")]) == 2


def test_every_default_domain_op_is_classified():
    import onnx.defs

    from dynnet_ros.engine.rdp import CATEGORIES, REGISTRY

    names = {s.name for s in onnx.defs.get_all_schemas_with_history() if s.domain == ""}
    assert names <= set(REGISTRY)
    assert all(REGISTRY[n].category in CATEGORIES for n in names)


def test_switch_combine_custom_domain():
    """The paper's extended-graph control flow: Combine merges the branch results (meet)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
    p = helper.make_tensor_value_info("p", TensorProto.BOOL, [])
    nodes = [helper.make_node("Switch", ["x", "p"], ["t", "f"], domain="sod2"),
             helper.make_node("Relu", ["t"], ["t2"]),
             helper.make_node("Sigmoid", ["f"], ["f2"]),
             helper.make_node("Combine", ["t2", "f2"], ["y"], domain="sod2"),
             helper.make_node("Transpose", ["f"], ["f3"]),
             helper.make_node("Combine", ["t2", "f3"], ["z"], domain="sod2")]
    g = helper.make_graph(nodes, "g", [x, p], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    res = analyze(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("sod2", 1)]))
    assert [str(d) if not isinstance(d, int) else d for d in res.tensor_dims("y")] == ["N", 4]
    assert res.tensor_dims("z") == [None, None]
    assert res.node_category("Switch_0") == "EDO"
