"""Width-wise stages (Map-and-Conquer's P and I): each layer's channels split between stages.

Why: stages that split a layer's *width* can run at the same time on different units, where
depth-wise stages wait for each other. For a chain of Conv/Gemm layers (with BatchNorm,
element-wise activations, pooling, residual Add) ending in a Gemm/Conv head:

* Channels are tracked as *spaces*: a Conv/Gemm output starts one; BatchNorm, activations,
  pooling, Flatten and Identity keep it; a residual Add ties its operands' spaces into one, so the
  residual and the branch are cut the same way.
* Each space is reordered by importance (the L1 norm of its producers' filters, as in pruning)
  so stage 0 holds the most important channels, then cut into contiguous slices by the fractions
  P of its first producing layer (``P.layers.<node>``, else ``P.default``).
* Stage i's sub-layer reads its own slice of the layer input plus the slices of the earlier
  stages k that I marks for that layer (``I.layers.<node>[i][k]``); the model input is whole in
  every stage. Grouped convolutions and other ops refuse the split with a ValueError naming them.
* Exits: the last stage applies the model's head to every stage's features (it reads them all);
  stage i < last applies a Gemm to the features it has: the head's own columns for them, or — with
  calibration frames — a linear probe fitted by least squares to the full model's output.

With everything in stage 0 the stage computes exactly the original layers on the original
(reordered) channels, so it returns the original output. A real split changes what the early
channels see (the paper fine-tunes; this does not), so ``notes["agreement"]`` reports how often
each exit's argmax matches the full model's over the calibration frames.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from dynnet_ros.engine.modelio.models import ModelLike, load_model
from dynnet_ros.engine.modelio.onnx_proto import (
    ModelProto,
    NodeProto,
    TensorProto,
    ValueInfoProto,
    from_array,
    get_attribute_value,
    make_node,
    make_tensor_value_info,
    to_array,
)
from dynnet_ros.engine.rdp import AnalysisResult, analyze

from .exits import METADATA_KEY, ExitSpec, exits_metadata, model_exits
from .partition import WidthSpec
from .stages import DIMS_KEY, DimNames, Stage, StageSet, node_reads, proven_value_info, sub_model

SPLIT_OPS = frozenset({"Conv", "Gemm"})
PASS_OPS = frozenset({"BatchNormalization", "Relu", "LeakyRelu", "Clip", "Sigmoid", "Tanh", "HardSigmoid",
                      "HardSwish", "Elu", "Selu", "Softplus", "Identity", "MaxPool", "AveragePool",
                      "GlobalAveragePool", "GlobalMaxPool", "Flatten"})
JOIN_OPS = frozenset({"Add"})
RIDGE = 1e-3


class _Spaces:
    """Union-find over tensors: tensors in one set share one channel axis."""

    def __init__(self) -> None:
        self.parent: dict[str, str] = {}

    def find(self, t: str) -> str:
        self.parent.setdefault(t, t)
        while self.parent[t] != t:
            self.parent[t] = self.parent[self.parent[t]]
            t = self.parent[t]
        return t

    def join(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[rb] = ra


@dataclass
class _Space:
    size: int
    order: np.ndarray              # channel indices, most important first
    bounds: tuple[int, ...]        # stage k holds order[bounds[k]:bounds[k+1]]
    first_layer: str

    def slice(self, k: int) -> np.ndarray:
        """Stage k's channels, in their original order (so a stage holding them all computes
        every sum in the original order, bit for bit)."""
        return np.sort(self.order[self.bounds[k]:self.bounds[k + 1]])


def _weights(model: ModelProto) -> dict[str, np.ndarray]:
    return {init.name: to_array(init) for init in model.graph.initializer}


def _attr(node: NodeProto, name: str, default):
    for a in node.attribute:
        if a.name == name:
            return get_attribute_value(a)
    return default


def _out_axis_weight(node: NodeProto, w: np.ndarray) -> np.ndarray:
    """A Conv/Gemm weight as [out, in, ...]."""
    if node.op_type == "Gemm" and not _attr(node, "transB", 0):
        return w.T
    return w


def _bounds(size: int, fractions: Sequence[float]) -> tuple[int, ...]:
    edges = [0]
    total = 0.0
    for p in fractions[:-1]:
        total += p
        edges.append(min(size, max(edges[-1], int(round(total * size)))))
    edges.append(size)
    if edges[1] == 0:        # stage 0 always holds at least the most important channel
        edges[1] = 1
        edges = [edges[0], 1] + [max(1, e) for e in edges[2:]]
    return tuple(edges)


def width_stages(model: ModelLike, spec: WidthSpec,
                 calibration: Iterable[Mapping[str, np.ndarray]] | None = None,
                 rdp: AnalysisResult | None = None,
                 progress: Callable[[str], None] | None = None) -> StageSet:
    """Split ``model``'s chain feeding ``spec.output`` into ``spec.stages`` width-wise stages."""
    proto = load_model(model)
    rdp = rdp or analyze(proto)
    weights = _weights(proto)
    graph = proto.graph
    target = spec.output or model_exits(proto)[-1].outputs[0]
    if target not in {o.name for o in graph.output}:
        raise ValueError(f"{target!r} is not an output of the model")
    producer = {out: node for node in graph.node for out in node.output}
    inputs = {i.name for i in graph.input if i.name not in weights}
    # the nodes the target needs, in graph order
    needed: set[str] = set()
    stack = [target]
    while stack:
        name = stack.pop()
        node = producer.get(name)
        if node is None or node.name in needed:
            continue
        needed.add(node.name)
        stack.extend(n for n in node_reads(node) if n not in weights)
    chain = [node for node in graph.node if node.name in needed]
    spaces = _Spaces()
    for node in chain:
        op = node.op_type
        data = [n for n in node.input if n and n not in weights]
        if op in SPLIT_OPS:
            if op == "Conv" and _attr(node, "group", 1) != 1:
                raise ValueError(f"width split: {node.name} is a grouped convolution (group="
                                 f"{_attr(node, 'group', 1)}); only group=1 layers can be split")
            if op == "Gemm" and _attr(node, "transA", 0):
                raise ValueError(f"width split: {node.name} is a Gemm with transA=1; not supported")
            if len(data) != 1 or node.input[1] not in weights:
                raise ValueError(f"width split: {node.name} ({op}) needs constant weights and one data input")
            spaces.find(node.output[0])
        elif op in PASS_OPS:
            if len(data) != 1:
                raise ValueError(f"width split: {node.name} ({op}) has {len(data)} data inputs")
            if op == "Flatten":
                dims = rdp.tensor_dims(data[0])
                if dims is None or (len(dims) > 2 and any(d != 1 for d in dims[2:])):
                    raise ValueError(f"width split: {node.name} flattens spatial dims; only [N, C, 1, 1] can be "
                                     "flattened (after a global pool)")
            spaces.join(data[0], node.output[0])
        elif op in JOIN_OPS:
            if len(data) != 2:
                raise ValueError(f"width split: {node.name} (Add) must add two feature maps (a residual)")
            spaces.join(data[0], data[1])
            spaces.join(data[0], node.output[0])
        else:
            raise ValueError(f"width split: {node.name} ({op}) is not a Conv/Gemm/BatchNorm/activation/pooling/"
                             "residual Add; this model's width cannot be split (use a depth-wise partition)")
    head = next((n for n in reversed(chain) if n.op_type in SPLIT_OPS), None)
    if head is None:
        raise ValueError("width split: the output is computed by no Conv/Gemm layer")
    if spaces.find(head.output[0]) != spaces.find(target):
        raise ValueError(f"width split: {target!r} is not the output of the last Conv/Gemm ({head.name})")
    head_space = spaces.find(head.output[0])
    input_spaces = {spaces.find(name) for name in inputs}
    # importance and slices per space
    importance: dict[str, np.ndarray] = {}
    first: dict[str, str] = {}
    for node in chain:
        if node.op_type in SPLIT_OPS:
            root = spaces.find(node.output[0])
            w = _out_axis_weight(node, weights[node.input[1]])
            score = np.abs(w.reshape(w.shape[0], -1)).sum(axis=1)
            importance[root] = importance.get(root, 0) + score
            first.setdefault(root, node.name)
    table: dict[str, _Space] = {}
    for root, score in importance.items():
        order = np.argsort(-score, kind="stable")
        if root == head_space:
            bounds = (0,) * spec.stages + (len(order),)    # the head: emitted whole per stage
        else:
            bounds = _bounds(len(order), spec.fractions(first[root]))
        table[root] = _Space(len(order), order, bounds, first[root])
    builder = _Builder(proto, spec, chain, spaces, table, input_spaces, head, target, weights, rdp)
    stage_set = builder.build()
    frames = list(calibration) if calibration is not None else []
    if frames:
        if progress:
            progress(f"fitting linear-probe exits on {len(frames)} calibration frames")
        _fit_probes(proto, stage_set, builder, frames)
        stage_set.notes["agreement"] = agreement(proto, stage_set, frames)
        stage_set.notes["exit_heads"] = "linear probes (least squares on the full model's output)"
    else:
        stage_set.notes["exit_heads"] = "the model's head on each stage's channels"
    stage_set.notes["partition"] = spec.to_json()
    stage_set.notes["spaces"] = {v.first_layer: {"channels": v.size, "bounds": list(v.bounds)}
                                 for k, v in table.items() if k != head_space}
    return stage_set


