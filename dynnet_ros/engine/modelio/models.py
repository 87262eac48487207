"""Load an ONNX model and describe its graph inputs, with clear errors for bad models.

Why a module of its own: every engine backend, the RDP analysis and the swap store need the
same "is this a usable model, and what does it take?" answer.
"""
from __future__ import annotations

import keyword
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from dynnet_ros.engine.modelio import onnx_proto
from dynnet_ros.engine.modelio.onnx_proto import (
    ModelProto,
    TensorProto,
    TensorShapeProto,
    ValueInfoProto,
    make_value_info,
    tensor_dtype_to_np_dtype,
)

ModelLike = str | os.PathLike | ModelProto

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_RESERVED_SYMBOLS = {"min", "max"}  # names of RDP's shape-expression functions


def is_dim_symbol(name: str) -> bool:
    """Whether a ``dim_param`` is a symbol the planner ties across axes and inputs: an identifier
    (not a Python keyword, ``min`` or ``max``). Other names (paddle2onnx's
    ``p2o.DynamicDimension.0``, ``?``) stand for one unknown size per axis."""
    return bool(_IDENTIFIER.match(name)) and not keyword.iskeyword(name) and name not in _RESERVED_SYMBOLS


@dataclass(frozen=True)
class InputSpec:
    """One graph input as onnxruntime checks it.

    ``dims``: static sizes are ints, dynamic ones their name or None (a ``-1`` value, an empty
    ``dim_param`` or neither field: onnxruntime checks none of them). ``shaped`` is False when
    the input declares no shape at all. ``kind`` is "tensor", or "optional" / "sequence" / "map"
    / "sparse" for the other ONNX types (``dtype`` is then the element type where one exists,
    else ``object``). ``has_default``: an initializer of the same name gives the value when the
    input is not fed (onnxruntime's *overridable initializers*).
    """

    name: str
    dtype: np.dtype
    dims: tuple[int | str | None, ...]
    kind: str = "tensor"
    shaped: bool = True
    has_default: bool = False

    @property
    def rank(self) -> int:
        return len(self.dims)

    @property
    def any_shape(self) -> bool:
        """onnxruntime checks no shape for it: none declared, or rank 0 (it skips empty shapes)."""
        return not self.shaped or not self.dims

    def describe(self) -> str:
        shown = ["?" if d is None else str(d) for d in self.dims]
        shape = f"[{', '.join(shown)}]" if self.shaped else "[any shape]"
        element = f"{self.dtype.name}{shape}" if self.kind in ("tensor", "optional") else self.dtype.name
        return f"{self.name}: {element}" if self.kind == "tensor" else f"{self.name}: {self.kind}({element})"


def load_model(model: ModelLike, *, check: bool = True, external_data: bool = True) -> ModelProto:
    """Return a checked ModelProto or raise ValueError saying what is wrong.

    ``external_data=False`` leaves weights stored beside the file unread (analyses that need
    only the graph and the tensors' shapes).
    """
    if isinstance(model, ModelProto):
        proto = model
        where = "<in-memory model>"
    elif isinstance(model, (str, os.PathLike)):
        where = os.fspath(model)
        if not os.path.isfile(where):
            raise ValueError(f"model file not found: {where}")
        try:
            proto = onnx_proto.load(where, load_external_data=external_data)
        except Exception as exc:  # protobuf DecodeError, truncated external data, ...
            raise ValueError(f"{where} is not a readable ONNX model: {exc}") from exc
    else:
        raise ValueError(f"expected an onnx.ModelProto or a path, got {type(model).__name__}")
    if check:
        try:
            if isinstance(model, ModelProto):
                onnx_proto.onnx_library().checker.check_model(proto)
            else:
                onnx_proto.onnx_library().checker.check_model(where)  # path form handles >2 GB / external data
        except Exception as exc:  # the checker's ValidationError, or a model it cannot read
            first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ValueError(f"{where} failed the ONNX checker: {first_line}") from exc
    if not proto.graph.output:
        raise ValueError(f"{where} has no graph outputs")
    return clear_negative_dims(proto)


