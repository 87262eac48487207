"""Load an ONNX model and describe its graph inputs, with clear errors for bad models.

Why a module of its own: every engine backend, the RDP analysis and the swap store need the
same "is this a usable model, and what does it take?" answer.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping, Sequence, Union

import numpy as np
import onnx
from onnx import helper

ModelLike = Union[str, os.PathLike, onnx.ModelProto]


@dataclass(frozen=True)
class InputSpec:
    """One graph input: static dims are ints, dynamic ones are their name (or None)."""

    name: str
    dtype: np.dtype
    dims: tuple[int | str | None, ...]

    @property
    def rank(self) -> int:
        return len(self.dims)

    def describe(self) -> str:
        shown = ["?" if d is None else str(d) for d in self.dims]
        return f"{self.name}: {self.dtype.name}[{', '.join(shown)}]"


def load_model(model: ModelLike, *, check: bool = True, external_data: bool = True) -> onnx.ModelProto:
    """Return a checked ModelProto or raise ValueError saying what is wrong.

    ``external_data=False`` leaves weights stored beside the file unread (analyses that need
    only the graph and the tensors' shapes).
    """
    if isinstance(model, onnx.ModelProto):
        proto = model
        where = "<in-memory model>"
    elif isinstance(model, (str, os.PathLike)):
        where = os.fspath(model)
        if not os.path.isfile(where):
            raise ValueError(f"model file not found: {where}")
        try:
            proto = onnx.load(where, load_external_data=external_data)
        except Exception as exc:  # protobuf DecodeError, truncated external data, ...
            raise ValueError(f"{where} is not a readable ONNX model: {exc}") from exc
    else:
        raise ValueError(f"expected an onnx.ModelProto or a path, got {type(model).__name__}")
    if check:
        try:
            if isinstance(model, onnx.ModelProto):
                onnx.checker.check_model(proto)
            else:
                onnx.checker.check_model(where)  # path form handles >2 GB / external data
        except (onnx.checker.ValidationError, Exception) as exc:
            first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ValueError(f"{where} failed the ONNX checker: {first_line}") from exc
    if not proto.graph.output:
        raise ValueError(f"{where} has no graph outputs")
    return proto


def input_specs(proto: onnx.ModelProto) -> list[InputSpec]:
    """Graph inputs that are not initializers (ONNX IR < 4 lists weights as inputs too)."""
    initializers = {init.name for init in proto.graph.initializer}
    specs = []
    for value in proto.graph.input:
        if value.name in initializers:
            continue
        tensor_type = value.type.tensor_type
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor_type.elem_type))
        dims: list[int | str | None] = []
        for dim in tensor_type.shape.dim:
            if dim.HasField("dim_value"):
                dims.append(int(dim.dim_value))
            elif dim.HasField("dim_param") and dim.dim_param:
                dims.append(dim.dim_param)
            else:
                dims.append(None)
        specs.append(InputSpec(value.name, dtype, tuple(dims)))
    return specs


def output_names(proto: onnx.ModelProto) -> list[str]:
    return [value.name for value in proto.graph.output]


def weight_bytes(proto: onnx.ModelProto) -> int:
    """Bytes of all initializers (what must be resident to run the model in memory)."""
    total = 0
    for init in proto.graph.initializer:
        count = int(np.prod(init.dims)) if init.dims else 1
        itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(init.data_type)).itemsize
        total += count * itemsize
    return total


def pin_input_dims(model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]]) -> onnx.ModelProto:
    """Set the named graph inputs' dims to concrete sizes, in place (for shape inference at one size)."""
    for value in model.graph.input:
        if value.name in shapes:
            for dim, size in zip(value.type.tensor_type.shape.dim, shapes[value.name]):
                dim.Clear()
                dim.dim_value = int(size)
    return model