class _Builder:
    """Emits the per-stage models of a width split."""

    def __init__(self, proto, spec: WidthSpec, chain, spaces: _Spaces, table: dict[str, _Space],
                 input_spaces: set[str], head: NodeProto, target: str, weights: dict[str, np.ndarray],
                 rdp: AnalysisResult) -> None:
        self.proto, self.spec, self.chain, self.spaces, self.table = proto, spec, chain, spaces, table
        self.input_spaces, self.head, self.target, self.weights, self.rdp = input_spaces, head, target, weights, rdp
        self.m = spec.stages
        self.model_input_names = {v.name for v in proto.graph.input if v.name not in weights}
        self.features: dict[int, str] = {}      # stage -> the head-input tensor its exit Gemm reads
        self.exit_weight: dict[int, str] = {}   # stage -> its exit Gemm's weight initializer

    def space(self, t: str) -> _Space | None:
        root = self.spaces.find(t)
        return None if root in self.input_spaces else self.table[root]

    def has(self, t: str, k: int) -> bool:
        s = self.space(t)
        return s is None or s.bounds[k + 1] > s.bounds[k]

    @staticmethod
    def loc(t: str, k: int) -> str:
        return f"{t}__s{k}"

    def pieces(self, node: NodeProto, x: str, i: int, every: bool = False) -> list[int]:
        """Stages whose slice of ``x`` stage i's ``node`` reads (own first-come order: by stage)."""
        reads = self.spec.reads(node.name)
        return [k for k in range(i + 1) if self.has(x, k) and (k == i or every or reads[i][k])]

    def build(self) -> StageSet:
        dims = DimNames(self.rdp.symbols)
        nodes: list[list[NodeProto]] = [[] for _ in range(self.m)]
        inits: list[dict[str, np.ndarray]] = [{} for _ in range(self.m)]
        reads: list[list[tuple[str, int]]] = [[] for _ in range(self.m)]    # (tensor, source stage)
        for i in range(self.m):
            for node in self.chain:
                self._emit(node, i, nodes[i], inits[i], reads[i])
        handed: list[list[str]] = [[] for _ in range(self.m)]
        for i in range(self.m):
            for t, k in reads[i]:
                if 0 <= k != i and self.loc(t, k) not in handed[k]:
                    handed[k].append(self.loc(t, k))
        model_inputs = [v for v in self.proto.graph.input if v.name not in self.weights]
        stages = []
        for i in range(self.m):
            exit_name = self.target if i == self.m - 1 else f"{self.target}__exit{i}"
            ins: list[ValueInfoProto] = []
            sources: dict[str, int] = {}
            for t, k in reads[i]:
                if k == -1:
                    value = next(v for v in model_inputs if v.name == t)
                    name = t
                elif k != i:
                    name = self.loc(t, k)
                    value = self._piece_info(t, k, dims)
                else:
                    continue
                if name not in sources:
                    sources[name] = k
                    ins.append(value)
            outs = [proven_value_info(self.target, self.rdp, dims, "width exit")]
            outs[0].name = exit_name
            outs += [self._piece_info(name.rsplit("__s", 1)[0], i, dims) for name in handed[i]]
            initializers = [from_array(np.ascontiguousarray(v), n) for n, v in inits[i].items()]
            spec = ExitSpec((exit_name,), model_exits(self.proto)[-1].criterion if i == self.m - 1
                            else _criterion_for(self.proto, self.target))
            model = _stage_model(self.proto, f"{self.proto.graph.name}_w{i}", nodes[i], ins, outs, initializers,
                                 {METADATA_KEY: exits_metadata([spec])})
            stages.append(Stage(i, model, tuple(v.name for v in ins), tuple(v.name for v in outs), spec, sources))
        for stage in stages:
            entry = stage.model.metadata_props.add()
            entry.key, entry.value = DIMS_KEY, json.dumps(dims.table, separators=(",", ":"))
        names = tuple(v.name for v in model_inputs)
        return StageSet("width", stages, names, (self.target,), dims.table)

    def _piece_info(self, t: str, k: int, dims: DimNames) -> ValueInfoProto:
        value = proven_value_info(t, self.rdp, dims, f"width stage {k}")
        space = self.space(t)
        if space is not None:
            value.type.tensor_type.shape.dim[1].dim_value = int(space.bounds[k + 1] - space.bounds[k])
        value.name = self.loc(t, k)
        return value

    def _name(self, t: str, i: int, reads: list[tuple[str, int]]) -> str:
        """Stage i's name for its own piece of ``t`` (a model input keeps its name)."""
        if self.space(t) is None:
            if t in self.model_input_names and (t, -1) not in reads:
                reads.append((t, -1))
            return t
        return self.loc(t, i)

    def _gather(self, node, x: str, i: int, out: list, reads: list, every: bool = False) -> tuple[str, np.ndarray]:
        """The tensor stage i's layer reads (its pieces of ``x`` concatenated) and those channels."""
        space = self.space(x)
        if space is None:
            return self._name(x, i, reads), np.arange(self._channels(x))
        ks = self.pieces(node, x, i, every)
        if not ks:
            raise ValueError(f"width split: stage {i} has channels at {node.name} but no features to compute "
                             f"them from (its share of {space.first_layer} is empty and I reuses none)")
        names = []
        for k in ks:
            names.append(self.loc(x, k))
            if k != i and (x, k) not in reads:
                reads.append((x, k))
        channels = np.concatenate([space.slice(k) for k in ks])
        if len(names) == 1:
            return names[0], channels
        joined = f"{x}__cat{i}_{node.name}"
        out.append(make_node("Concat", names, [joined], name=joined, axis=1))
        return joined, channels

    def _channels(self, t: str) -> int:
        dims = self.rdp.tensor_dims(t)
        return int(dims[1]) if dims is not None and isinstance(dims[1], int) else 0

    def _emit(self, node: NodeProto, i: int, out: list, inits: dict, reads: list) -> None:
        op = node.op_type
        last = i == self.m - 1
        data = [n for n in node.input if n and n not in self.weights]
        exit_name = self.target if last else f"{self.target}__exit{i}"

        def post(t: str) -> str:       # names after the head: the exit's output, else stage-local
            return exit_name if t == self.target else self.loc(t, i)

        if node is self.head:
            x, cols = self._gather(node, data[0], i, out, reads, every=last)
            self.features[i] = x
            w = _out_axis_weight(node, self.weights[node.input[1]])
            name = f"{node.name}__w{i}"
            inits[name] = w[:, cols].T if _transposed(node) else w[:, cols]
            self.exit_weight[i] = name
            ins = [x, name] + ([self._const(node.input[2], None, inits, i)] if len(node.input) > 2 else [])
            out.append(make_node(op, ins, [post(node.output[0])], name=f"{node.name}__s{i}", **_attrs(node)))
            return
        if op in PASS_OPS and self.chain.index(node) > self.chain.index(self.head):
            out.append(make_node(op, [post(data[0])], [post(node.output[0])], name=f"{node.name}__s{i}",
                                        **_attrs(node)))
            return
        space = self.space(node.output[0]) if op not in SPLIT_OPS else self.table[self.spaces.find(node.output[0])]
        if space is not None and space.bounds[i + 1] == space.bounds[i]:
            return     # stage i holds no channels of this layer
        own = space.slice(i) if space is not None else None
        if op in SPLIT_OPS:
            x, cols = self._gather(node, data[0], i, out, reads)
            w = _out_axis_weight(node, self.weights[node.input[1]])
            sliced = w[own][:, cols]
            name = f"{node.input[1]}__s{i}"
            inits[name] = sliced.T if _transposed(node) else sliced
            ins = [x, name]
            if len(node.input) > 2 and node.input[2]:
                ins.append(self._const(node.input[2], own, inits, i))
            out.append(make_node(op, ins, [self.loc(node.output[0], i)], name=f"{node.name}__s{i}",
                                        **_attrs(node)))
            return
        if op in JOIN_OPS:
            out.append(make_node(op, [self._name(d, i, reads) for d in data],
                                        [self._name(node.output[0], i, [])], name=f"{node.name}__s{i}"))
            return
        ins = []
        for n in node.input:
            if not n:
                ins.append("")
            elif n in self.weights:
                per_channel = op == "BatchNormalization"
                ins.append(self._const(n, own if per_channel else None, inits, i))
            else:
                ins.append(self._name(n, i, reads))
        out.append(make_node(op, ins, [self._name(node.output[0], i, [])], name=f"{node.name}__s{i}",
                                    **_attrs(node)))

    def _const(self, name: str, channels: np.ndarray | None, inits: dict, i: int) -> str:
        value = self.weights[name]
        if channels is not None:
            value = value[channels]
            name = f"{name}__s{i}"
        inits[name] = value
        return name


