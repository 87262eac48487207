"""A tiny deterministic ONNX graph builder shared by the zoo models.

Why: the five demo models are written as plain Python over `onnx.helper`, without torch. This
class keeps node/initializer naming unique and reproducible (a counter per prefix, one seeded
numpy Generator), so building a model twice gives byte-identical files.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import DTypeLike

from dynnet_ros.engine.modelio.onnx_proto import (
    GraphProto,
    ModelProto,
    NodeProto,
    TensorProto,
    ValueInfoProto,
    from_array,
    make_graph,
    make_model,
    make_node,
    make_opsetid,
    make_tensor_value_info,
)

OPSET = 17
IR_VERSION = 8  # the IR version that introduced opset 17; onnxruntime 1.32 loads it

FLOAT = TensorProto.FLOAT
INT64 = TensorProto.INT64
BOOL = TensorProto.BOOL


@dataclass
class _Shared:
    """State shared by a builder and its If-branch sub-builders (names, weights, RNG)."""

    rng: np.random.Generator
    counts: Counter[str] = field(default_factory=Counter)
    initializers: list[TensorProto] = field(default_factory=list)
    const_cache: dict[tuple[str, tuple[int, ...], bytes], str] = field(default_factory=dict)


class GraphBuilder:
    """Append-only builder: each helper adds nodes and returns the output tensor name(s)."""

    def __init__(self, name: str, seed: int, _shared: _Shared | None = None) -> None:
        self.name = name
        self._s = _shared or _Shared(rng=np.random.default_rng(seed))
        self.nodes: list[NodeProto] = []
        self.inputs: list[ValueInfoProto] = []
        self.outputs: list[ValueInfoProto] = []

    # ------------------------------------------------------------------ naming / constants
    @property
    def rng(self) -> np.random.Generator:
        return self._s.rng

    def fresh(self, prefix: str) -> str:
        """A new unique name ``prefix_N`` (shared across sub-graphs: ONNX needs SSA)."""
        n = self._s.counts[prefix]
        self._s.counts[prefix] += 1
        return f"{prefix}_{n}"

    def weight(self, prefix: str, value: np.ndarray) -> str:
        """Store ``value`` as a fresh initializer of the (outer-most) graph."""
        name = self.fresh(prefix)
        self._s.initializers.append(from_array(np.array(value, order="C"), name))  # 0-d stays 0-d
        return name

    def const(self, value: Any, dtype: DTypeLike = np.float32) -> str:
        """A small constant initializer, de-duplicated by value (shape-op arguments, scales...)."""
        arr = np.asarray(value, dtype=dtype)
        key = (arr.dtype.str, arr.shape, arr.tobytes())
        if key not in self._s.const_cache:
            self._s.const_cache[key] = self.weight("const", arr)
        return self._s.const_cache[key]

    # ------------------------------------------------------------------ generic nodes
    def op(self, op_type: str, inputs: Sequence[str], prefix: str | None = None, **attrs: Any) -> str:
        """Add one single-output node; returns its output name (also the node name)."""
        base = self.fresh(prefix or op_type.lower())
        self.nodes.append(make_node(op_type, list(inputs), [base], name=base, **attrs))
        return base

    def op_multi(self, op_type: str, inputs: Sequence[str], n_out: int, prefix: str | None = None,
                 **attrs: Any) -> list[str]:
        """Add one node with ``n_out`` outputs named ``<node>_o<i>``; returns those names."""
        base = self.fresh(prefix or op_type.lower())
        outs = [f"{base}_o{i}" for i in range(n_out)]
        self.nodes.append(make_node(op_type, list(inputs), outs, name=base, **attrs))
        return outs

    def add_input(self, name: str, elem_type: int, shape: Sequence[int | str]) -> str:
        self.inputs.append(make_tensor_value_info(name, elem_type, list(shape)))
        return name

    def add_output(self, tensor: str, name: str, elem_type: int, shape: Sequence[int | str] | None) -> str:
        """Expose ``tensor`` as graph output ``name`` (through an Identity when renaming)."""
        if tensor != name:
            self.nodes.append(make_node("Identity", [tensor], [name], name=self.fresh("out")))
        self.outputs.append(make_tensor_value_info(name, elem_type, shape))
        return name

    # ------------------------------------------------------------------ layers
    def conv(self, x: str, cin: int, cout: int, k: int = 3, stride: int = 1, groups: int = 1,
             bias: bool = True, std: float | None = None, prefix: str = "conv") -> str:
        """Conv with He-normal weights and symmetric 'same' padding (output = ceil(in/stride))."""
        fan_in = cin // groups * k * k
        scale = np.sqrt(2.0 / fan_in) if std is None else std
        w = (self.rng.standard_normal((cout, cin // groups, k, k), dtype=np.float32) * scale)
        ins = [x, self.weight(f"{prefix}_w", w.astype(np.float32))]
        if bias:
            ins.append(self.weight(f"{prefix}_b", np.zeros(cout, np.float32)))
        p = k // 2
        return self.op("Conv", ins, prefix=prefix, kernel_shape=[k, k], strides=[stride, stride],
                       pads=[p, p, p, p], group=groups)

    def bn(self, x: str, c: int, prefix: str = "bn") -> str:
        """BatchNormalization (inference form) with mild random statistics."""
        r = self.rng
        gamma = (1.0 + 0.1 * r.standard_normal(c, dtype=np.float32)).astype(np.float32)
        beta = (0.05 * r.standard_normal(c, dtype=np.float32)).astype(np.float32)
        mean = (0.05 * r.standard_normal(c, dtype=np.float32)).astype(np.float32)
        var = (1.0 + 0.1 * np.abs(r.standard_normal(c, dtype=np.float32))).astype(np.float32)
        ins = [x] + [self.weight(f"{prefix}_{n}", v) for n, v in
                     (("scale", gamma), ("bias", beta), ("mean", mean), ("var", var))]
        return self.op("BatchNormalization", ins, prefix=prefix, epsilon=1e-5)

    def relu(self, x: str) -> str:
        return self.op("Relu", [x])

    def cbr(self, x: str, cin: int, cout: int, k: int = 3, stride: int = 1, groups: int = 1,
            act: bool = True, bn: bool = True) -> str:
        """Conv (+BatchNorm) (+ReLU): the workhorse block."""
        y = self.conv(x, cin, cout, k, stride, groups, bias=not bn)
        if bn:
            y = self.bn(y, cout)
        return self.relu(y) if act else y

    def resize(self, x: str, scale: float, mode: str = "nearest") -> str:
        """Upsample spatial dims by ``scale`` (Resize with constant scales, dynamic-shape safe)."""
        roi = self.const([], np.float32)
        scales = self.const([1.0, 1.0, scale, scale], np.float32)
        attrs = {"mode": mode}
        if mode == "nearest":
            attrs["nearest_mode"] = "floor"
            attrs["coordinate_transformation_mode"] = "asymmetric"
        return self.op("Resize", [x, roi, scales], prefix="resize", **attrs)

    def gemm(self, x: str, cin: int, cout: int, std: float | None = None) -> str:
        """Fully connected layer on a [1, cin] tensor."""
        scale = np.sqrt(2.0 / cin) if std is None else std
        w = (self.rng.standard_normal((cout, cin), dtype=np.float32) * scale).astype(np.float32)
        b = np.zeros(cout, np.float32)
        return self.op("Gemm", [x, self.weight("fc_w", w), self.weight("fc_b", b)], prefix="fc", transB=1)

    def classifier(self, x: str, cin: int, classes: int = 10) -> str:
        """GlobalAveragePool -> Flatten -> Gemm: an image-level head."""
        pooled = self.op("GlobalAveragePool", [x])
        flat = self.op("Flatten", [pooled], axis=1)
        return self.gemm(flat, cin, classes, std=0.05)

    # ------------------------------------------------------------------ sub-graphs / model
    def subgraph(self, name: str) -> GraphBuilder:
        """A builder for an If branch: own node list, same names/weights/RNG (outer-scope refs)."""
        return GraphBuilder(name, 0, _shared=self._s)

    def graph(self) -> GraphProto:
        """This builder's nodes as a GraphProto (branch graphs carry no initializers)."""
        return make_graph(self.nodes, self.name, self.inputs, self.outputs)

    def model(self, doc: str, metadata: dict[str, str] | None = None) -> ModelProto:
        graph = make_graph(self.nodes, self.name, self.inputs, self.outputs,
                                  initializer=self._s.initializers)
        m = make_model(graph, opset_imports=[make_opsetid("", OPSET)],
                              producer_name="dynnet_ros.zoo", doc_string=doc)
        m.ir_version = IR_VERSION
        for key, value in sorted((metadata or {}).items()):
            entry = m.metadata_props.add()
            entry.key, entry.value = key, value
        return m


#: the symbolic batch dim of models that batch frames (one run serves several cameras)
BATCH = "B"


def image_input(g: GraphBuilder, name: str = "image", channels: int = 3, batch: int | str = 1) -> str:
    """The standard float32 NCHW input with symbolic H, W and batch ``batch`` (1, or ``BATCH`` for
    models whose every op keeps frames apart, so a batch of frames gives each frame's result)."""
    return g.add_input(name, FLOAT, [batch, channels, "H", "W"])
