"""RDP-enabled graph simplification (SoD² §4.2) before partitioning.

Why: with symbolic input dims onnxruntime cannot prove most shape facts, so it keeps
shape-computing chains, no-op reshapes and unfused Conv+Add pairs. RDP proves them, and every
node removed here is one fewer kernel launch and one fewer materialised tensor.

Passes, each only where RDP (or plain constant data) proves it safe:
1. ``Identity`` removal;
2. BatchNormalization folded into the preceding Conv's weights (inference mode);
3. tensors whose *values* RDP proves (shape arithmetic: Shape→Gather→Concat…) become
   initializers; Reshape targets with symbolic entries become constants using 0 (copy this
   axis) and -1 (the one remaining axis);
4. no-op Expand / Reshape / Cast / Slice / Squeeze-free Flatten removal (output dims proven
   equal to input dims);
5. Conv + Add + (Relu) → onnxruntime's ``FusedConv`` with the sum input, when RDP proves the
   Add operand has exactly the Conv output's shape (no broadcast — the paper's Fig. 4 case);
6. dead-node elimination.

Tensor names of surviving tensors never change, so the analysis of the original model still
describes the simplified one.
"""
from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from dynnet_ros.engine.modelio.loader import external_data_dir, read_external
from dynnet_ros.engine.modelio.onnx_proto import (
    GraphProto,
    ModelProto,
    NodeProto,
    TensorProto,
    from_array,
    get_attribute_value,
    make_node,
    make_opsetid,
    np_dtype_to_tensor_dtype,
    tensor_dtype_to_np_dtype,
    to_array,
)
from dynnet_ros.engine.plan.graph import node_inputs, subgraphs, weight_placeholder
from dynnet_ros.engine.rdp import analyze

log = logging.getLogger(__name__)

ACTIVATIONS = {"Relu": "Relu", "Sigmoid": "Sigmoid", "Tanh": "Tanh", "LeakyRelu": "LeakyRelu"}


def is_onnx(node: NodeProto, *op_types: str) -> bool:
    """A default-domain op of one of these types: contrib ops share names (com.microsoft.nchwc Conv
    works on blocked tensors) and must never match a rewrite written for the ONNX op."""
    return node.domain in ("", "ai.onnx") and node.op_type in op_types


@dataclass
class SimplifyReport:
    nodes_before: int
    nodes_after: int = 0
    removed: Counter = field(default_factory=Counter)   # pass name -> nodes removed
    folded_values: list[str] = field(default_factory=list)
    fused: Counter = field(default_factory=Counter)
    ops_before: Counter = field(default_factory=Counter)
    ops_after: Counter = field(default_factory=Counter)

    def to_json(self) -> dict:
        return {"nodes_before": self.nodes_before, "nodes_after": self.nodes_after,
                "removed_by_pass": dict(self.removed), "fused": dict(self.fused),
                "folded_values": self.folded_values,
                "shape_ops_before": _shape_ops(self.ops_before), "shape_ops_after": _shape_ops(self.ops_after)}


SHAPE_OPS = ("Shape", "Gather", "Concat", "Unsqueeze", "Squeeze", "Cast", "Slice", "Range", "ConstantOfShape",
             "Reshape", "Expand")


def _shape_ops(ops: Counter) -> dict:
    return {k: ops[k] for k in SHAPE_OPS if ops.get(k)}


