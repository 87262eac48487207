"""Small ONNX models in each export format the perception cores read, built with onnx.helper.

Detector fixtures return hand-placed constant outputs (so a test knows exactly what the model
"predicted") that still depend on the image input in the graph (times zero), the way a real
export's outputs do. Dense fixtures (segmentation, depth) compute their maps from the pixels
with a 1x1 convolution, so the expected map follows from the frame.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

Dims = Sequence[int | str]


def _save(nodes, inputs, outputs, inits, path: Path, metadata: Mapping[str, str] | None = None) -> str:
    graph = helper.make_graph(nodes, path.stem, inputs, outputs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    for key, value in (metadata or {}).items():
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return str(path)


def constant_outputs(path: Path, outputs: Mapping[str, np.ndarray], *, input_name: str = "images",
                     input_dims: Dims = (1, 3, 64, 64), input_type: int = TensorProto.FLOAT,
                     output_dims: Mapping[str, Dims] | None = None, metadata: Mapping[str, str] | None = None,
                     extra_inputs: Mapping[str, tuple[int, Dims]] | None = None) -> str:
    """A model whose outputs are the given arrays (+ 0 x the sum of the image input).

    ``output_dims`` declares an output's dims (symbolic names allowed) instead of the array's shape.
    """
    nodes = [helper.make_node("Cast", [input_name], ["as_float"], to=TensorProto.FLOAT),
             helper.make_node("ReduceSum", ["as_float"], ["total"], keepdims=0),
             helper.make_node("Mul", ["total", "zero"], ["nothing"])]
    inits = [numpy_helper.from_array(np.array(0.0, np.float32), "zero")]
    outs = []
    for name, value in outputs.items():
        value = np.asarray(value)
        inits.append(numpy_helper.from_array(value, f"{name}_value"))
        if value.dtype == np.float32:
            nodes.append(helper.make_node("Add", [f"{name}_value", "nothing"], [name]))
            elem: int = TensorProto.FLOAT
        else:
            nodes += [helper.make_node("Cast", ["nothing"], [f"{name}_nothing"], to=TensorProto.INT64),
                      helper.make_node("Add", [f"{name}_value", f"{name}_nothing"], [name])]
            elem = TensorProto.INT64
        dims = (output_dims or {}).get(name, list(value.shape))
        outs.append(helper.make_tensor_value_info(name, elem, list(dims)))
    inputs = [helper.make_tensor_value_info(input_name, input_type, list(input_dims))]
    for name, (extra_type, extra_dims) in (extra_inputs or {}).items():
        inputs.append(helper.make_tensor_value_info(name, extra_type, list(extra_dims)))
    return _save(nodes, inputs, outs, inits, path, metadata)


def pixel_map(path: Path, weights: np.ndarray, bias: np.ndarray, *, input_name: str = "image",
              input_dims: Dims = (1, 3, "H", "W"), output_name: str = "out", stride: int = 1,
              sigmoid: bool = False, squeeze: bool = False, extra_outputs: Sequence[str] = (),
              metadata: Mapping[str, str] | None = None) -> str:
    """out = conv1x1(image, weights) + bias, at 1/``stride`` resolution (average pooled first).

    ``weights`` (C_out, 3); ``squeeze`` drops the channel axis ([1, H, W], C_out must be 1);
    ``extra_outputs`` adds the negated map under other names, before ``output_name`` (multi-output
    models whose first output is not the one to decode).
    """
    c_out = weights.shape[0]
    inits = [numpy_helper.from_array(weights.reshape(c_out, 3, 1, 1).astype(np.float32), "w"),
             numpy_helper.from_array(bias.astype(np.float32), "b")]
    nodes = []
    src = input_name
    if stride > 1:
        nodes.append(helper.make_node("AveragePool", [src], ["pooled"], kernel_shape=[stride, stride],
                                      strides=[stride, stride]))
        src = "pooled"
    last = "conv"
    nodes.append(helper.make_node("Conv", [src, "w", "b"], [last]))
    if sigmoid:
        nodes.append(helper.make_node("Sigmoid", [last], ["sig"]))
        last = "sig"
    if squeeze:
        inits.append(numpy_helper.from_array(np.array([1], np.int64), "axis1"))
        nodes.append(helper.make_node("Squeeze", [last, "axis1"], ["squeezed"]))
        last = "squeezed"
    h = "H" if stride == 1 else "Hs"
    w = "W" if stride == 1 else "Ws"
    batch = input_dims[0]  # the output keeps the input's batch axis (a symbol: the model batches)
    dims: list[int | str] = [batch, h, w] if squeeze else [batch, c_out, h, w]
    outputs = []
    for name in extra_outputs:  # the map negated: decoding the wrong output shows
        nodes.append(helper.make_node("Neg", [last], [name]))
        outputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, dims))
    nodes.append(helper.make_node("Identity", [last], [output_name]))
    outputs.append(helper.make_tensor_value_info(output_name, TensorProto.FLOAT, dims))
    inputs = [helper.make_tensor_value_info(input_name, TensorProto.FLOAT, list(input_dims))]
    return _save(nodes, inputs, outputs, inits, path, metadata)


def batched_end2end(path: Path, boxes: np.ndarray) -> str:
    """An end-to-end detector over a symbolic batch: images [B, 3, H, W] -> [B, N, 6] rows
    x1, y1, x2, y2, score, class with the given ``boxes`` (N, 4; input pixels, class 0) in every
    frame, each scored by its own frame's brightest value (so a test sees which frame a row is from)."""
    n = len(boxes)
    base = np.zeros((1, n, 6), np.float32)
    base[0, :, :4] = boxes
    score_column = np.zeros((1, 1, 6), np.float32)
    score_column[0, 0, 4] = 1.0
    inits = [numpy_helper.from_array(base, "base"), numpy_helper.from_array(score_column, "score_column"),
             numpy_helper.from_array(np.array([1], np.int64), "axis1"),
             numpy_helper.from_array(np.array([2], np.int64), "axis2")]
    nodes = [helper.make_node("ReduceMax", ["images"], ["brightest"], axes=[1, 2, 3], keepdims=0),
             helper.make_node("Unsqueeze", ["brightest", "axis1"], ["per_frame"]),
             helper.make_node("Unsqueeze", ["per_frame", "axis2"], ["per_frame_row"]),
             helper.make_node("Mul", ["per_frame_row", "score_column"], ["scores"]),
             helper.make_node("Add", ["base", "scores"], ["output0"])]
    inputs = [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["B", 3, "H", "W"])]
    outputs = [helper.make_tensor_value_info("output0", TensorProto.FLOAT, ["B", n, 6])]
    return _save(nodes, inputs, outputs, inits, path, {"end2end": "True", "names": "{0: 'thing'}"})


