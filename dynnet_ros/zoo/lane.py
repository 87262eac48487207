"""`lane`: encoder-decoder lane segmentation (U-Net-like), per-pixel lane probability.

Structure: five stride-2 Conv+BN+ReLU stages (to H/32), a context conv, then three decoder steps
(Resize x2 -> Concat with the encoder skip -> Conv+BN+ReLU), a 1x1 conv to one logit at H/4,
a bilinear Resize x4 to input size and a Sigmoid.

Weights are random (fixed seed). So the demo mask is not pure noise, the logit also gets a
hand-designed "bright thin line" channel: whiteness (2*min(RGB) - max(RGB), floored at 0.25)
minus its 15x15 local mean (a top-hat), which fires on white lane paint brighter than the
surrounding road and stays low on sky, grass and coloured objects.

Early exit (metadata ``dynnet_exits``, for dynnet_ros.mapper): a coarse mask, the hand channel plus
a 1x1 conv of the /4 features, upsampled; judged by its mean pixel confidence.
"""
from __future__ import annotations

import json

from dynnet_ros.engine.modelio.onnx_proto import ModelProto

from .graph import BATCH, FLOAT, GraphBuilder, image_input

SEED = 101
ENC = (16, 32, 64, 128, 256)          # channels at /2 /4 /8 /16 /32
DEC = (96, 48, 24)                     # channels at /16 /8 /4
_TOPHAT_BIAS, _TOPHAT_GAIN, _WHITE_FLOOR = 0.2, 30.0, 0.25


def build() -> ModelProto:
    g = GraphBuilder("lane", SEED)
    x = image_input(g, batch=BATCH)
    skips, cin, h = [], 3, x
    for c in ENC:                                   # encoder
        h = g.cbr(h, cin, c, 3, stride=2)
        h = g.cbr(h, c, c, 3) if c >= 64 else h
        skips.append(h)
        cin = c
    h = g.cbr(h, cin, cin, 3)                        # context at /32
    for c, skip, cs in zip(DEC, reversed(skips[:-1]), reversed(ENC[:-1])):  # decoder
        up = g.resize(h, 2.0)
        cat = g.op("Concat", [up, skip], axis=1)
        h = g.cbr(cat, cin + cs, c, 3)
        cin = c
    net_logit = g.conv(h, cin, 1, 1, std=0.02)      # at /4
    net_logit = g.resize(net_logit, 4.0, mode="linear")   # back to H x W

    # Hand-designed channel: top-hat of "whiteness" 2*min(RGB) - max(RGB) (bright, unsaturated
    # paint on darker asphalt; blue sky and green grass score low on whiteness).
    lo = g.op("ReduceMin", [x], axes=[1], keepdims=1, prefix="lane_min")
    hi = g.op("ReduceMax", [x], axes=[1], keepdims=1, prefix="lane_max")
    lum = g.op("Sub", [g.op("Mul", [lo, g.const([2.0])]), hi], prefix="lane_white")
    # floor at about asphalt level so saturated objects do not make their surroundings look white
    lum = g.op("Max", [lum, g.const([_WHITE_FLOOR])], prefix="lane_white_floor")
    local = g.op("AveragePool", [lum], kernel_shape=[15, 15], pads=[7, 7, 7, 7],
                 count_include_pad=0, prefix="lane_localmean")
    tophat = g.op("Sub", [lum, local])
    hand = g.op("Mul", [g.op("Sub", [tophat, g.const([_TOPHAT_BIAS])]), g.const([_TOPHAT_GAIN])])
    logit = g.op("Add", [hand, net_logit])
    prob = g.op("Sigmoid", [logit])
    g.add_output(prob, "lane_prob", FLOAT, [BATCH, 1, "H", "W"])
    # Early exit (declared in the `dynnet_exits` metadata, read by dynnet_ros.mapper; no graph output
    # reads it, so a plain run skips it): a coarse mask from the hand-designed channel and a 1x1
    # conv of the /4 encoder features, before the deeper encoder and the decoder run. Built last so
    # the other weights keep their seeded values.
    coarse = g.resize(g.conv(skips[1], ENC[1], 1, 1, std=0.02, prefix="lane_exit"), 4.0, mode="linear")
    coarse_prob = g.op("Sigmoid", [g.op("Add", [hand, coarse])], prefix="lane_exit_prob")
    exits = [{"outputs": [coarse_prob], "criterion": "mean_confidence"}, {"outputs": ["lane_prob"]}]
    return g.model(__doc__.strip().splitlines()[0], metadata={"dynnet_exits": json.dumps(exits)})
