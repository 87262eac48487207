"""Stages: a multi-exit model cut into sub-models that each end in an exit.

Why: Map-and-Conquer runs each stage on its own compute unit and stops at the first confident
exit. A *depth-wise* cut (``depth_stages``) gives stage k every node the k-th exit needs that no
earlier stage computes; stage k then reads the model inputs and the tensors of earlier stages it
uses (its *crossing* tensors). A cut is made only where RDP proves the crossing tensors' rank and
dims, so each stage is a valid ONNX model with declared input shapes (symbolic where the model's
are) that RDP can analyse again. Run in sequence, the stages compute exactly the original nodes
on exactly the same values, so their outputs equal the original model's.

``StageSet.save(DIR)`` writes ``stage_<k>.onnx`` per stage and ``stages.json`` (the summary);
``StageSet.load(DIR)`` reads them back.
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dynnet_ros.engine.modelio import onnx_proto
from dynnet_ros.engine.modelio.loader import hoist_weight_constants
from dynnet_ros.engine.modelio.models import ModelLike, load_model, weight_bytes
from dynnet_ros.engine.modelio.onnx_proto import (
    AttributeProto,
    GraphProto,
    ModelProto,
    NodeProto,
    ValueInfoProto,
    make_graph,
    make_model,
    make_tensor_value_info,
)
from dynnet_ros.engine.rdp import AnalysisResult, analyze
from dynnet_ros.engine.rdp.expr import Expr, to_json_dim

from .exits import METADATA_KEY, ExitSpec, exits_metadata, model_exits, parse_exits

SUMMARY_FILE = "stages.json"
#: The stage models' metadata: what each stage's symbolic input dims mean in the original model.
DIMS_KEY = "dynnet_stage_dims"


@dataclass
class Stage:
    """One stage: its sub-model, what it reads and from where, what it writes, and its exit."""

    index: int
    model: ModelProto
    inputs: tuple[str, ...]              # model inputs and earlier stages' tensors, in its graph's order
    outputs: tuple[str, ...]             # its exit's outputs, then tensors later stages read
    exit: ExitSpec
    sources: dict[str, int]              # input -> producing stage (-1: a model input)

    @property
    def weight_bytes(self) -> int:
        return weight_bytes(self.model)

    def summary(self) -> dict[str, Any]:
        return {"index": self.index, "nodes": len(self.model.graph.node), "weight_bytes": self.weight_bytes,
                "inputs": {name: self.sources[name] for name in self.inputs}, "outputs": list(self.outputs),
                "exit": self.exit.to_json(),
                "input_dims": {v.name: _dims_text(v) for v in self.model.graph.input}}


@dataclass
class StageSet:
    """Stages of one model, in exit order; the last one's exit is the model's answer."""

    kind: str                            # "depth" | "width"
    stages: list[Stage]
    model_inputs: tuple[str, ...]
    final_outputs: tuple[str, ...]       # the answer's names (the last exit's outputs)
    dims: dict[str, str] = field(default_factory=dict)    # stage dim name -> expression over the model's symbols
    notes: dict[str, Any] = field(default_factory=dict)   # kind-specific: P, I, agreement, probes

    def summary(self) -> dict[str, Any]:
        return {"kind": self.kind, "model_inputs": list(self.model_inputs), "final_outputs": list(self.final_outputs),
                "dims": dict(self.dims), "stages": [s.summary() for s in self.stages], **self.notes}

    def save(self, directory: str | Path) -> Path:
        """Write ``stage_<k>.onnx`` and ``stages.json`` into ``directory`` (created)."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        for stage in self.stages:
            onnx_proto.save(stage.model, str(out / f"stage_{stage.index}.onnx"))
        (out / SUMMARY_FILE).write_text(json.dumps(self.summary(), indent=1))
        return out

    @classmethod
    def load(cls, directory: str | Path) -> StageSet:
        """Read a directory ``save`` wrote; ValueError naming what is missing or inconsistent."""
        where = Path(directory)
        try:
            summary = json.loads((where / SUMMARY_FILE).read_text())
        except OSError as exc:
            raise ValueError(f"{where}: no readable {SUMMARY_FILE} ({exc.strerror or exc})") from None
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where / SUMMARY_FILE}: not valid JSON ({exc})") from None
        stages = []
        try:
            for item in summary["stages"]:
                index = int(item["index"])
                model = load_model(where / f"stage_{index}.onnx")
                sources = {name: int(src) for name, src in item["inputs"].items()}
                stages.append(Stage(index, model, tuple(sources), tuple(item["outputs"]),
                                    ExitSpec.from_json(item["exit"], f"stage {index} exit"), sources))
            extra = {k: v for k, v in summary.items()
                     if k not in ("kind", "model_inputs", "final_outputs", "dims", "stages")}
            return cls(str(summary["kind"]), stages, tuple(summary["model_inputs"]), tuple(summary["final_outputs"]),
                       dict(summary.get("dims", {})), extra)
        except (KeyError, TypeError) as exc:
            raise ValueError(f"{where / SUMMARY_FILE}: missing or malformed field {exc}") from None


