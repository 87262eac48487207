"""Control flow in the planned engine: an ``If`` runs only its taken branch, as its own plan.

Why not onnxruntime's ``If``: it also runs only the taken branch, but the branch's
intermediates then come from onnxruntime's allocator, outside our arena and our plans. Here
each branch is compiled into a nested PlannedExecutor (its own simplify/partition/plan, RDP over
the branch with its outer-scope inputs as symbolic inputs); all branches of a model share one
branch arena (only one branch runs at a time), and the branch writes its outputs straight into
the parent's arena slots for the ``If`` outputs.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from dynnet_ros.engine.modelio.onnx_proto import (
    GraphProto,
    ModelProto,
    NodeProto,
    ValueInfoProto,
    from_array,
    make_graph,
    make_model,
    make_tensor_value_info,
)
from dynnet_ros.engine.plan.arena import Arena
from dynnet_ros.engine.plan.graph import GraphIndex, outer_scope_inputs

log = logging.getLogger(__name__)


class NestedExecutorFactory(Protocol):
    """Builds the executor of a branch or loop body (``PlannedExecutor.from_model``).

    Why passed in: the planned executor builds these runners, so they take its constructor as an
    argument rather than import the module that imports them."""

    def __call__(self, model: ModelProto, options: Any, *, arena: Arena | None = None) -> Any: ...


def branch_model(branch: GraphProto, parent: GraphIndex, skeleton: ModelProto,
                 weights: Mapping[str, np.ndarray], ranks: Mapping[str, int],
                 formal: Sequence[ValueInfoProto] = ()) -> ModelProto:
    """A standalone model for one branch or body: outer-scope activations become inputs (symbolic
    dims) after ``formal`` (a Loop body's own inputs, as the caller typed them)."""
    outer = sorted(outer_scope_inputs(branch))
    skeleton_inits = {t.name: t for t in skeleton.graph.initializer}
    inputs, inits = list(formal), []
    for k, name in enumerate(outer):
        if name in skeleton_inits:
            inits.append(from_array(weights[name], name) if name in weights else skeleton_inits[name])
            continue
        if name not in parent.elem_types or name not in ranks:
            raise ValueError(f"outer-scope input {name!r} has no known type/rank")
        dims = [f"b{k}_{axis}" for axis in range(ranks[name])]
        inputs.append(make_tensor_value_info(name, parent.elem_types[name], dims))
    graph = make_graph(list(branch.node), branch.name or "branch", inputs, list(branch.output),
                              list(branch.initializer) + inits, value_info=list(branch.value_info))
    model = make_model(graph, opset_imports=list(skeleton.opset_import))
    model.ir_version = skeleton.ir_version
    model.functions.extend(skeleton.functions)
    model.metadata_props.extend(skeleton.metadata_props)
    return model


class IfRunner:
    """Runs one ``If`` node: evaluates the condition, then only the taken branch's plan."""

    def __init__(self, node: NodeProto, parent: GraphIndex, skeleton: ModelProto,
                 weights: Mapping[str, np.ndarray], ranks: Mapping[str, int], options: Any, arena: Arena,
                 make_executor: NestedExecutorFactory) -> None:
        self.node = node
        self.branches = {}
        for attr in node.attribute:
            if attr.name in ("then_branch", "else_branch"):
                model = branch_model(attr.g, parent, skeleton, weights, ranks)
                self.branches[attr.name == "then_branch"] = (make_executor(model, options, arena=arena),
                                                             [o.name for o in attr.g.output])
        if set(self.branches) != {True, False}:
            raise ValueError(f"If node {node.name!r} lacks a branch")

    def run(self, values: Mapping[str, np.ndarray], out: Mapping[str, np.ndarray | None]) -> dict[str, np.ndarray]:
        cond = bool(np.asarray(values[self.node.input[0]]).reshape(-1)[0])
        executor, names = self.branches[cond]
        feeds = {name: values[name] for name in executor.graph.inputs}
        targets = {b: target for b, o in zip(names, self.node.output) if (target := out.get(o)) is not None}
        produced = executor.run(feeds, out=targets)
        return {o: produced[b] for b, o in zip(names, self.node.output)}

    def close(self) -> None:
        for executor, _ in self.branches.values():
            executor.close()