class _Rewriter:
    def __init__(self, model: ModelProto, rdp, weights: dict[str, np.ndarray] | None) -> None:
        self.model = ModelProto()
        self.model.CopyFrom(model)
        # a skeleton's weights live outside the proto; else new weights are embedded in the model
        self.weights_external = weights is not None
        self.weights = weights if weights is not None else {}
        self.graph = self.model.graph
        self.rdp = rdp
        self.inits = {t.name: t for t in self.graph.initializer}
        self.outputs = {o.name for o in self.graph.output}
        self.graph_inputs = {i.name for i in self.graph.input}
        self.report = SimplifyReport(len(self.graph.node), ops_before=Counter(n.op_type for n in self.graph.node))

    # -- helpers
    def info(self, name: str):
        if self.rdp is None:
            return None
        return self.rdp.tensors.get(name)

    def dims(self, name: str):
        if name in self.inits:
            return tuple(int(d) for d in self.inits[name].dims)
        t = self.info(name)
        return None if t is None or t.dims is None or any(d is None for d in t.dims) else tuple(t.dims)

    def const(self, name: str) -> np.ndarray | None:
        if name in self.weights:
            return self.weights[name]
        tensor = self.inits.get(name)
        if tensor is None:
            return None
        if tensor.data_location != TensorProto.EXTERNAL:
            return to_array(tensor)
        # weights that stay in the model file (weightless load): read them only to fold
        return read_external(tensor, external_data_dir(self.model)) if self.weights_external else None

    def consumers(self) -> dict[str, list[NodeProto]]:
        out: dict[str, list] = {}
        for node in self.graph.node:
            for name in _all_inputs(node):
                out.setdefault(name, []).append(node)
        return out

    def add_init(self, name: str, array: np.ndarray, big: bool = False) -> None:
        if big and self.weights_external:  # stays out of the proto: a placeholder plus the array in ``weights``
            self.weights[name] = array
            tensor = weight_placeholder(name, np_dtype_to_tensor_dtype(array.dtype), list(array.shape),
                                        array.nbytes)
        else:
            tensor = from_array(array, name)
        if name in self.inits:
            self.graph.initializer.remove(self.inits[name])
        self.graph.initializer.append(tensor)
        self.inits[name] = tensor

    def bypass(self, node: NodeProto, keep: str, gone: str, why: str) -> bool:
        """Remove ``node`` whose output ``gone`` equals its input ``keep``."""
        if gone in self.outputs:
            if keep in self.outputs or keep in self.graph_inputs or keep in self.inits:
                return False
            producer = next((n for n in self.graph.node if keep in n.output), None)
            if producer is None:
                return False
            _rename(self.graph, keep, gone, producer)
        else:
            _rename_uses(self.graph, gone, keep)
        self.graph.node.remove(node)
        self.report.removed[why] += 1
        return True

    # -- passes
    def remove_identities(self) -> None:
        for node in list(self.graph.node):
            if is_onnx(node, "Identity") and node.input[0] not in self.graph_inputs:
                self.bypass(node, node.input[0], node.output[0], "identity")

    def fold_batchnorm(self) -> None:
        consumers = self.consumers()
        for bn in list(self.graph.node):
            if not is_onnx(bn, "BatchNormalization") or len(bn.output) != 1:
                continue
            conv = next((n for n in self.graph.node if is_onnx(n, "Conv") and bn.input[0] in n.output), None)
            if conv is None or len(consumers.get(conv.output[0], [])) != 1 or conv.output[0] in self.outputs:
                continue
            params = [p for p in (self.const(n) for n in bn.input[1:5]) if p is not None]
            weight = self.const(conv.input[1])
            bias = self.const(conv.input[2]) if len(conv.input) > 2 and conv.input[2] else None
            if weight is None or len(params) != len(bn.input[1:5]) or (len(conv.input) > 2 and conv.input[2]
                                                                      and bias is None):
                continue
            scale, beta, mean, var = (p.astype(np.float64) for p in params)
            eps = next((a.f for a in bn.attribute if a.name == "epsilon"), 1e-5)
            factor = scale / np.sqrt(var + eps)
            # in the weight's own dtype: a float64 product would hold 4x the weight transiently
            # (depth: +35 MB peak at load for its largest convs)
            new_w = weight * factor.astype(weight.dtype).reshape(-1, *([1] * (weight.ndim - 1)))
            del weight
            old_b = np.zeros(new_w.shape[0]) if bias is None else bias.astype(np.float64)
            new_b = ((old_b - mean) * factor + beta).astype(new_w.dtype)
            w_name, b_name = conv.output[0] + "_bnfold_w", conv.output[0] + "_bnfold_b"
            self.add_init(w_name, new_w, big=True)
            self.add_init(b_name, new_b, big=new_b.nbytes >= 1024)
            x = conv.input[0]
            del conv.input[:]
            conv.input.extend([x, w_name, b_name])
            conv.output[0] = bn.output[0]
            self.graph.node.remove(bn)
            self.report.removed["batchnorm_folded"] += 1

    def fold_known_values(self) -> None:
        """Replace tensors with RDP-proven integer values by initializers (shape arithmetic)."""
        if self.rdp is None:
            return
        for node in list(self.graph.node):
            if node.op_type in ("Constant",) or subgraphs(node):
                continue
            outs = [o for o in node.output if o]
            values = []
            for o in outs:
                t = self.info(o)
                if t is None or t.value is None or t.dims is None or not all(isinstance(d, int) for d in t.dims):
                    break
                if not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in t.value):
                    break
                if t.dtype not in (TensorProto.INT64, TensorProto.INT32):
                    break
                dtype = tensor_dtype_to_np_dtype(t.dtype)
                values.append(np.array(t.value, dtype=dtype).reshape(t.dims))
            else:
                if not outs or any(o in self.outputs for o in outs):
                    continue
                for o, v in zip(outs, values):
                    self.add_init(o, v)
                    self.report.folded_values.append(o)
                self.graph.node.remove(node)
                self.report.removed["rdp_value_folded"] += 1

    def reshape_targets(self) -> None:
        """Reshape targets whose entries RDP knows (some symbolic) → constants with 0 / -1."""
        if self.rdp is None:
            return
        for node in self.graph.node:
            if not is_onnx(node, "Reshape") or node.input[1] in self.inits:
                continue
            allowzero = next((a.i for a in node.attribute if a.name == "allowzero"), 0)
            target = self.info(node.input[1])
            in_dims, out_dims = self.dims(node.input[0]), self.dims(node.output[0])
            if allowzero or target is None or target.value is None or in_dims is None or out_dims is None:
                continue
            new = []
            for axis, d in enumerate(out_dims):
                if isinstance(d, int):
                    new.append(d)
                elif axis < len(in_dims) and in_dims[axis] == d:
                    new.append(0)
                else:
                    new.append(-1)
            if new.count(-1) > 1 or 0 in [d for d in out_dims if isinstance(d, int)]:
                continue  # a literal 0 would mean "copy"; -1 can stand for one axis only
            name = node.input[1] + "_rdp_const"
            self.add_init(name, np.array(new, dtype=np.int64))
            node.input[1] = name
            self.report.fused["reshape_target_constant"] += 1

    def remove_noops(self) -> None:
        for node in list(self.graph.node):
            op = node.op_type
            if not node.input or not node.output or not is_onnx(node, "Expand", "Reshape", "Cast", "Slice", "Flatten"):
                continue
            src, dst = node.input[0], node.output[0]
            a, b = self.dims(src), self.dims(dst)
            if a is None or b is None or a != b:
                continue
            if op == "Cast":
                to = next(x.i for x in node.attribute if x.name == "to")
                t = self.info(src)
                if t is None or t.dtype != to:
                    continue
            if op == "Slice":
                steps = self.const(node.input[4]) if len(node.input) > 4 and node.input[4] else None
                if len(node.input) > 4 and node.input[4] and (steps is None or not np.all(steps == 1)):
                    continue
            if self.bypass(node, src, dst, f"noop_{op.lower()}"):
                continue

    def fuse_conv_add(self) -> None:
        """Conv + Add(same shape) [+ activation] → com.microsoft FusedConv with its sum input Z."""
        if self.rdp is None:
            return
        consumers = self.consumers()
        used_domain = False
        for add in list(self.graph.node):
            if not is_onnx(add, "Add"):
                continue
            for k in (0, 1):
                conv_out, other = add.input[k], add.input[1 - k]
                conv = next((n for n in self.graph.node if is_onnx(n, "Conv") and conv_out in n.output), None)
                if conv is None or len(consumers.get(conv_out, [])) != 1 or conv_out in self.outputs:
                    continue
                a, b = self.dims(conv_out), self.dims(other)
                if a is None or b is None or a != b:
                    continue  # broadcast or unproven: the fused kernel needs identical shapes
                if self.info(other) is not None and self.info(conv_out) is not None \
                        and self.info(other).dtype != self.info(conv_out).dtype:
                    continue
                out = add.output[0]
                act = None
                nexts = consumers.get(out, [])
                if len(nexts) == 1 and is_onnx(nexts[0], "Relu") and out not in self.outputs:
                    act = nexts[0]
                x, w = conv.input[0], conv.input[1]
                bias = conv.input[2] if len(conv.input) > 2 and conv.input[2] else ""
                attrs = {a.name: get_attribute_value(a) for a in conv.attribute}
                if act is not None:
                    attrs["activation"] = "Relu"
                fused = make_node("FusedConv", [x, w, bias, other],
                                         [act.output[0] if act is not None else out],
                                         name=(conv.name or conv_out) + "_fused", domain="com.microsoft", **attrs)
                position = list(self.graph.node).index(add)
                self.graph.node.insert(position, fused)
                self.graph.node.remove(conv)
                self.graph.node.remove(add)
                removed = 1
                if act is not None:
                    self.graph.node.remove(act)
                    removed += 1
                self.report.fused["conv_add_relu" if act is not None else "conv_add"] += 1
                self.report.removed["fused_into_conv"] += removed
                used_domain = True
                consumers = self.consumers()
                break
        if used_domain and not any(o.domain == "com.microsoft" for o in self.model.opset_import):
            self.model.opset_import.append(make_opsetid("com.microsoft", 1))

    def fuse_conv_activation(self) -> None:
        """Conv → Relu/Sigmoid/Tanh (sole consumer) → FusedConv with that activation."""
        consumers = self.consumers()
        fused_any = False
        for act in list(self.graph.node):
            if not is_onnx(act, "Relu", "Sigmoid", "Tanh"):
                continue
            conv = next((n for n in self.graph.node if is_onnx(n, "Conv") and act.input[0] in n.output), None)
            if conv is None or len(consumers.get(act.input[0], [])) != 1 or act.input[0] in self.outputs:
                continue
            attrs = {a.name: get_attribute_value(a) for a in conv.attribute}
            attrs["activation"] = act.op_type
            fused = make_node("FusedConv", list(conv.input), [act.output[0]],
                                     name=(conv.name or conv.output[0]) + "_fused", domain="com.microsoft", **attrs)
            position = list(self.graph.node).index(conv)
            self.graph.node.insert(position, fused)
            self.graph.node.remove(conv)
            self.graph.node.remove(act)
            self.report.fused[f"conv_{act.op_type.lower()}"] += 1
            self.report.removed["fused_into_conv"] += 1
            fused_any = True
        if fused_any and not any(o.domain == "com.microsoft" for o in self.model.opset_import):
            self.model.opset_import.append(make_opsetid("com.microsoft", 1))

    def eliminate_dead(self) -> None:
        needed = set(self.outputs)
        keep = []
        for node in reversed(list(self.graph.node)):
            if any(o in needed for o in node.output if o):
                keep.append(node)
                needed.update(_all_inputs(node))
            else:
                self.report.removed["dead"] += 1
        keep.reverse()
        del self.graph.node[:]
        self.graph.node.extend(keep)
        live_inits = [t for t in self.graph.initializer if t.name in needed]
        del self.graph.initializer[:]
        self.graph.initializer.extend(live_inits)
        self.inits = {t.name: t for t in live_inits}
        for name in [n for n in self.weights if n not in needed]:
            del self.weights[name]


