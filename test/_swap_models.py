"""Small synthetic models for the swap tests (fast to build, symbolic H and W)."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def conv_chain(path, *, channels=(3, 16, 32, 32, 16), seed: int = 0) -> str:
    """Conv/BN/Relu stages with a skip Add, then a 1x1 head; weights > 4 KB are swappable."""
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    prev = "image"
    for k, (cin, cout) in enumerate(zip(channels[:-1], channels[1:])):
        w = (rng.standard_normal((cout, cin, 3, 3)) * (1.0 / np.sqrt(cin * 9))).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{k}"),
                  numpy_helper.from_array(rng.uniform(0.5, 1.5, cout).astype(np.float32), f"g{k}"),
                  numpy_helper.from_array(rng.standard_normal(cout).astype(np.float32) * 0.1, f"b{k}"),
                  numpy_helper.from_array(rng.standard_normal(cout).astype(np.float32) * 0.1, f"m{k}"),
                  numpy_helper.from_array(rng.uniform(0.5, 1.5, cout).astype(np.float32), f"v{k}")]
        nodes += [helper.make_node("Conv", [prev, f"w{k}"], [f"c{k}"], pads=[1, 1, 1, 1]),
                  helper.make_node("BatchNormalization", [f"c{k}", f"g{k}", f"b{k}", f"m{k}", f"v{k}"], [f"n{k}"]),
                  helper.make_node("Relu", [f"n{k}"], [f"r{k}"])]
        prev = f"r{k}"
        if k == 2:
            nodes.append(helper.make_node("Add", ["r1", "r2"], ["skip"]))
            prev = "skip"
    head = (rng.standard_normal((1, channels[-1], 1, 1)) * 0.1).astype(np.float32)
    inits.append(numpy_helper.from_array(head, "head"))
    nodes += [helper.make_node("Conv", [prev, "head"], ["logit"]), helper.make_node("Sigmoid", ["logit"], ["prob"])]
    graph = helper.make_graph(nodes, "conv_chain",
                              [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, "H", "W"])],
                              [helper.make_tensor_value_info("prob", TensorProto.FLOAT, [1, 1, "H", "W"])],
                              initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return str(path)


def image(h: int, w: int, seed: int = 0) -> dict[str, np.ndarray]:
    return {"image": np.random.default_rng(seed).random((1, 3, h, w), dtype=np.float32)}


def check_equal(got: dict, want: list, names: list[str]) -> None:
    """Engine outputs (by name) against onnxruntime's (in output order)."""
    for name, expected in zip(names, want):
        assert got[name].shape == expected.shape, name
        np.testing.assert_allclose(got[name], expected, rtol=1e-4, atol=1e-5, err_msg=name)


def zoo_case(name: str, sizes: list[tuple[int, int]], threads: int = 1):
    """(engine with no budget, feeds per size, onnxruntime's outputs per size, output names)."""
    import onnxruntime as ort

    from dynnet_ros.commands.swap_bench_worker import make_feeds
    from dynnet_ros.engine import Engine
    from dynnet_ros.zoo import ensure_model

    path = str(ensure_model(name))
    reference = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [o.name for o in reference.get_outputs()]
    engine = Engine(path, threads=threads)
    feeds = {size: make_feeds(engine.inputs, *size, seed=1) for size in sizes}
    return engine, feeds, {size: reference.run(names, feeds[size]) for size in sizes}, names