def _dims_text(value: ValueInfoProto) -> list[int | str]:
    return [d.dim_value if d.HasField("dim_value") else d.dim_param
            for d in value.type.tensor_type.shape.dim]


# ------------------------------------------------------------------------------------ graph helpers
def subgraph_reads(graph: GraphProto) -> set[str]:
    """Names a (sub)graph reads from its enclosing scope: used but not defined inside it."""
    defined = {i.name for i in graph.input} | {i.name for i in graph.initializer}
    used: set[str] = set()
    for node in graph.node:
        used.update(node_reads(node))
        defined.update(node.output)
    return {name for name in used if name and name not in defined}


def node_reads(node: NodeProto) -> list[str]:
    """A node's inputs plus the outer-scope names its subgraphs (If/Loop/Scan bodies) read."""
    names = [name for name in node.input if name]
    for attr in node.attribute:
        graphs = [attr.g] if attr.type == AttributeProto.GRAPH else \
            list(attr.graphs) if attr.type == AttributeProto.GRAPHS else []
        for graph in graphs:
            names.extend(sorted(subgraph_reads(graph)))
    return names


class DimNames:
    """Names for the symbolic dims of stage inputs: the model's own symbol where a dim is one,
    else ``D0``, ``D1``, … one per distinct expression, remembered for the summary."""

    def __init__(self, symbols: Iterable[str]) -> None:
        self.symbols = set(symbols)
        self.names: dict[str, str] = {}

    def name(self, expr: str) -> str:
        if expr in self.symbols:
            return expr
        if expr not in self.names:
            self.names[expr] = f"D{len(self.names)}"
        return self.names[expr]

    @property
    def table(self) -> dict[str, str]:
        return {name: expr for expr, name in self.names.items()}


def proven_value_info(name: str, rdp: AnalysisResult, dims: DimNames, why: str) -> ValueInfoProto:
    """A ValueInfo for ``name`` with RDP's proven type, rank and dims; ValueError when RDP cannot
    prove them (the cut is then not allowed there)."""
    try:
        info = rdp.tensor_info(name)
    except KeyError:
        raise ValueError(f"{why}: RDP has no result for tensor {name!r}") from None
    if info.dims is None or any(d is None for d in info.dims) or not info.dtype:
        raise ValueError(f"{why}: RDP cannot prove the shape of {name!r} "
                         f"({info.reason or 'unknown rank or dims'}); cut elsewhere")
    shape: list[int | str] = []
    for d in info.dims:
        if isinstance(d, int):
            shape.append(d)
        elif isinstance(d, Expr):
            shape.append(dims.name(str(to_json_dim(d))))
        else:
            raise ValueError(f"{why}: RDP cannot prove the shape of {name!r}")
    return make_tensor_value_info(name, info.dtype, shape)


