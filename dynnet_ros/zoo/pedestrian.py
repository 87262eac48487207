"""`pedestrian`: YOLO-style single-class detector with in-graph box decode and NMS.

Backbone: stride-2 Conv+BN+ReLU stages with residual blocks to H/32; a small top-down FPN (Resize
x2 + Concat) feeds three heads at strides 8/16/32. Each head predicts, per grid cell, one anchor
(tx, ty, tw, th, objectness, class). The decode builds the cell grid from the head's runtime shape
(Shape -> Gather -> Range -> Unsqueeze, so H and W stay dynamic) and applies the YOLOv5 rule
cx = (cell_x + 2*sigmoid(tx) - 0.5) * stride, w = anchor_w * (2*sigmoid(tw))^2. Boxes are clipped
to the image and NonMaxSuppression (score_threshold / iou_threshold / max_detections inputs)
selects N boxes; Gather produces boxes [N, 4] and scores [N] = objectness * class probability.

The convolution weights are random (fixed seed) and the learned heads are initialised near zero,
so on their own they output nothing meaningful. Each head therefore adds a hand-designed,
deterministic channel (see _vertical_edges/_hand_channels): signed vertical-edge energy
sum_c |dI/dx| - |dI/dy| at half resolution, averaged per grid cell, clipped at 0, then an
anchor-sized window (7x3 cells) minus a twice-as-tall window (15x3 cells), which peaks on upright
high-contrast blobs about 7 cells tall. It drives the objectness logit (the anchor-window energy
also drives the class logit), and only 3x3 local maxima keep their score (CenterNet-style).
Solid-colour upright rectangles on a road scene (the simulator's pedestrians) therefore give
detections whose scores grow with contrast; horizon, road edges and ~45-degree lane lines give
little energy. Raising score_threshold lowers N.

Early exit (metadata ``dynnet_exits``, for dynnet_ros.mapper): the largest hand-designed objectness
at a peak, computed from the image alone; when it is low, "no pedestrian" answers with no boxes.
"""
from __future__ import annotations

import json

import numpy as np

from dynnet_ros.engine.modelio.onnx_proto import ModelProto, TensorProto

from .graph import FLOAT, INT64, GraphBuilder, image_input

SEED = 202
STRIDES = (8, 16, 32)
ANCHORS = {s: (2.5 * s, 7.0 * s) for s in STRIDES}   # (w, h) in pixels, pedestrian-shaped
_OBJ_GAIN, _OBJ_BIAS = 50.0, 0.06
_CLS_GAIN, _CLS_BIAS = 10.0, 0.5