def clear_negative_dims(proto: ModelProto) -> ModelProto:
    """``proto``, or a copy of it where dims written as a negative ``dim_value`` (paddle2onnx and
    others write ``-1``) on the graph's inputs, outputs and value infos are unnamed dynamic dims.

    onnxruntime skips a negative expected size when it checks a feed, so ``-1`` means "any
    size"; every reader of ``dim_value`` here would otherwise take it as a size of -1. A copy,
    so that a caller's in-memory model is never changed.
    """
    def negative(model: ModelProto) -> list[TensorShapeProto.Dimension]:
        graph = model.graph
        return [dim for value in [*graph.input, *graph.output, *graph.value_info]
                if value.type.HasField("tensor_type") and value.type.tensor_type.HasField("shape")
                for dim in value.type.tensor_type.shape.dim if dim.HasField("dim_value") and dim.dim_value < 0]

    if not negative(proto):
        return proto
    copy = ModelProto()
    copy.CopyFrom(proto)
    for dim in negative(copy):
        dim.Clear()
    return copy


def _element_dtype(elem_type: int) -> np.dtype:
    if elem_type == TensorProto.STRING:
        return np.dtype(object)
    return np.dtype(tensor_dtype_to_np_dtype(elem_type))


def _spec(value: ValueInfoProto, has_default: bool) -> InputSpec:
    type_proto = value.type
    kind = type_proto.WhichOneof("value")
    if kind == "optional_type" and type_proto.optional_type.elem_type.HasField("tensor_type"):
        inner = _spec(make_value_info(value.name, type_proto.optional_type.elem_type), has_default)
        return InputSpec(value.name, inner.dtype, inner.dims, "optional", inner.shaped, has_default)
    if kind != "tensor_type":
        names = {"sequence_type": "sequence", "map_type": "map", "sparse_tensor_type": "sparse",
                 "optional_type": "optional"}
        return InputSpec(value.name, np.dtype(object), (), names.get(str(kind), str(kind)), False, has_default)
    tensor_type = type_proto.tensor_type
    dims: list[int | str | None] = []
    for dim in tensor_type.shape.dim:
        if dim.HasField("dim_value") and dim.dim_value >= 0:
            dims.append(int(dim.dim_value))
        elif dim.HasField("dim_param") and dim.dim_param:
            dims.append(dim.dim_param)
        else:  # -1, an empty dim_param or neither: onnxruntime checks nothing there
            dims.append(None)
    return InputSpec(value.name, _element_dtype(tensor_type.elem_type), tuple(dims),
                     shaped=tensor_type.HasField("shape"), has_default=has_default)


def input_specs(proto: ModelProto) -> list[InputSpec]:
    """Graph inputs that are not initializers (ONNX IR < 4 lists weights as inputs too)."""
    initializers = {init.name for init in proto.graph.initializer}
    return [_spec(value, False) for value in proto.graph.input if value.name not in initializers]


def default_specs(proto: ModelProto) -> list[InputSpec]:
    """Graph inputs with an initializer: a caller may feed them (onnxruntime's overridable
    initializers) or leave them to the initializer's value."""
    initializers = {init.name for init in proto.graph.initializer}
    return [_spec(value, True) for value in proto.graph.input if value.name in initializers]


def output_names(proto: ModelProto) -> list[str]:
    return [value.name for value in proto.graph.output]


def weight_bytes(proto: ModelProto) -> int:
    """Bytes of all initializers (what must be resident to run the model in memory)."""
    total = 0
    for init in proto.graph.initializer:
        count = int(np.prod(init.dims)) if init.dims else 1
        itemsize = np.dtype(tensor_dtype_to_np_dtype(init.data_type)).itemsize
        total += count * itemsize
    return total


def pin_input_dims(model: ModelProto, shapes: Mapping[str, Sequence[int]]) -> ModelProto:
    """Set the named graph inputs' dims to concrete sizes, in place (for shape inference at one size)."""
    for value in model.graph.input:
        if value.name in shapes:
            for dim, size in zip(value.type.tensor_type.shape.dim, shapes[value.name]):
                dim.Clear()
                dim.dim_value = int(size)
    return model
