"""Early exits for a model that has none, learned from the user's own frames (self-distillation).

Why: Map-and-Conquer gains only where an early exit answers; an exported detector or segmenter
has no exit. A light head on an intermediate tensor, fitted so that its answer matches the full
model's own output on the user's frames, needs no labels. The head's nodes are added to the model
beside the original ones and declared in its ``dynnet_exits`` metadata (``exits.py``); no graph
output reads them, so a plain run of the model skips them, while ``depth_stages`` cuts the model
after each head and the stage runtime answers there when the head is confident enough.

Three head kinds, one per task (``ExitTask.kind``):

* ``scores`` (a classifier's ``[N, K]`` output): global-average-pooled features -> Gemm, fitted
  by ridge least squares to the model's logits (log-probabilities when its output is
  probabilities, then a Softmax); criterion ``max_softmax`` on the capped logits.
* ``mask`` (a one-channel map ``[N, 1, H, W]``): a 1x1 Conv on the features, fitted by least
  squares per pixel to the logit of the model's map average-pooled to the features' grid, then a
  Sigmoid and a Resize to the output's size; criterion ``mean_confidence`` on the coarse map.
* ``presence`` (a raw YOLO head ``[N, 4 + C, A]``): pooled features -> Gemm -> Sigmoid, a
  logistic regression of "the model reports a box" (a class score >= the score threshold); the
  exit answers, when confident that nothing is there, a zero tensor of the output's shape (every
  score 0: no box), the anchors ``A`` computed in the graph from the image size and strides.

Every head's logits are clipped to ±``LOGIT_CAP`` before its probabilities, so no confidence
reaches 1.0: at threshold 1.0 no early exit answers and the stages reproduce the full model.

Exit points (``cut_points``): tensors where a depth-wise cut is legal (RDP proves the shape of
every tensor the cut hands on) and cheap (few bytes handed on), with the share of the model's
FLOPs computed before them.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnxruntime as ort

from dynnet_ros.engine.modelio import onnx_proto
from dynnet_ros.engine.modelio.models import load_model
from dynnet_ros.engine.modelio.onnx_proto import (
    ModelProto,
    NodeProto,
    TensorProto,
    from_array,
    make_empty_tensor_value_info,
    make_node,
    make_tensor,
)
from dynnet_ros.engine.rdp import AnalysisResult

from .exits import METADATA_KEY, ExitSpec, exits_metadata, model_exits
from .profiler import node_features, shapes_at
from .stages import node_reads

KINDS = ("scores", "mask", "presence")
#: head logits are clipped to this, so a head's confidence stays below 1 (see the module docstring)
LOGIT_CAP = 9.0
#: ridge penalty relative to the features' (standardised) second moment
RIDGE = 1e-2
#: pixels per frame a mask head is fitted on (subsampled evenly)
MASK_PIXELS_PER_FRAME = 4096
#: a mask frame agrees when this share of its pixels take the same side of 0.5
MASK_PIXEL_AGREEMENT = 0.99
#: default range of a cut's share of the model's FLOPs for ``choose_points``
EARLY_RANGE = (0.15, 0.6)
#: onnxruntime fuses these producers with a following element-wise op or normalisation (FusedConv,
#: NCHWc kernels with an activation or a sum, Gemm + activation); a cut between the two would run
#: them apart and round differently, so no cut hands on such a tensor
FUSING_PRODUCERS = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul", "BatchNormalization"})
FUSED_CONSUMERS = frozenset({"Relu", "Clip", "Sigmoid", "HardSigmoid", "HardSwish", "LeakyRelu", "Tanh", "Elu",
                             "Add", "Sum", "Mul", "Sub", "Div", "BatchNormalization", "PRelu", "Softplus"})


@dataclass(frozen=True)
class ExitTask:
    """What the heads imitate: the final output they stand in for and how it is read."""

    kind: str                              # scores | mask | presence
    output: str                            # the final output
    image_input: str                       # the model's image input
    score_threshold: float = 0.25          # presence: a box is reported at this class score
    strides: tuple[int, ...] = ()          # presence: the head's grid strides
    box_channels: int = 4                  # presence: leading channels that are box coordinates

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown exit head kind {self.kind!r}; choose one of {', '.join(KINDS)}")
        if self.kind == "presence" and not self.strides:
            raise ValueError("a presence head needs the detector's strides")

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "output": self.output, "image_input": self.image_input,
                "score_threshold": self.score_threshold, "strides": list(self.strides),
                "box_channels": self.box_channels}


@dataclass(frozen=True)
class CutPoint:
    """An intermediate tensor an exit head can read, measured at a sample frame."""

    tensor: str
    shape: tuple[int, ...]
    cost_fraction: float                   # share of the model's FLOPs computed before it
    crossing: tuple[str, ...]              # tensors a cut after it hands to the rest of the model
    crossing_bytes: int

    def to_json(self) -> dict[str, Any]:
        return {"tensor": self.tensor, "shape": list(self.shape), "cost_fraction": round(self.cost_fraction, 4),
                "crossing": list(self.crossing), "crossing_mb": round(self.crossing_bytes / 2**20, 4)}


# ------------------------------------------------------------------------------------ agreement
def presence(values: np.ndarray, task: ExitTask) -> bool:
    """Whether a raw YOLO output reports a box: a class score at the threshold anywhere."""
    scores = values[:, task.box_channels:]
    return bool(scores.size) and float(scores.max()) >= task.score_threshold


def _binary(values: np.ndarray) -> np.ndarray:
    """A one-channel map's pixels on the object side: p >= 0.5 (logits: >= 0)."""
    logits = float(values.min(initial=0.0)) < 0.0 or float(values.max(initial=0.0)) > 1.0
    return values >= (0.0 if logits else 0.5)