def sub_model(source: ModelProto, name: str, nodes: Sequence[NodeProto],
              inputs: Sequence[ValueInfoProto], outputs: Sequence[ValueInfoProto],
              metadata: Mapping[str, str]) -> ModelProto:
    """A model of ``nodes`` with the initializers they read, checked by onnx's checker."""
    used: set[str] = set()
    for node in nodes:
        used.update(node_reads(node))
    initializers = [init for init in source.graph.initializer if init.name in used]
    graph = make_graph(list(nodes), name, list(inputs), list(outputs), initializer=initializers)
    model = make_model(graph, opset_imports=list(source.opset_import), producer_name="dynnet_ros.mapper")
    model.ir_version = source.ir_version
    for key, value in sorted(metadata.items()):
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value
    try:
        onnx_proto.onnx_library().checker.check_model(model)
    except onnx_proto.onnx_library().checker.ValidationError as exc:
        first = str(exc).strip().splitlines()[0]
        raise ValueError(f"stage model {name} fails the ONNX checker: {first}") from None
    return model


# ------------------------------------------------------------------------------------ depth-wise
def resolve_exits(model: ModelProto, exits: Sequence[Any] | None) -> list[ExitSpec]:
    """``exits`` (names or mappings, as in a partition file) checked against the model, else the model's own."""
    if exits is None:
        return model_exits(model)
    internal = {name for node in model.graph.node for name in node.output}
    return parse_exits(list(exits), [o.name for o in model.graph.output], internal)


def depth_stages(model: ModelLike, exits: Sequence[Any] | None = None,
                 rdp: AnalysisResult | None = None) -> StageSet:
    """Cut ``model`` after each exit: one stage per exit, in order (see the module docstring).

    ``exits``: the exits to cut at (output names or ``{"outputs", "criterion", "answer"}``; an
    internal tensor's name makes a cut that never answers); None: the model's ``dynnet_exits``
    metadata, else one exit per graph output. ValueError when an
    exit adds no computation, or RDP cannot prove a crossing tensor's shape. Weights a model keeps
    in ``Constant`` nodes become the stages' initializers (``hoist_weight_constants``), so they
    count in each stage's weights and load like any other weight."""
    proto = hoist_weight_constants(load_model(model))
    specs = resolve_exits(proto, exits)
    rdp = rdp or analyze(proto)
    graph = proto.graph
    producer: dict[str, int] = {}
    for index, node in enumerate(graph.node):
        for out in node.output:
            producer[out] = index
    constants = {i for i, node in enumerate(graph.node) if node.op_type == "Constant"}
    stage_of: dict[int, int] = {}
    members: list[list[int]] = []
    for k, spec in enumerate(specs):
        wanted: set[int] = set()
        stack = [producer[name] for name in spec.tensors if name in producer]
        while stack:
            index = stack.pop()
            if index in wanted or (index in stage_of and index not in constants):
                continue
            wanted.add(index)
            stack.extend(producer[name] for name in node_reads(graph.node[index]) if name in producer)
        owned = sorted(i for i in wanted if i not in constants)
        if not owned:
            raise ValueError(f"exit {k} ({', '.join(spec.outputs)}) adds no computation to the earlier "
                             "stages; drop it or reorder the exits")
        for index in owned:
            stage_of[index] = k
        members.append(sorted(wanted))
    graph_inputs = {i.name: i for i in graph.input}
    graph_outputs = {o.name: o for o in graph.output}
    initializers = {i.name for i in graph.initializer}
    dims = DimNames(rdp.symbols)
    later_reads: list[set[str]] = [set() for _ in specs]
    reads_per_stage: list[list[str]] = []
    for nodes in members:
        produced = {out for i in nodes for out in graph.node[i].output}
        reads: list[str] = []
        for i in nodes:
            for name in node_reads(graph.node[i]):
                if name not in produced and name not in initializers and name not in reads:
                    reads.append(name)
        reads_per_stage.append(reads)
        for name in reads:
            if name in producer:
                later_reads[stage_of[producer[name]]].add(name)
    stages = []
    for k, (spec, nodes) in enumerate(zip(specs, members)):
        why = f"stage {k} (exit {', '.join(spec.outputs)})"
        sources: dict[str, int] = {}
        inputs = []
        for name in reads_per_stage[k]:
            if name in graph_inputs:
                sources[name] = -1
                inputs.append(graph_inputs[name])
            else:
                sources[name] = stage_of[producer[name]]
                inputs.append(proven_value_info(name, rdp, dims, why))
        handed = sorted(later_reads[k] - set(spec.tensors), key=lambda n: producer[n])
        # the model's own outputs keep their declared types (their dims may depend on values, as
        # a detector's box count); what a later stage reads must have a proven shape
        outputs = [graph_outputs[name] if name in graph_outputs and name not in later_reads[k]
                   else proven_value_info(name, rdp, dims, why) for name in (*spec.tensors, *handed)]
        metadata = {METADATA_KEY: exits_metadata([spec])}
        sub = sub_model(proto, f"{graph.name}_stage{k}", [graph.node[i] for i in nodes], inputs, outputs, metadata)
        stages.append(Stage(k, sub, tuple(v.name for v in inputs), tuple(v.name for v in outputs), spec, sources))
    for stage in stages:
        entry = stage.model.metadata_props.add()
        entry.key, entry.value = DIMS_KEY, json.dumps(dims.table, separators=(",", ":"))
    return StageSet("depth", stages, tuple(i.name for i in graph.input if i.name not in initializers),
                    specs[-1].outputs, dims.table)