def _transposed(node: NodeProto) -> bool:
    """A Gemm whose weight is stored [in, out] (transB=0)."""
    return node.op_type == "Gemm" and not _attr(node, "transB", 0)


def _attrs(node: NodeProto) -> dict:
    return {a.name: get_attribute_value(a) for a in node.attribute}


def _criterion_for(proto: ModelProto, target: str) -> str:
    for spec in model_exits(proto):
        if target in spec.outputs:
            return spec.criterion
    return "none"


def _stage_model(source, name, nodes, inputs, outputs, initializers, metadata) -> ModelProto:
    carrier = ModelProto()
    carrier.CopyFrom(source)
    del carrier.graph.initializer[:]
    carrier.graph.initializer.extend(initializers)
    return sub_model(carrier, name, nodes, inputs, outputs, metadata)


# ------------------------------------------------------------------------------------ probes, agreement
def _session(model: ModelProto) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def run_chain(stage_set: StageSet, sessions: Sequence[ort.InferenceSession],
              feed: Mapping[str, np.ndarray], extra: Sequence[Sequence[str]] = ()) -> dict[str, np.ndarray]:
    """All stages in order on one feed (every exit and crossing tensor, plus ``extra`` names)."""
    values = dict(feed)
    for stage, session in zip(stage_set.stages, sessions):
        wanted = list(stage.outputs) + [n for n in (extra[stage.index] if extra else ()) if n not in stage.outputs]
        outs = session.run(wanted, {name: values[name] for name in stage.inputs})
        values.update(zip(wanted, outs))
    return values


