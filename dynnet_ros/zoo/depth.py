"""`depth`: encoder-decoder depth estimator fusing the camera image with sparse LiDAR depth.

Network: the image and the LiDAR depth (metres / 80) are concatenated into 4 channels; five
stride-2 Conv+BN+ReLU stages go to H/32 (512 ch) where a heavy 3x3 conv and a DORN-style
"full-image encoder" (GlobalAveragePool -> Gemm 512->2048->3072->512, broadcast back) hold most
of the weights (>= 40 MB, almost all at 1/32 resolution or global, so compute stays modest). The decoder
upsamples with Resize and adds encoder skips down to H/4 (grouped 3x3 convs), predicts one
channel, applies Softplus + 0.5 m (always > 0) and resizes it x4 (bilinear) to input size.

LiDAR fusion (hand-designed, deterministic): pixels with a return (lidar > 0) output the LiDAR
value exactly; elsewhere the output blends a normalised-convolution densification of the LiDAR
(hit-weighted averages over 8x8 and 32x32 cells, upsampled) with the network estimate, weighted
by the local hit density: depth = m*L + (1-m)*(c*D + (1-c)*N), c = 1 - exp(-k * density).

Early exit (metadata ``dynnet_exits``, for dynnet_ros.mapper): the same fusion with the network's
prior depth in place of N — a coarse map from the LiDAR alone — judged by the mean of c.
"""
from __future__ import annotations

import json

import numpy as np

from dynnet_ros.engine.modelio.onnx_proto import ModelProto, TensorProto

from .graph import BATCH, FLOAT, GraphBuilder, image_input

SEED = 303
ENC = (32, 64, 128, 256, 512)          # /2 /4 /8 /16 /32
FULL_IMAGE = (2048, 3072)              # hidden widths of the full-image encoder
LIDAR_SCALE = 80.0                     # metres -> network input scale
MIN_DEPTH = 0.5
_CONF_GAIN = 100.0                    # confidence gain on the local LiDAR hit density
_PRIOR_DEPTH = float(np.log1p(np.exp(2.0)) + MIN_DEPTH)   # the network's output before it learns: softplus(2) + 0.5


def _cell_average(g: GraphBuilder, lidar: str, mask: str, cell: int, weight: float) -> tuple[str, str]:
    """LiDAR sum and hit count averaged over ``cell`` x ``cell`` blocks, upsampled back, times ``weight``."""
    pool = {"kernel_shape": [cell, cell], "strides": [cell, cell]}
    n = g.resize(g.op("AveragePool", [lidar], prefix="lidar_sum", **pool), float(cell), "linear")
    d = g.resize(g.op("AveragePool", [mask], prefix="lidar_hits", **pool), float(cell), "linear")
    if weight != 1.0:
        n, d = g.op("Mul", [n, g.const([weight])]), g.op("Mul", [d, g.const([weight])])
    return n, d


def _sparse_fusion(g: GraphBuilder, lidar: str, net_depth: str) -> tuple[str, str, str]:
    """m*L + (1-m)*(c*D + (1-c)*N): exact at LiDAR hits, densified LiDAR near them. Also the coarse
    map with the network's prior in place of N, and the mean confidence c (the early exit)."""
    mask = g.op("Cast", [g.op("Greater", [lidar, g.const([0.0])])], to=TensorProto.FLOAT)
    num, den = _cell_average(g, lidar, mask, 8, 1.0)
    n, d = _cell_average(g, lidar, mask, 32, 0.05)
    num, den = g.op("Add", [num, n]), g.op("Add", [den, d])
    dense = g.op("Div", [num, g.op("Add", [den, g.const([1e-6])])], prefix="lidar_dense")
    # confidence c = 1 - exp(-k * den): ~0 where no hits nearby, -> 1 where hits are dense
    conf = g.op("Sub", [g.const([1.0]), g.op("Exp", [g.op("Mul", [den, g.const([-_CONF_GAIN])])])])
    est = g.op("Add", [g.op("Mul", [conf, dense]),
                       g.op("Mul", [g.op("Sub", [g.const([1.0]), conf]), net_depth])])
    keep = g.op("Mul", [mask, lidar])
    fused = g.op("Add", [keep, g.op("Mul", [g.op("Sub", [g.const([1.0]), mask]), est])], prefix="fused")
    prior = g.op("Add", [g.op("Mul", [conf, dense]),
                         g.op("Mul", [g.op("Sub", [g.const([1.0]), conf]), g.const([_PRIOR_DEPTH])])])
    coarse = g.op("Add", [keep, g.op("Mul", [g.op("Sub", [g.const([1.0]), mask]), prior])], prefix="depth_exit")
    confidence = g.op("ReduceMean", [conf], keepdims=0, prefix="depth_exit_confidence")
    return fused, coarse, confidence


def build() -> ModelProto:
    g = GraphBuilder("depth", SEED)
    img = image_input(g, batch=BATCH)
    lidar_in = g.add_input("lidar_depth", FLOAT, [BATCH, 1, "H", "W"])
    lidar = g.op("Relu", [lidar_in], prefix="lidar_valid")            # negative = invalid = 0
    x = g.op("Concat", [img, g.op("Mul", [lidar, g.const([1.0 / LIDAR_SCALE])])], axis=1)

    skips, cin, h = [], 4, x
    for c in ENC:
        h = g.cbr(h, cin, c, 3, stride=2)
        skips.append(h)
        cin = c
    h = g.cbr(h, 512, 512, 3)                                          # heavy /32 layer
    ctx = g.op("Flatten", [g.op("GlobalAveragePool", [h])], axis=1)    # full-image encoder
    width = 512
    for hidden in FULL_IMAGE:
        ctx = g.relu(g.gemm(ctx, width, hidden))
        width = hidden
    ctx = g.gemm(ctx, width, 512, std=0.01)
    ctx = g.op("Unsqueeze", [ctx, g.const([2, 3], np.int64)])          # [B,512,1,1]
    h = g.relu(g.op("Add", [h, ctx]))

    for skip, c in zip(skips[-2:0:-1], ENC[-2:0:-1]):                   # decoder: /16 /8 /4
        h = g.cbr(h, cin, c, 1)
        h = g.relu(g.op("Add", [g.resize(h, 2.0), skip]))
        h = g.cbr(h, c, c // 2, 3, groups=4)                              # grouped 3x3 (ResNeXt-like)
        cin = c // 2
    raw = g.conv(h, cin, 1, 3, std=0.01)                                 # at /4
    raw = g.op("Add", [raw, g.const([2.0])])                           # prior softplus(2) + 0.5 ~ 2.6 m
    net_depth = g.op("Add", [g.op("Softplus", [raw]), g.const([MIN_DEPTH])])
    # bilinear x4 of positive values stays positive
    net_depth = g.resize(net_depth, 4.0, mode="linear")
    depth, coarse, confidence = _sparse_fusion(g, lidar, net_depth)
    g.add_output(depth, "depth", FLOAT, [BATCH, 1, "H", "W"])
    # Early exit (declared in the `dynnet_exits` metadata, read by dynnet_ros.mapper; no graph output
    # reads it, so a plain run skips it): the LiDAR densification with the network's prior depth
    # where no LiDAR is near, judged by the mean LiDAR confidence c, before the network runs.
    exits = [{"outputs": [coarse], "criterion": "mean_confidence", "confidence": confidence},
             {"outputs": ["depth"]}]
    return g.model(__doc__.strip().splitlines()[0], metadata={"dynnet_exits": json.dumps(exits)})