# ------------------------------------------------------------------------------------ parts
@dataclass
class Part:
    """A piece of a stage that runs once the earlier stages' tensors it reads exist.

    A stage that reuses earlier stages' features at some layer is cut before that layer, so
    its first layers run while the earlier stages still compute (the paper's concurrent model:
    a sub-layer waits only for the features it needs)."""

    model: ModelProto
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


def stage_parts(stage: Stage, kind: str = "width") -> list[Part]:
    """``stage`` cut before each layer that first reads an earlier stage's tensor; in a depth-wise
    set (``kind``), before each layer that first reads a tensor of an earlier stage it has not
    read yet: one stage's tensors arrive together, so a later cut would gain no overlap, only a
    dispatch. ``Constant`` nodes go into every part that reads them, never across a cut: a
    constant handed on as a part's input would keep onnxruntime from folding it (a BatchNorm's
    scale into its Conv), which changes the rounding, and a depth-wise set must reproduce the
    model bit for bit."""
    cross = {name: src for name, src in stage.sources.items() if src >= 0}
    graph = stage.model.graph
    constants = {node.output[0]: node for node in graph.node if node.op_type == "Constant" and len(node.output) == 1}
    body = [node for node in graph.node if node.output[:1] == [] or node.output[0] not in constants]
    part_of: list[int] = []
    admitted: set[str | int] = set()
    for node in body:
        reads = set(node_reads(node)) & set(cross)
        new = ({cross[name] for name in reads} if kind == "depth" else reads) - admitted
        admitted |= new
        part_of.append(part_of[-1] + (1 if new else 0) if part_of else 0)
    count = part_of[-1] + 1 if part_of else 1
    if count == 1:
        return [Part(stage.model, stage.inputs, stage.outputs)]
    rdp = analyze(stage.model)
    dims = DimNames(rdp.symbols)
    initializers = {i.name for i in graph.initializer}
    declared_in = {v.name: v for v in graph.input}
    declared_out = {v.name: v for v in graph.output}
    produced_in = [{out for node, p in zip(body, part_of) if p == k for out in node.output} for k in range(count)]
    reads_in = [[name for node, p in zip(body, part_of) if p == k for name in node_reads(node)]
                for k in range(count)]
    parts = []
    for k in range(count):
        ins = []
        for name in dict.fromkeys(reads_in[k]):
            if name in produced_in[k] or name in initializers or name in constants:
                continue
            ins.append(declared_in[name] if name in declared_in
                       else proven_value_info(name, rdp, dims, f"stage {stage.index} part {k}"))
        later = {name for j in range(k + 1, count) for name in reads_in[j]}
        outs = [declared_out[name] if name in declared_out else proven_value_info(name, rdp, dims, "part")
                for name in sorted(produced_in[k] & (later | set(declared_out)))]
        read = set(reads_in[k])
        nodes = [node for node in graph.node if node.output[:1] != [] and node.output[0] in constants
                 and node.output[0] in read] + [node for node, p in zip(body, part_of) if p == k]
        model = sub_model(stage.model, f"{graph.name}_part{k}", nodes, ins, outs, {})
        parts.append(Part(model, tuple(v.name for v in ins), tuple(v.name for v in outs)))
    return parts