def _all_inputs(node: NodeProto) -> list[str]:
    return node_inputs(node)


def _rename_uses(graph: GraphProto, old: str, new: str) -> None:
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name == old:
                node.input[i] = new
        for body in subgraphs(node):
            _rename_uses(body, old, new)


def _rename(graph: GraphProto, old: str, new: str, producer: NodeProto) -> None:
    for i, name in enumerate(producer.output):
        if name == old:
            producer.output[i] = new
    _rename_uses(graph, old, new)


def simplify(model: ModelProto, *, use_rdp: bool = True, rdp=None,
             weights: dict[str, np.ndarray] | None = None, fold_weights: bool = True
             ) -> tuple[ModelProto, SimplifyReport]:
    """Return a simplified copy of ``model`` and what changed. Outputs stay equal.

    ``weights``: values of placeholder initializers when ``model`` is a skeleton (see
    graph.split_weights); updated in place (folded weights added, dead ones dropped).
    ``fold_weights=False`` leaves BatchNormalization unfolded: the folded weights would be new
    tensors in memory, outside a streamed weights window that holds the model's own.
    """
    if rdp is None and use_rdp:
        try:
            rdp = analyze(model)
        except Exception as exc:  # noqa: BLE001 - simplification without RDP still folds BN and Identity
            log.warning("RDP analysis failed (%s); simplifying without it", exc)
            rdp = None
    r = _Rewriter(model, rdp, weights)
    r.remove_identities()
    if fold_weights:
        r.fold_batchnorm()
    r.fold_known_values()
    r.reshape_targets()
    r.remove_noops()
    r.fuse_conv_add()
    r.fuse_conv_activation()
    r.eliminate_dead()
    r.report.nodes_after = len(r.graph.node)
    r.report.ops_after = Counter(n.op_type for n in r.graph.node)
    return r.model, r.report