def _res(g: GraphBuilder, x: str, c: int) -> str:
    y = g.cbr(x, c, c // 2, 1)
    y = g.cbr(y, c // 2, c, 3, act=False)
    return g.relu(g.op("Add", [x, y]))


def _vertical_edges(g: GraphBuilder, image: str) -> str:
    """Signed vertical-edge energy at half resolution, [1,1,H/2,W/2]: sum_c |d/dx| - |d/dy|.

    Upright object sides give positive energy; horizontal structure (horizon, road edges, dash
    ends) gives negative energy, and ~49-degree lane lines and sensor noise about zero.
    """
    kx = np.zeros((3, 1, 3, 3), np.float32)
    kx[:, 0, 1, 0], kx[:, 0, 1, 2] = -0.5, 0.5
    ky = np.transpose(kx, (0, 1, 3, 2)).copy()
    half = g.op("AveragePool", [image], kernel_shape=[2, 2], strides=[2, 2], prefix="blob_half")
    # replicate-pad so the image border is not mistaken for an edge
    padded = g.op("Pad", [half, g.const([0, 0, 1, 1, 0, 0, 1, 1], np.int64)], mode="edge", prefix="blob_pad")
    mags = []
    for name, k in (("gx", kx), ("gy", ky)):
        grad = g.op("Conv", [padded, g.weight(f"blob_{name}_w", k)], kernel_shape=[3, 3], pads=[0, 0, 0, 0],
                    group=3, prefix=f"blob_{name}")
        mags.append(g.op("ReduceSum", [g.op("Abs", [grad]), g.const([1], np.int64)], keepdims=1,
                         prefix=f"blob_{name}_sum"))
    return g.op("Sub", mags, prefix="blob_vertical_energy")


def _hand_channels(g: GraphBuilder, energy: str, stride: int) -> tuple[str, str, str]:
    """Deterministic upright-blob detector at one stride: objectness logit, class logit and a
    0/1 local-peak mask, each [1,1,h,w].

    Per cell, the vertical-edge energy is averaged over a window the anchor's size (7 cells tall,
    3 wide) minus a window twice as tall (15 cells): a blob with upright sides about 7 cells tall
    scores highest at this stride; a taller one scores higher at the next stride.
    """
    cell = stride // 2                              # the energy map is at half resolution
    cells = g.op("AveragePool", [energy], kernel_shape=[cell, cell], strides=[cell, cell],
                 prefix=f"blob{stride}_cells")
    # x stride: a one-pixel edge line then scores the same per cell at every stride;
    # Relu: horizontal structure (negative energy) neither counts nor cancels uprights
    cells = g.op("Relu", [g.op("Mul", [cells, g.const([float(cell)])])], prefix=f"blob{stride}_upright")

    def window(kh: int, kw: int) -> str:
        return g.op("AveragePool", [cells], kernel_shape=[kh, kw],
                    pads=[kh // 2, kw // 2, kh // 2, kw // 2], count_include_pad=1,
                    prefix=f"blob{stride}_win{kh}x{kw}")

    anchor, tall = window(7, 3), window(15, 3)
    centre = g.op("Sub", [anchor, tall])
    obj = g.op("Mul", [g.op("Sub", [centre, g.const([_OBJ_BIAS])]), g.const([_OBJ_GAIN])])
    cls = g.op("Add", [g.op("Mul", [anchor, g.const([_CLS_GAIN])]), g.const([_CLS_BIAS])])
    # CenterNet-style peak picking: only 3x3 local maxima keep their score
    peak_max = g.op("MaxPool", [centre], kernel_shape=[3, 3], pads=[1, 1, 1, 1], prefix=f"blob{stride}_peakmax")
    peak = g.op("Cast", [g.op("GreaterOrEqual", [centre, peak_max])], to=TensorProto.FLOAT,
                prefix=f"blob{stride}_peak")
    return obj, g.op("Mul", [cls, peak]), peak


def _decode(g: GraphBuilder, pred: str, obj_hand: str, cls_hand: str, peak: str,
            stride: int) -> tuple[str, str]:
    """Head output [1,6,h,w] -> boxes [1,h*w,4] (x1,y1,x2,y2 px) and scores [1,1,h*w]."""
    tx, ty, tw, th, obj, cls = g.op_multi("Split", [pred, g.const([1] * 6, np.int64)], 6, axis=1,
                                          prefix=f"head{stride}_split")
    shape = g.op("Shape", [pred])
    h = g.op("Cast", [g.op("Gather", [shape, g.const(2, np.int64)], axis=0)], to=TensorProto.FLOAT)
    w = g.op("Cast", [g.op("Gather", [shape, g.const(3, np.int64)], axis=0)], to=TensorProto.FLOAT)
    zero, one = g.const(0.0), g.const(1.0)
    gy = g.op("Unsqueeze", [g.op("Range", [zero, h, one], prefix=f"grid{stride}_y"), g.const([1], np.int64)])
    gx = g.op("Unsqueeze", [g.op("Range", [zero, w, one], prefix=f"grid{stride}_x"), g.const([0], np.int64)])
    s = g.const([float(stride)])

    def centre(t: str, grid: str) -> str:   # (grid + 2*sigmoid(t) - 0.5) * stride
        off = g.op("Sub", [g.op("Mul", [g.op("Sigmoid", [t]), g.const([2.0])]), g.const([0.5])])
        return g.op("Mul", [g.op("Add", [off, grid]), s])

    def extent(t: str, anchor: float) -> str:   # anchor * (2*sigmoid(t))^2 / 2 (half size)
        v = g.op("Mul", [g.op("Sigmoid", [t]), g.const([2.0])])
        return g.op("Mul", [g.op("Mul", [v, v]), g.const([anchor / 2.0])])

    aw, ah = ANCHORS[stride]
    cx, cy, hw, hh = centre(tx, gx), centre(ty, gy), extent(tw, aw), extent(th, ah)
    corners = [g.op("Sub", [cx, hw]), g.op("Sub", [cy, hh]), g.op("Add", [cx, hw]), g.op("Add", [cy, hh])]
    box = g.op("Concat", corners, axis=1)                                        # [1,4,h,w]
    box = g.op("Transpose", [g.op("Reshape", [box, g.const([1, 4, -1], np.int64)])], perm=[0, 2, 1])
    p_obj = g.op("Sigmoid", [g.op("Add", [obj, obj_hand])])
    p_cls = g.op("Sigmoid", [g.op("Add", [cls, cls_hand])])
    score = g.op("Mul", [g.op("Mul", [p_obj, p_cls]), peak])
    score = g.op("Reshape", [score, g.const([1, 1, -1], np.int64)], prefix=f"score{stride}")
    return box, score


def build() -> ModelProto:
    g = GraphBuilder("pedestrian", SEED)
    image = image_input(g)
    score_thr = g.add_input("score_threshold", FLOAT, [1])
    iou_thr = g.add_input("iou_threshold", FLOAT, [1])
    max_det = g.add_input("max_detections", INT64, [1])

    h = g.cbr(image, 3, 16, 3, stride=2)                 # /2
    h = g.cbr(h, 16, 32, 3, stride=2)                    # /4
    h = _res(g, h, 32)
    p8 = _res(g, g.cbr(h, 32, 64, 3, stride=2), 64)      # /8
    p16 = _res(g, g.cbr(p8, 64, 128, 3, stride=2), 128)  # /16
    p32 = _res(g, g.cbr(p16, 128, 256, 3, stride=2), 256)  # /32
    p32 = g.cbr(p32, 256, 256, 3)
    # top-down FPN
    t32 = g.cbr(p32, 256, 128, 1)
    f16 = g.cbr(g.op("Concat", [g.resize(t32, 2.0), p16], axis=1), 256, 128, 1)
    t16 = g.cbr(f16, 128, 64, 1)
    f8 = g.cbr(g.op("Concat", [g.resize(t16, 2.0), p8], axis=1), 128, 64, 1)
    feats = {8: (f8, 64), 16: (f16, 128), 32: (p32, 256)}

    energy = _vertical_edges(g, image)
    boxes, scores, peaks = [], [], []
    for stride in STRIDES:
        f, c = feats[stride]
        f = g.cbr(f, c, c, 3)
        pred = g.conv(f, c, 6, 1, std=0.001, prefix=f"head{stride}")
        obj_hand, cls_hand, peak = _hand_channels(g, energy, stride)
        b, s = _decode(g, pred, obj_hand, cls_hand, peak, stride)
        boxes.append(b)
        scores.append(s)
        peaks.append(g.op("Mul", [g.op("Sigmoid", [obj_hand]), peak], prefix=f"exit{stride}_objectness"))
    all_boxes = g.op("Concat", boxes, axis=1, prefix="all_boxes")                # [1,A,4]
    all_scores = g.op("Concat", scores, axis=2, prefix="all_scores")             # [1,1,A]

    # clip to the image: 0 <= x <= W, 0 <= y <= H
    ishape = g.op("Cast", [g.op("Shape", [image])], to=TensorProto.FLOAT)
    hw = g.op("Gather", [ishape, g.const([3, 2, 3, 2], np.int64)], axis=0)      # [W,H,W,H]
    all_boxes = g.op("Min", [g.op("Max", [all_boxes, g.const([0.0])]), hw], prefix="clipped_boxes")

    sq = g.const([0], np.int64)
    selected = g.op("NonMaxSuppression", [all_boxes, all_scores,
                                          g.op("Squeeze", [max_det, sq]), g.op("Squeeze", [iou_thr, sq]),
                                          g.op("Squeeze", [score_thr, sq])], prefix="nms")  # [N,3]
    idx = g.op("Gather", [selected, g.const(2, np.int64)], axis=1, prefix="keep")              # [N]
    flat_boxes = g.op("Squeeze", [all_boxes, sq])                                              # [A,4]
    flat_scores = g.op("Reshape", [all_scores, g.const([-1], np.int64)])                        # [A]
    g.add_output(g.op("Gather", [flat_boxes, idx], axis=0), "boxes", FLOAT, ["N", 4])
    g.add_output(g.op("Gather", [flat_scores, idx], axis=0), "scores", FLOAT, ["N"])
    # Early exit (declared in the `dynnet_exits` metadata, read by dynnet_ros.mapper; no graph output
    # reads it, so a plain run skips it): the largest hand-designed objectness at a peak, over all
    # strides, before the backbone runs. A box's score is at most its objectness, so a maximum below
    # the score threshold means "no pedestrian": that exit answers with no boxes.
    top = [g.op("ReduceMax", [p], keepdims=0, prefix="exit_max") for p in peaks]
    objectness = g.op("Reshape", [g.op("Max", top), g.const([1], np.int64)], prefix="pedestrian_exit_objectness")
    exits = [{"outputs": [objectness], "criterion": "max_objectness", "answer": "empty"},
             {"outputs": ["boxes", "scores"]}]
    return g.model(__doc__.strip().splitlines()[0], metadata={"dynnet_exits": json.dumps(exits)})
