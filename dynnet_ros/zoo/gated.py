"""`gated`: SkipNet/BlockDrop-style classifier; each residual block sits inside an ONNX `If`.

Gate: GlobalAveragePool(image) -> Flatten -> Gemm(3 -> 4 blocks) -> Sigmoid -> Greater(0.5) ->
Gather block i -> Squeeze to a bool scalar. The then-branch runs the residual block, the
else-branch is Identity. Gate weights are hand-set (not random) so the behaviour is documented:
block i runs iff the mean image intensity (over pixels and RGB) is below GATE_THRESHOLDS[i] -
darker (harder) frames spend more compute. Mean < 0.15 runs all four blocks, mean >= 0.75 none.
Convolution weights are random (fixed seed).
"""
from __future__ import annotations

import numpy as np

from dynnet_ros.engine.modelio.onnx_proto import ModelProto

from .graph import FLOAT, GraphBuilder, image_input

SEED = 404
GATE_THRESHOLDS = (0.75, 0.55, 0.35, 0.15)
CHANNELS = 64
_SHARPNESS = 40.0


def _gates(g: GraphBuilder, x: str) -> str:
    n = len(GATE_THRESHOLDS)
    pooled = g.op("Flatten", [g.op("GlobalAveragePool", [x])], axis=1)        # [1, 3]
    w = np.full((3, n), -_SHARPNESS / 3.0, np.float32)                          # -k * mean
    b = np.array([_SHARPNESS * t for t in GATE_THRESHOLDS], np.float32)         # +k * t_i
    logits = g.op("Gemm", [pooled, g.weight("gate_w", w), g.weight("gate_b", b)], prefix="gate_fc")
    prob = g.op("Sigmoid", [logits])
    return g.op("Greater", [prob, g.const([0.5])], prefix="gate_on")            # [1, n] bool


def _gated_block(g: GraphBuilder, x: str, gates: str, i: int) -> str:
    cond = g.op("Gather", [gates, g.const(i, np.int64)], axis=1, prefix="gate_pick")   # [1]
    cond = g.op("Squeeze", [cond, g.const([0], np.int64)], prefix="gate_cond")        # scalar
    then = g.subgraph(f"block{i}_run")
    y = then.cbr(x, CHANNELS, CHANNELS, 3)
    y = then.cbr(y, CHANNELS, CHANNELS, 3, act=False)
    y = then.relu(then.op("Add", [x, y]))
    then.add_output(y, then.fresh(f"block{i}_run_out"), FLOAT, None)
    skip = g.subgraph(f"block{i}_skip")
    skip.add_output(x, skip.fresh(f"block{i}_skip_out"), FLOAT, None)
    return g.op("If", [cond], prefix=f"block{i}_if", then_branch=then.graph(), else_branch=skip.graph())


def build() -> ModelProto:
    g = GraphBuilder("gated", SEED)
    x = image_input(g)
    gates = _gates(g, x)
    h = g.cbr(x, 3, 32, 3, stride=2)
    h = g.cbr(h, 32, CHANNELS, 3, stride=2)
    h = g.cbr(h, CHANNELS, CHANNELS, 3, stride=2)   # /8
    for i in range(len(GATE_THRESHOLDS)):
        h = _gated_block(g, h, gates, i)
    h = g.cbr(h, CHANNELS, 128, 3, stride=2)        # /16
    g.add_output(g.classifier(h, 128), "logits", FLOAT, [1, 10])
    return g.model(__doc__.strip().splitlines()[0], {"gate_thresholds": repr(GATE_THRESHOLDS)})
