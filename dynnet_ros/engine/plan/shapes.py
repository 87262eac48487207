"""Concrete tensor shapes for one input signature: from RDP expressions, else ONNX inference.

Why an adapter: the memory plan needs every boundary tensor's byte size *before* the run. RDP
gives them as expressions over the input symbols (evaluating is microseconds per tensor and
also checks the model's proven constraints); when RDP cannot be used, onnx's own shape
inference at the pinned input shapes is a sound but slower fallback. Unknown (``None``)
shapes are allowed: the executor lets onnxruntime allocate those tensors.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Protocol

from dynnet_ros.engine.modelio import onnx_proto
from dynnet_ros.engine.modelio.models import pin_input_dims
from dynnet_ros.engine.modelio.onnx_proto import ModelProto, NodeProto
from dynnet_ros.engine.plan.graph import strip_weights
from dynnet_ros.engine.rdp import AnalysisResult, analyze

log = logging.getLogger(__name__)

Shape = tuple[int, ...]


class ShapeSource(Protocol):
    name: str
    #: the RDP analysis behind these shapes (None: onnx shape inference only)
    analysis: AnalysisResult | None

    def shapes(self, input_shapes: Mapping[str, Shape], names: Iterable[str]) -> dict[str, Shape | None]:
        """Shapes of ``names`` for these input shapes; ValueError if they break a proven constraint."""

    def dims(self, name: str) -> list | None:
        """Symbolic dims (ints / expression strings / None) for reports, or None if unknown."""

    def category(self, node: NodeProto) -> str | None:
        """RDP operator category (ISDO/ISDOS/ISVDOS/EDO) after propagation, when known."""

    def limit_fallback(self, input_shapes: Mapping[str, Shape], sizes: Mapping[str, int | None],
                       min_bytes: int) -> None:
        """Given every tensor's bytes at ``input_shapes`` (``sizes``), keep a slower fallback (if
        the source has one) only for tensors RDP leaves unknown there and that exceed ``min_bytes``."""


class RdpShapes:
    """Shapes from an RDP analysis result (``dynnet_ros.engine.rdp.analyze``)."""

    name = "rdp"

    def __init__(self, result: AnalysisResult) -> None:
        self.result = result
        self.analysis: AnalysisResult | None = result

    def shapes(self, input_shapes: Mapping[str, Shape], names: Iterable[str]) -> dict[str, Shape | None]:
        bindings = self.result.bind({k: list(v) for k, v in input_shapes.items()})
        out: dict[str, Shape | None] = {}
        for name in names:
            shape = self.result.tensor_shape(name, bindings)
            out[name] = None if shape is None else tuple(int(d) for d in shape)
        return out

    def dims(self, name):
        try:
            return self.result.tensor_dims(name)
        except (KeyError, AttributeError):
            return None

    def category(self, node):
        try:
            return self.result.node_category(node.name)
        except (KeyError, AttributeError):
            return None

    def limit_fallback(self, input_shapes, sizes, min_bytes) -> None:
        """No fallback behind RDP alone."""


class InferredShapes:
    """Fallback: onnx.shape_inference (with data propagation) at the pinned input shapes."""

    name = "onnx-inference"

    def __init__(self, model: ModelProto) -> None:
        self._model = strip_weights(model)  # inference needs dims and small constants, not weights
        self._symbolic_dims: dict[str, list | None] | None = None
        self.analysis: AnalysisResult | None = None

    @property
    def _symbolic(self) -> dict[str, list | None]:
        """Inferred symbolic dims, computed on first use: with RDP in front they are rarely needed,
        and running onnx's inference keeps its library resident (see modelio/model_check.py)."""
        if self._symbolic_dims is None:
            self._symbolic_dims = self._infer(self._model)
        return self._symbolic_dims

    @staticmethod
    def _infer(model: ModelProto) -> dict[str, list | None]:
        try:
            inferred = onnx_proto.onnx_library().shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
        except Exception as exc:  # noqa: BLE001 - onnx's C++ inference raises several unrelated types
            log.info("onnx shape inference failed (%s); those shapes stay unknown", exc)
            return {}
        out: dict[str, list | None] = {}
        for value in list(inferred.graph.value_info) + list(inferred.graph.output) + list(inferred.graph.input):
            ttype = value.type.tensor_type
            if not value.type.HasField("tensor_type") or not ttype.HasField("shape"):
                out[value.name] = None
                continue
            dims: list = []
            for d in ttype.shape.dim:
                if d.HasField("dim_value"):
                    dims.append(int(d.dim_value))
                else:  # onnx names dims it could not infer "unk__N": those are unknown, not symbols
                    dims.append(None if not d.dim_param or d.dim_param.startswith("unk__") else d.dim_param)
            out[value.name] = dims
        return out

    def shapes(self, input_shapes: Mapping[str, Shape], names: Iterable[str]) -> dict[str, Shape | None]:
        pinned = ModelProto()
        pinned.CopyFrom(self._model)
        # Inference needs no weights' values beyond small shape constants; big ones stay (rarely used).
        pin_input_dims(pinned, input_shapes)
        inferred = self._infer(pinned)
        out: dict[str, Shape | None] = {}
        for name in names:
            dims = inferred.get(name)
            out[name] = tuple(dims) if dims is not None and all(isinstance(d, int) for d in dims) else None
        return out

    def dims(self, name):
        return self._symbolic.get(name)

    def category(self, node):
        return None

    def limit_fallback(self, input_shapes, sizes, min_bytes) -> None:
        """Inference is the only source here: nothing to limit."""