def batch_fixed_inside(path: Path) -> str:
    """A model that names its batch axis but fixes it inside: image [B, 3, H, W] -> a 1x1 conv ->
    Reshape to [1, 1, -1], declared as [B, 1, K] (the declaration alone would promise batching)."""
    inits = [numpy_helper.from_array(np.ones((1, 3, 1, 1), np.float32), "w"),
             numpy_helper.from_array(np.array([1, 1, -1], np.int64), "flat")]
    nodes = [helper.make_node("Conv", ["image", "w"], ["conv"]),
             helper.make_node("Reshape", ["conv", "flat"], ["out"])]
    inputs = [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["B", 3, "H", "W"])]
    outputs = [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["B", 1, "K"])]
    return _save(nodes, inputs, outputs, inits, path)


def nhwc_uint8_map(path: Path, weights: np.ndarray) -> str:
    """Raw pixels NHWC over a symbolic batch: image uint8 [B, H, W, 3] -> sigmoid(conv1x1(pixels /
    255, weights)) as [B, 1, H, W]."""
    inits = [numpy_helper.from_array(weights.reshape(1, 3, 1, 1).astype(np.float32), "w"),
             numpy_helper.from_array(np.array(1 / 255, np.float32), "inv255")]
    nodes = [helper.make_node("Cast", ["image"], ["pixels"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["pixels", "inv255"], ["unit"]),
             helper.make_node("Transpose", ["unit"], ["nchw"], perm=[0, 3, 1, 2]),
             helper.make_node("Conv", ["nchw", "w"], ["conv"]),
             helper.make_node("Sigmoid", ["conv"], ["out"])]
    inputs = [helper.make_tensor_value_info("image", TensorProto.UINT8, ["B", "H", "W", 3])]
    outputs = [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["B", 1, "H", "W"])]
    return _save(nodes, inputs, outputs, inits, path)
