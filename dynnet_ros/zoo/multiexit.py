"""`multiexit`: a 3-stage classifier with an exit head after each stage (for the mapper).

Stage 0 (to H/4, 32 ch), stage 1 (to H/16, 64->128 ch), stage 2 (to H/32, 256 ch); every exit is
GlobalAveragePool -> Flatten -> Gemm(10). Weights are random (fixed seed).
"""
from __future__ import annotations

from dynnet_ros.engine.modelio.onnx_proto import ModelProto

from .graph import FLOAT, GraphBuilder, image_input

SEED = 505


def _res(g: GraphBuilder, x: str, c: int) -> str:
    y = g.cbr(x, c, c, 3)
    y = g.cbr(y, c, c, 3, act=False)
    return g.relu(g.op("Add", [x, y]))


def build() -> ModelProto:
    g = GraphBuilder("multiexit", SEED)
    x = image_input(g)
    h = g.cbr(x, 3, 16, 3, stride=2)
    h = g.cbr(h, 16, 32, 3, stride=2)               # /4
    h = _res(g, h, 32)
    g.add_output(g.classifier(h, 32), "exit0", FLOAT, [1, 10])
    h = g.cbr(h, 32, 64, 3, stride=2)               # /8
    h = _res(g, h, 64)
    h = g.cbr(h, 64, 128, 3, stride=2)              # /16
    h = _res(g, h, 128)
    g.add_output(g.classifier(h, 128), "exit1", FLOAT, [1, 10])
    h = g.cbr(h, 128, 256, 3, stride=2)             # /32
    h = _res(g, h, 256)
    h = _res(g, h, 256)
    g.add_output(g.classifier(h, 256), "exit2", FLOAT, [1, 10])
    return g.model(__doc__.strip().splitlines()[0])
