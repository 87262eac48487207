"""Element types as onnxruntime infers them: the last word on a tensor's type.

Why: the planner cuts a graph into segment sessions, and every tensor on a cut needs an element
type for its arena slot and the sessions' declared inputs. RDP types what it analyses, onnx's
shape inference what its schemas know; onnxruntime knows every op it can run (contrib and
NCHWc ops included), so asking it closes the gap and a cut is never refused for lack of a type.
The probe is a graph without weights (initializers become typed inputs), loaded with all
optimisations off: no weight is read, nothing is rewritten.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

import onnxruntime as ort

from dynnet_ros.engine.modelio.onnx_proto import (
    ModelProto,
    TensorProto,
    ValueInfoProto,
    make_graph,
    make_model,
    make_tensor_value_info,
)

log = logging.getLogger(__name__)

#: onnxruntime's type names ("tensor(float)") -> ONNX element types
_ELEM_TYPES: dict[str, int] = {f"tensor({name.lower()})": value
                               for name, value in TensorProto.DataType.items() if value}


def value_types(values: Mapping[str, ort.OrtValue]) -> dict[str, int]:
    """The element type of each OrtValue (weights a caller hands the planner by reference)."""
    return {name: _ELEM_TYPES[value.data_type()] for name, value in values.items()
            if value.data_type() in _ELEM_TYPES}


def ort_element_types(model: ModelProto, names: Iterable[str]) -> dict[str, int]:
    """The element type onnxruntime infers for each of ``names`` (main-graph tensors), for those
    it can type; {} when it cannot load the graph at all."""
    wanted = [name for name in dict.fromkeys(names) if name]
    if not wanted:
        return {}
    graph = model.graph
    declared = {value.name for value in graph.input}
    weights = [make_tensor_value_info(t.name, t.data_type, list(t.dims))
               for t in graph.initializer if t.name not in declared]
    probe_graph = make_graph(list(graph.node), graph.name or "types", [*graph.input, *weights],
                                    [ValueInfoProto(name=name) for name in wanted],
                                    value_info=list(graph.value_info))
    probe = make_model(probe_graph, opset_imports=list(model.opset_import))
    probe.ir_version = max(model.ir_version, 4)  # IR >= 4: inputs need not be initializers
    probe.functions.extend(model.functions)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    try:
        session = ort.InferenceSession(probe.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own types: no types from here
        log.info("onnxruntime cannot type %d tensor(s) of %s: %s", len(wanted), graph.name or "the model",
                 str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)
        return {}
    return {out.name: _ELEM_TYPES[out.type] for out in session.get_outputs() if out.type in _ELEM_TYPES}