def agrees(task: ExitTask, answer: np.ndarray, final: np.ndarray) -> bool:
    """Whether an exit's answer stands for the model's: the same class per row (scores), the
    same side of 0.5 on ``MASK_PIXEL_AGREEMENT`` of the pixels (mask), the same "any box" (presence)."""
    if task.kind == "scores":
        return bool(np.array_equal(answer.reshape(len(answer), -1).argmax(1), final.reshape(len(final), -1).argmax(1)))
    if task.kind == "mask":
        if answer.shape != final.shape:
            return False
        return float(np.mean(_binary(answer) == _binary(final))) >= MASK_PIXEL_AGREEMENT
    return answer.shape == final.shape and presence(answer, task) == presence(final, task)


# ------------------------------------------------------------------------------------ cut points
def cut_points(model: ModelProto, rdp: AnalysisResult, feed: Mapping[str, np.ndarray]) -> list[CutPoint]:
    """Every float NCHW tensor a head could read where a depth-wise cut is legal (RDP proves the
    shape of each tensor the cut hands on) and keeps the model's rounding (no tensor handed on sits
    between two ops onnxruntime fuses), in graph order, measured at ``feed``'s size."""
    graph = model.graph
    shapes = shapes_at(model, feed)
    producer = {out: i for i, node in enumerate(graph.node) for out in node.output}
    flops = []
    for node in graph.node:
        features = None if node.op_type == "Constant" else node_features(node, shapes)
        flops.append(features.flops if features is not None else 0.0)
    total = sum(flops) or 1.0
    consumers: dict[str, list[int]] = {}
    for i, node in enumerate(graph.node):
        for name in node_reads(node):
            consumers.setdefault(name, []).append(i)
    float_types = {TensorProto.FLOAT}
    types = {v.name: v.type.tensor_type.elem_type for v in list(graph.value_info) + list(graph.output)}
    inferred = onnx_proto.onnx_library().shape_inference.infer_shapes(model)
    types.update({v.name: v.type.tensor_type.elem_type for v in inferred.graph.value_info})
    outputs = {o.name for o in graph.output}
    points = []
    ancestors: dict[int, frozenset[int]] = {}
    for i, node in enumerate(graph.node):
        parents = [producer[name] for name in node_reads(node) if name in producer]
        ancestors[i] = frozenset([i]).union(*(ancestors[p] for p in parents)) if parents else frozenset([i])
    for i, node in enumerate(graph.node):
        if node.op_type == "Constant":
            continue
        for name in node.output:
            shape = shapes.get(name)
            if not shape or len(shape) != 4 or types.get(name) not in float_types or name in outputs:
                continue
            before = ancestors[i]
            crossing = sorted({out for j in before for out in graph.node[j].output
                               if graph.node[j].op_type != "Constant"
                               and any(c not in before for c in consumers.get(out, []))})
            if not crossing or not _proven(rdp, crossing) or any(
                    graph.node[producer[c]].op_type in FUSING_PRODUCERS
                    and any(graph.node[j].op_type in FUSED_CONSUMERS for j in consumers.get(c, []))
                    for c in crossing):
                continue
            cost = sum(flops[j] for j in before) / total
            size = sum(4 * int(np.prod(shapes.get(c, [0]))) for c in crossing)
            points.append(CutPoint(name, tuple(shape), cost, tuple(crossing), size))
    return points