def _with_outputs(model: ModelProto, names: Sequence[str]) -> ModelProto:
    copy = ModelProto()
    copy.CopyFrom(model)
    have = {o.name for o in copy.graph.output}
    for name in names:
        if name not in have:
            copy.graph.output.append(make_tensor_value_info(name, TensorProto.FLOAT, None))
    return copy


def _fit_probes(proto: ModelProto, stage_set: StageSet, builder: _Builder,
                frames: Sequence[Mapping[str, np.ndarray]]) -> None:
    """Replace each early exit's Gemm weights by a least-squares fit to the full model's output."""
    reference = _session(proto)
    target = stage_set.final_outputs[0]
    extra = [[builder.features[s.index]] for s in stage_set.stages]
    sessions = [_session(_with_outputs(s.model, extra[s.index])) for s in stage_set.stages]
    xs: dict[int, list[np.ndarray]] = {s.index: [] for s in stage_set.stages[:-1]}
    ys = []
    for feed in frames:
        values = run_chain(stage_set, sessions, feed, extra)
        ys.append(reference.run([target], dict(feed))[0].reshape(-1))
        for index in xs:
            xs[index].append(values[builder.features[index]].reshape(-1))
    y = np.stack(ys).astype(np.float64)
    for index, rows in xs.items():
        x = np.stack(rows).astype(np.float64)
        mean = x.mean(axis=0)
        xc = x - mean
        gram = xc.T @ xc
        ridge = RIDGE * (np.trace(gram) / max(1, gram.shape[0]) + 1e-12)
        w = np.linalg.solve(gram + ridge * np.eye(gram.shape[0]), xc.T @ (y - y.mean(axis=0)))   # [c, K]
        b = y.mean(axis=0) - mean @ w
        stage = stage_set.stages[index]
        layer = next(n for n in stage.model.graph.node if len(n.input) > 1 and n.input[1] == builder.exit_weight[index])
        _set_initializer(stage.model, builder.exit_weight[index], (w if _transposed(layer) else w.T).astype(np.float32))
        bias_name = _exit_bias(stage.model, builder.exit_weight[index])
        _set_initializer(stage.model, bias_name, b.astype(np.float32))