class CombinedShapes:
    """RDP first; onnx inference at the pinned shapes only for tensors RDP leaves unknown.

    Why: RDP evaluation is cheap and checks the model's constraints, but an analysis that
    misses a few tensors should cost those tensors a slower lookup, not the arena.
    """

    def __init__(self, rdp: RdpShapes, inferred: InferredShapes) -> None:
        self.rdp = rdp
        self.inferred = inferred
        self.name = "rdp+onnx-inference"
        self.analysis: AnalysisResult | None = rdp.result
        # Outputs of execution-determined nodes (NonMaxSuppression, NonZero, ...) and everything
        # computed from them: no static inference knows their shapes, so never ask it.
        self.execution_determined = _edo_downstream(rdp.result.nodes)
        # Tensors worth the fallback (set by the planner after sizing at its reference shape):
        # inference costs milliseconds per new signature, so small leftovers are better left
        # to onnxruntime's allocator than paid for on every first run. None = all.
        self.fallback_names: set[str] | None = None

    def limit_fallback(self, input_shapes, sizes, min_bytes) -> None:
        known = self.rdp.shapes(input_shapes, list(sizes))
        self.fallback_names = {n for n, size in sizes.items()
                               if known.get(n) is None and size is not None and size > min_bytes}

    def shapes(self, input_shapes: Mapping[str, Shape], names: Iterable[str]) -> dict[str, Shape | None]:
        names = list(names)
        out = self.rdp.shapes(input_shapes, names)
        missing = [n for n in names if out.get(n) is None and n not in self.execution_determined
                   and (self.fallback_names is None or n in self.fallback_names)]
        if missing:
            out.update({k: v for k, v in self.inferred.shapes(input_shapes, missing).items() if v is not None})
        return out

    def dims(self, name):
        dims = self.rdp.dims(name)
        if (dims is not None and None not in dims) or name in self.execution_determined:
            return dims
        return self.inferred.dims(name) or dims

    def category(self, node):
        return self.rdp.category(node)


def _edo_downstream(records) -> set[str]:
    """Tensors produced by an EDO node or computed (transitively) from one."""
    tainted: set[str] = set()
    for record in records:  # RDP's records are in topological order
        if record.category == "EDO" or any(i in tainted for i in record.inputs):
            tainted.update(o for o in record.outputs if o)
    return tainted


def make_shape_source(model: ModelProto, use_rdp: bool = True) -> ShapeSource:
    """RDP when the analysis succeeds on this model, else ONNX inference."""
    if use_rdp:
        try:
            return CombinedShapes(RdpShapes(analyze(model)), InferredShapes(model))
        except Exception as exc:  # noqa: BLE001 - an analysis failure must not stop the model from running
            log.warning("RDP analysis failed (%s); planning from onnx shape inference", exc)
    return InferredShapes(model)