def _proven(rdp: AnalysisResult, names: Sequence[str]) -> bool:
    for name in names:
        try:
            info = rdp.tensor_info(name)
        except KeyError:
            return False
        if info.dims is None or any(d is None for d in info.dims) or not info.dtype:
            return False
    return True


def choose_points(points: Sequence[CutPoint], count: int = 1,
                  cost_range: tuple[float, float] = EARLY_RANGE) -> list[CutPoint]:
    """``count`` cut points for heads: within ``cost_range`` of the model's FLOPs, split into
    ``count`` equal bands, in each the one that hands on the fewest bytes (the earlier on a tie)."""
    low, high = cost_range
    chosen = []
    for k in range(count):
        a = low + (high - low) * k / count
        b = low + (high - low) * (k + 1) / count
        band = [p for p in points if a <= p.cost_fraction < b]
        if band:
            chosen.append(min(band, key=lambda p: (p.crossing_bytes, p.cost_fraction)))
    if not chosen:
        raise ValueError(f"no legal cut point computes between {low:.0%} and {high:.0%} of the model's FLOPs; "
                         "name the tensors with --at")
    return chosen


# ------------------------------------------------------------------------------------ fitting
@dataclass
class FittedHead:
    """One head's parameters (features standardisation folded in)."""

    point: CutPoint
    weight: np.ndarray                     # scores: (C, K); mask: (C,); presence: (C,)
    bias: np.ndarray                       # scores: (K,); mask, presence: scalar
    scale: int = 1                         # mask: output size / feature grid size
    probabilities: bool = True             # the final output is probabilities (not logits)
    notes: dict[str, Any] = field(default_factory=dict)


def _standardise(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    mean = x.mean(axis=0)
    std = x.std(axis=0)
    std[std < 1e-6] = 1.0
    return (x - mean) / std, mean, std


def ridge(x: np.ndarray, y: np.ndarray, penalty: float = RIDGE) -> tuple[np.ndarray, np.ndarray]:
    """Least squares y ~ x w + b with an L2 penalty on w (standardised features), in x's units."""
    z, mean, std = _standardise(x.astype(np.float64))
    target = y.astype(np.float64)
    centre = target.mean(axis=0)
    gram = z.T @ z / len(z) + penalty * np.eye(z.shape[1])
    w = np.linalg.solve(gram, z.T @ (target - centre) / len(z))
    weight = w / std[:, None] if w.ndim == 2 else w / std
    bias = centre - mean @ weight
    return weight, bias


def logistic(x: np.ndarray, y: np.ndarray, penalty: float = RIDGE, steps: int = 50) -> tuple[np.ndarray, float]:
    """L2-penalised logistic regression by Newton steps; one class only: a constant, its smoothed rate."""
    positives = float(y.sum())
    if positives in (0.0, float(len(y))):
        rate = (positives + 0.5) / (len(y) + 1.0)
        return np.zeros(x.shape[1]), float(np.log(rate / (1.0 - rate)))
    z, mean, std = _standardise(x.astype(np.float64))
    a = np.hstack([z, np.ones((len(z), 1))])
    w = np.zeros(a.shape[1])
    reg = penalty * np.eye(a.shape[1])
    reg[-1, -1] = 0.0
    for _ in range(steps):
        p = 1.0 / (1.0 + np.exp(-np.clip(a @ w, -30, 30)))
        grad = a.T @ (p - y) / len(y) + reg @ w
        hess = (a * (p * (1 - p))[:, None]).T @ a / len(y) + reg + 1e-9 * np.eye(a.shape[1])
        step = np.linalg.solve(hess, grad)
        w -= step
        if float(np.abs(step).max()) < 1e-8:
            break
    weight = w[:-1] / std
    return weight, float(w[-1] - mean @ weight)


def _logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, 0.02, 0.98)
    return np.log(p / (1.0 - p))