def _exit_bias(model: ModelProto, weight_name: str) -> str:
    """The bias input of the exit Gemm reading ``weight_name`` (added when it had none)."""
    for node in model.graph.node:
        if len(node.input) > 1 and node.input[1] == weight_name:
            if len(node.input) > 2 and node.input[2]:
                return node.input[2]
            while len(node.input) < 3:
                node.input.append("")
            node.input[2] = f"{weight_name}__bias"
            return node.input[2]
    raise ValueError(f"no exit layer reads {weight_name}")


def _set_initializer(model: ModelProto, name: str, value: np.ndarray) -> None:
    for i, init in enumerate(model.graph.initializer):
        if init.name == name:
            model.graph.initializer[i].CopyFrom(from_array(value, name))
            return
    model.graph.initializer.append(from_array(value, name))


def agreement(proto: ModelProto, stage_set: StageSet, frames: Sequence[Mapping[str, np.ndarray]]) -> dict:
    """Per exit: the share of frames whose argmax equals the full model's (and the max |diff|)."""
    reference = _session(proto)
    target = stage_set.final_outputs[0]
    sessions = [_session(s.model) for s in stage_set.stages]
    same = np.zeros(len(stage_set.stages))
    worst = 0.0
    for feed in frames:
        ref = reference.run([target], dict(feed))[0]
        values = run_chain(stage_set, sessions, feed)
        for stage in stage_set.stages:
            got = values[stage.exit.outputs[0]]
            same[stage.index] += int(np.argmax(got) == np.argmax(ref))
        worst = max(worst, float(np.abs(values[target] - ref).max()))
    n = max(1, len(frames))
    return {"frames": len(frames), "argmax_agreement": [round(float(v) / n, 4) for v in same],
            "final_max_abs_diff": worst}
