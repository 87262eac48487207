"""What a perception core needs to know about a model before running it: its signature and metadata.

Why separate from the engine: choosing a format and checking options only needs the graph's
inputs, outputs and ``metadata_props``, read from the weightless skeleton, so a model that fits
no format is rejected before its weights are loaded.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from dynnet_ros.engine.modelio.loader import load_skeleton
from dynnet_ros.engine.modelio.onnx_proto import ModelProto, ValueInfoProto, tensor_dtype_to_np_dtype

Dim = int | str | None


def static(dim: Dim) -> int | None:
    """A dim's size when fixed, else None."""
    return dim if isinstance(dim, int) else None


@dataclass(frozen=True)
class TensorInfo:
    """One graph input or output: static dims are ints, dynamic ones their name (or None)."""

    name: str
    dtype: np.dtype
    dims: tuple[Dim, ...]

    @property
    def rank(self) -> int:
        return len(self.dims)

    def describe(self) -> str:
        # exporters name some dims by their whole shape formula: shown by the first characters
        shown = ["?" if d is None else str(d) if len(str(d)) <= 24 else f"{str(d)[:21]}..." for d in self.dims]
        return f"{self.name}[{', '.join(shown)}]"


@dataclass(frozen=True)
class ModelInfo:
    """A model's signature (inputs without initializers, outputs) and its metadata strings."""

    path: str
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    metadata: dict[str, str] = field(default_factory=dict)

    def input(self, name: str) -> TensorInfo | None:
        return next((t for t in self.inputs if t.name == name), None)

    def output(self, name: str) -> TensorInfo | None:
        return next((t for t in self.outputs if t.name == name), None)

    def describe(self) -> str:
        ins = ", ".join(t.describe() for t in self.inputs)
        outs = ", ".join(t.describe() for t in self.outputs)
        return f"inputs {ins}; outputs {outs}"


def _tensor_info(value: ValueInfoProto) -> TensorInfo:
    tensor_type = value.type.tensor_type
    dtype = np.dtype(tensor_dtype_to_np_dtype(tensor_type.elem_type)) if tensor_type.elem_type \
        else np.dtype(np.float32)
    dims: list[Dim] = []
    for dim in tensor_type.shape.dim:
        if dim.HasField("dim_value"):
            dims.append(int(dim.dim_value))
        elif dim.HasField("dim_param") and dim.dim_param:
            dims.append(dim.dim_param)
        else:
            dims.append(None)
    return TensorInfo(value.name, dtype, tuple(dims))


def model_info(proto: ModelProto, path: str = "<in-memory model>") -> ModelInfo:
    initializers = {init.name for init in proto.graph.initializer}
    inputs = tuple(_tensor_info(v) for v in proto.graph.input if v.name not in initializers)
    outputs = tuple(_tensor_info(v) for v in proto.graph.output)
    metadata = {entry.key: entry.value for entry in proto.metadata_props if not entry.key.startswith("dynnet_ros.")}
    return ModelInfo(path, inputs, outputs, metadata)


def read_model_info(path: str | os.PathLike, *, check: bool = True) -> ModelInfo:
    """ValueError for a missing, unreadable or (``check``: by onnx's checker) invalid model file,
    with the engine's messages. ``check=False`` reads the signature only and caches nothing."""
    if not isinstance(path, (str, os.PathLike)):
        raise ValueError(f"model must be a path to an .onnx file, got {type(path).__name__}")
    return model_info(load_skeleton(path, check=check), os.fspath(path))