def fit_heads(task: ExitTask, points: Sequence[CutPoint], features: Sequence[Mapping[str, np.ndarray]],
              finals: Sequence[np.ndarray]) -> list[FittedHead]:
    """One head per point, fitted on the frames' ``features`` (tensor name -> value) to ``finals``."""
    probabilities = all(float(f.min()) >= 0.0 and float(f.max()) <= 1.0 for f in finals)
    heads = []
    for point in points:
        values = [f[point.tensor] for f in features]
        if task.kind == "scores":
            x = np.concatenate([v.mean(axis=(2, 3)) for v in values])
            y = np.concatenate([np.log(np.clip(f, 1e-6, 1.0)) if probabilities else f for f in finals])
            weight, bias = ridge(x, y.reshape(len(y), -1))
            heads.append(FittedHead(point, weight, bias, probabilities=probabilities))
        elif task.kind == "presence":
            x = np.concatenate([v.mean(axis=(2, 3)) for v in values])
            y = np.array([presence(f[n:n + 1], task) for f in finals for n in range(len(f))], dtype=np.float64)
            w, b = logistic(x, y)
            heads.append(FittedHead(point, w, np.float64(b), notes={"positives": int(y.sum()), "frames": len(y)}))
        else:
            xs, ys, scale = [], [], None
            for v, f in zip(values, finals):
                factor = f.shape[-1] // v.shape[-1]
                if factor < 1 or v.shape[-2] * factor != f.shape[-2] or v.shape[-1] * factor != f.shape[-1]:
                    raise ValueError(f"{point.tensor} {list(v.shape)} is not a whole fraction of the output's "
                                     f"size {list(f.shape)}: a mask head cannot read it")
                if scale not in (None, factor):
                    raise ValueError(f"{point.tensor}: its scale to the output changes between frames")
                scale = factor
                prob = f if probabilities else 1.0 / (1.0 + np.exp(-f))
                n, _, h, w = v.shape
                pooled = prob.reshape(n, h, factor, w, factor).mean(axis=(2, 4))
                pixels = v.transpose(0, 2, 3, 1).reshape(-1, v.shape[1])
                step = max(1, len(pixels) // MASK_PIXELS_PER_FRAME)
                xs.append(pixels[::step])
                ys.append(_logit(pooled.reshape(-1))[::step])
            weight, bias = ridge(np.concatenate(xs), np.concatenate(ys))
            heads.append(FittedHead(point, weight, bias, scale=int(scale or 1), probabilities=probabilities))
    return heads


# ------------------------------------------------------------------------------------ graph
def _const(inits: list[TensorProto], name: str, array: np.ndarray) -> str:
    inits.append(from_array(np.asarray(array), name))
    return name


def head_nodes(task: ExitTask, head: FittedHead, prefix: str) -> tuple[list[NodeProto], list[TensorProto],
                                                                         ExitSpec]:
    """The head's nodes and initializers (names under ``prefix``) and its exit's description."""
    t = head.point.tensor
    nodes: list[NodeProto] = []
    inits: list[TensorProto] = []

    def node(op: str, inputs: list[str], name: str, **attrs: Any) -> str:
        nodes.append(make_node(op, inputs, [f"{prefix}{name}"], name=f"{prefix}{name}", **attrs))
        return f"{prefix}{name}"

    cap_lo = _const(inits, f"{prefix}cap_lo", np.array(-LOGIT_CAP, np.float32))
    cap_hi = _const(inits, f"{prefix}cap_hi", np.array(LOGIT_CAP, np.float32))
    if task.kind == "mask":
        w = _const(inits, f"{prefix}w", head.weight.astype(np.float32).reshape(1, -1, 1, 1))
        b = _const(inits, f"{prefix}b", np.asarray(head.bias, np.float32).reshape(1))
        logits = node("Clip", [node("Conv", [t, w, b], "conv"), cap_lo, cap_hi], "logits")
        coarse = node("Sigmoid", [logits], "coarse")
        scales = _const(inits, f"{prefix}scales", np.array([1, 1, head.scale, head.scale], np.float32))
        roi = _const(inits, f"{prefix}roi", np.zeros(0, np.float32))
        answer = node("Resize", [coarse if head.probabilities else logits, roi, scales], "mask", mode="linear")
        return nodes, inits, ExitSpec((answer,), "mean_confidence", "outputs", coarse)
    pooled = node("Flatten", [node("GlobalAveragePool", [t], "pool")], "features")
    if task.kind == "scores":
        w = _const(inits, f"{prefix}w", head.weight.astype(np.float32))
        b = _const(inits, f"{prefix}b", np.asarray(head.bias, np.float32).reshape(-1))
        logits = node("Gemm", [pooled, w, b], "logits")
        capped = node("Clip", [logits, cap_lo, cap_hi], "capped")
        answer = node("Softmax", [logits], "scores", axis=1) if head.probabilities else logits
        return nodes, inits, ExitSpec((answer,), "max_softmax", "outputs", capped)
    w = _const(inits, f"{prefix}w", head.weight.astype(np.float32).reshape(-1, 1))
    b = _const(inits, f"{prefix}b", np.asarray(head.bias, np.float32).reshape(1))
    p = node("Sigmoid", [node("Clip", [node("Gemm", [pooled, w, b], "logit"), cap_lo, cap_hi], "capped")], "present")
    # the "no box" answer: zeros of the output's shape [N, box + classes, anchors]
    shape = node("Shape", [task.image_input], "image_shape")
    batch = node("Slice", [shape, _const(inits, f"{prefix}i0", np.array([0], np.int64)),
                           _const(inits, f"{prefix}i1", np.array([1], np.int64))], "batch")
    height = node("Slice", [shape, _const(inits, f"{prefix}i2", np.array([2], np.int64)),
                            _const(inits, f"{prefix}i3", np.array([3], np.int64))], "height")
    width = node("Slice", [shape, f"{prefix}i3", _const(inits, f"{prefix}i4", np.array([4], np.int64))],
                 "width")
    cells = []
    for s in task.strides:
        stride = _const(inits, f"{prefix}s{s}", np.array([s], np.int64))
        round_up = _const(inits, f"{prefix}r{s}", np.array([s - 1], np.int64))
        rows = node("Div", [node("Add", [height, round_up], f"h{s}_up"), stride], f"h{s}")
        cols = node("Div", [node("Add", [width, round_up], f"w{s}_up"), stride], f"w{s}")
        cells.append(node("Mul", [rows, cols], f"cells{s}"))
    anchors = cells[0]
    for k, more in enumerate(cells[1:]):   # Add: Sum takes no integers
        anchors = node("Add", [anchors, more], f"anchors{k}")
    channels = _const(inits, f"{prefix}channels", np.array([head.notes["channels"]], np.int64))
    dims = node("Concat", [batch, channels, anchors], "dims", axis=0)
    answer = node("ConstantOfShape", [dims], "no_box", value=make_tensor("zero", TensorProto.FLOAT, [1], [0.0]))
    return nodes, inits, ExitSpec((answer,), "max_objectness", "outputs", p)


def attach_heads(model: ModelProto, task: ExitTask, heads: Sequence[FittedHead]) -> ModelProto:
    """A copy of ``model`` with the heads' nodes added (no graph output reads them) and every exit
    declared in its ``dynnet_exits`` metadata, in the order of the heads' cost, then the answer."""
    out = ModelProto()
    out.CopyFrom(model)
    if any(prop.key == METADATA_KEY for prop in out.metadata_props):
        raise ValueError(f"the model already declares exits ({METADATA_KEY}); start from the model without them")
    final = model_exits(model)
    specs = []
    for k, head in enumerate(sorted(heads, key=lambda h: h.point.cost_fraction)):
        nodes, inits, spec = head_nodes(task, head, f"dynnet_exit{k}_")
        out.graph.node.extend(nodes)
        out.graph.initializer.extend(inits)
        specs.append(spec)
    answer = ExitSpec(tuple(o.name for o in out.graph.output), "none")
    if len(final) == 1:
        answer = final[0]
    entry = out.metadata_props.add()
    entry.key, entry.value = METADATA_KEY, exits_metadata([*specs, answer])
    onnx_proto.onnx_library().checker.check_model(out)
    return out


# ------------------------------------------------------------------------------------ evaluation
@dataclass(frozen=True)
class ExitReport:
    """One exit on held-out frames: its agreement with the model, and what it costs."""

    point: CutPoint
    agreement: float                       # share of frames its answer stands for the model's
    confidences: tuple[float, ...]
    agrees: tuple[bool, ...]
    thresholds: dict[str, tuple[float, float, float]]   # target -> (threshold, early rate, agreement)
    head_flops_fraction: float

    def to_json(self) -> dict[str, Any]:
        return {**self.point.to_json(), "agreement": round(self.agreement, 4),
                "head_flops_fraction": round(self.head_flops_fraction, 6),
                "thresholds": {k: {"threshold": t, "early_rate": round(r, 4), "agreement": round(a, 4)}
                               for k, (t, r, a) in self.thresholds.items()}}


def threshold_for(confidences: Sequence[float], agree: Sequence[bool], target: float) -> tuple[float, float, float]:
    """(the lowest threshold whose mapped answers — the exit's where its confidence reaches it,
    the model's elsewhere — agree on at least ``target`` of the frames, early rate, agreement);
    1.0 (no early answer: every confidence is below it) when none lower does."""
    conf = np.asarray(confidences, dtype=np.float64)
    ok = np.asarray(agree, dtype=bool)
    for t in sorted(set(conf.tolist())):
        taken = conf >= t
        agreement = float(np.mean(~taken | ok))
        if agreement >= target:
            return float(t), float(taken.mean()), agreement
    return 1.0, 0.0, 1.0


def evaluate(task: ExitTask, model: ModelProto, frames: Sequence[Mapping[str, np.ndarray]],
             targets: Sequence[float] = (0.99, 0.95), head_flops: Mapping[str, float] | None = None,
             ) -> list[ExitReport]:
    """Run the model with exits on ``frames``: each exit's confidence and agreement per frame."""
    exits = model_exits(model)
    names = [n for spec in exits[:-1] for n in spec.tensors]
    probe = ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.extend(make_empty_tensor_value_info(n) for n in names)
    session = _session(probe)
    wanted = [task.output, *names]
    per_exit: list[tuple[list[float], list[bool]]] = [([], []) for _ in exits[:-1]]
    for feed in frames:
        values = dict(zip(wanted, session.run(wanted, dict(feed))))
        for k, spec in enumerate(exits[:-1]):
            per_exit[k][0].append(spec.confidence(values))
            per_exit[k][1].append(agrees(task, values[spec.outputs[0]], values[task.output]))
    reports = []
    points = model_points(model)
    for k, (conf, ok) in enumerate(per_exit):
        thresholds = {f"{target:.0%}": threshold_for(conf, ok, target) for target in targets}
        point = points[k]
        reports.append(ExitReport(point, float(np.mean(ok)), tuple(conf), tuple(ok), thresholds,
                                  (head_flops or {}).get(point.tensor, 0.0)))
    return reports


POINTS_KEY = "dynnet_exit_points"
#: the task learned exits imitate (``ExitTask`` JSON): how the search judges their agreement
TASK_KEY = "dynnet_exit_task"


def model_task(model: ModelProto) -> ExitTask | None:
    """The task of a model's learned exits (``TASK_KEY`` metadata), None for any other model."""
    raw = next((p.value for p in model.metadata_props if p.key == TASK_KEY), None)
    if raw is None:
        return None
    data = json.loads(raw)
    return ExitTask(str(data["kind"]), str(data["output"]), str(data["image_input"]),
                    float(data["score_threshold"]), tuple(int(s) for s in data["strides"]), int(data["box_channels"]))


def model_points(model: ModelProto) -> list[CutPoint]:
    """The cut points a model's learned exits read (``POINTS_KEY`` metadata, written by ``learn_exits``)."""
    raw = next((p.value for p in model.metadata_props if p.key == POINTS_KEY), "[]")
    return [CutPoint(p["tensor"], tuple(p["shape"]), float(p["cost_fraction"]), tuple(p["crossing"]),
                     int(round(float(p["crossing_mb"]) * 2**20))) for p in json.loads(raw)]


def _session(model: ModelProto) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def collect(model: ModelProto, tensors: Sequence[str], output: str, frames: Sequence[Mapping[str, np.ndarray]],
            progress: Callable[[int], None] | None = None) -> tuple[list[dict[str, np.ndarray]], list[np.ndarray]]:
    """Per frame: the named intermediate tensors and the model's ``output``."""
    probe = ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.extend(make_empty_tensor_value_info(n) for n in tensors)
    session = _session(probe)
    wanted = [output, *tensors]
    features, finals = [], []
    for i, feed in enumerate(frames):
        values = session.run(wanted, dict(feed))
        finals.append(values[0])
        features.append(dict(zip(tensors, values[1:])))
        if progress:
            progress(i + 1)
    return features, finals


@dataclass
class LearnedExits:
    """A model with learned exits, and how they did on the held-out frames."""

    model: ModelProto
    task: ExitTask
    points: list[CutPoint]
    reports: list[ExitReport]
    train_frames: int
    held_out_frames: int

    def to_json(self) -> dict[str, Any]:
        return {"task": self.task.to_json(), "train_frames": self.train_frames,
                "held_out_frames": self.held_out_frames, "exits": [r.to_json() for r in self.reports]}


def learn_exits(model_like: Any, task: ExitTask, frames: Sequence[Mapping[str, np.ndarray]], rdp: AnalysisResult,
                at: Sequence[str] | None = None, count: int = 1, held_out: float = 0.3, seed: int = 0,
                progress: Callable[[str], None] | None = None) -> LearnedExits:
    """Heads at ``at`` (tensor names) or at ``count`` automatically chosen cut points, fitted on
    the frames not held out, reported on the held-out ones."""
    model = load_model(model_like)
    if len(frames) < 2:
        raise ValueError(f"{len(frames)} frame(s): learning exits needs at least 2 (some are held out)")
    order = np.random.default_rng(seed).permutation(len(frames))
    n_test = min(len(frames) - 1, max(1, int(round(held_out * len(frames)))))
    test = [frames[i] for i in order[:n_test]]
    train = [frames[i] for i in order[n_test:]]
    if progress:
        progress("finding cut points")
    points = cut_points(model, rdp, frames[0])
    if at:
        by_name = {p.tensor: p for p in points}
        missing = [name for name in at if name not in by_name]
        if missing:
            legal = ", ".join(p.tensor for p in points[:12])
            raise ValueError(f"--at {', '.join(missing)}: not a float NCHW tensor where a depth-wise cut is legal; "
                             f"legal ones include {legal}")
        chosen = [by_name[name] for name in at]
    else:
        chosen = choose_points(points, count)
    if progress:
        progress(f"running {len(train)} training frames")
    features, finals = collect(model, [p.tensor for p in chosen], task.output, train)
    if progress:
        progress("fitting heads")
    heads = fit_heads(task, chosen, features, finals)
    if task.kind == "presence":
        height, width = train[0][task.image_input].shape[-2:]
        anchors = sum(-(-height // s) * -(-width // s) for s in task.strides)
        if anchors != finals[0].shape[-1]:
            raise ValueError(f"{task.output} has {finals[0].shape[-1]} anchors at {height}x{width}, not the "
                             f"{anchors} of strides {list(task.strides)}: not a raw YOLO head the exit can stand for")
        for head in heads:
            head.notes["channels"] = int(finals[0].shape[1])
    with_exits = attach_heads(model, task, heads)
    ordered = sorted(chosen, key=lambda p: p.cost_fraction)
    for key, value in ((POINTS_KEY, [p.to_json() for p in ordered]), (TASK_KEY, task.to_json())):
        entry = with_exits.metadata_props.add()
        entry.key, entry.value = key, json.dumps(value, separators=(",", ":"))
    if progress:
        progress(f"evaluating on {len(test)} held-out frames")
    head_flops = {h.point.tensor: _head_flops(task, h) / max(1.0, _model_flops(model, frames[0])) for h in heads}
    reports = evaluate(task, with_exits, test, head_flops=head_flops)
    return LearnedExits(with_exits, task, ordered, reports, len(train), len(test))


def _model_flops(model: ModelProto, feed: Mapping[str, np.ndarray]) -> float:
    shapes = shapes_at(model, feed)
    total = 0.0
    for node in model.graph.node:
        features = None if node.op_type == "Constant" else node_features(node, shapes)
        total += features.flops if features is not None else 0.0
    return total


def _head_flops(task: ExitTask, head: FittedHead) -> float:
    n, c, h, w = head.point.shape
    if task.kind == "mask":
        return 2.0 * n * c * h * w + 4.0 * n * h * w * head.scale ** 2
    outputs = head.weight.shape[1] if head.weight.ndim == 2 else 1
    return float(n * c * h * w + 2 * n * c * outputs)
