"""TensorRT build settings decided in plain Python: options, precision, workspace size.

Why separate from the runtime: every choice here must be explainable and unit-testable on a
machine without a GPU; ``tensorrt.py`` only turns the decisions into builder calls.
"""
from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dynnet_ros.bytesize import MB
from dynnet_ros.engine.modelio import onnx_proto
from dynnet_ros.engine.modelio.onnx_proto import ModelProto, tensor_dtype_to_np_dtype
from dynnet_ros.engine.plan.memory_plan import lower_bound
from dynnet_ros.settings import load_settings, settings

log = logging.getLogger(__name__)

PRECISIONS = ("fp32", "tf32", "fp16", "int8", "auto")
#: resident weight bytes per float32 weight byte, by precision. TensorRT keeps some weights
#: (biases, reformatted copies) wider than the compute precision, so these lean high.
WEIGHT_FACTOR = {"fp32": 1.0, "tf32": 1.0, "fp16": 0.6, "int8": 0.35}
ACTIVATION_FACTOR = {"fp32": 1.0, "tf32": 1.0, "fp16": 0.5, "int8": 0.5}
MIN_WORKSPACE = 16 * MB      # NVIDIA's suggested minimum build-time workspace
DEFAULT_WORKSPACE = 1 << 30   # no budget: 1 GiB, or a quarter of free device memory if less
MAX_WORKSPACE = 4 << 30
#: compute capabilities with fast native FP16 / INT8 (NVIDIA's TensorRT "Hardware and Precision"
#: support matrix: FP16 on 5.3, 6.0, 6.2 and 7.0+, not 6.1; INT8 on 6.1 and 7.0+, not 6.0/6.2)
FAST_FP16_BELOW_7 = {(5, 3), (6, 0), (6, 2)}
FAST_INT8_BELOW_7 = {(6, 1)}


def default_cache_dir() -> Path:
    return settings().tensorrt.cache_dir


@dataclass(frozen=True)
class TrtOptions:
    """What a user may choose; everything else is decided (see ``docs/tensorrt.md``)."""

    precision: str = "fp32"            # fp32 (TF32 off: matches onnxruntime) | tf32 | fp16 | int8 | auto
    dla_core: int | None = None        # Jetson DLA0/DLA1; None = GPU only
    allow_gpu_fallback: bool = True    # DLA: unsupported layers run on the GPU
    max_profiles: int = 4              # bound on optimisation profiles per engine
    shapes: str | None = None          # "H=224:1280:32,W=224:1280:32"; None = model defaults
    memory_budget_mb: float | None = None
    workspace_mb: float | None = None  # explicit override of the budget-derived workspace
    cache_dir: Path = field(default_factory=default_cache_dir)
    device: int = 0
    rebuild_on_miss: bool = True       # a shape outside every profile -> background rebuild

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ValueError(f"TensorRT precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.dla_core is not None and (not isinstance(self.dla_core, int) or self.dla_core < 0):
            raise ValueError(f"DLA core must be a non-negative integer or None, got {self.dla_core!r}")
        if not isinstance(self.max_profiles, int) or not 1 <= self.max_profiles <= 64:
            raise ValueError(f"max_profiles must be an integer in 1..64, got {self.max_profiles!r}")
        for label, value in (("memory budget", self.memory_budget_mb), ("workspace", self.workspace_mb)):
            if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"TensorRT {label} must be a positive number of MB, got {value!r}")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> TrtOptions:
        """Options from ``DYNNET_TRT_*`` variables (the Engine/node API passes only a backend
        name, so deployment settings travel in the environment, e.g. from a launch file).
        ``env``: a mapping to parse instead of this process's settings."""
        trt = (settings() if env is None else load_settings(env)).tensorrt
        return cls(precision=trt.precision, dla_core=trt.dla_core, allow_gpu_fallback=trt.gpu_fallback,
                   max_profiles=trt.max_profiles, shapes=trt.shapes, memory_budget_mb=trt.budget_mb,
                   workspace_mb=trt.workspace_mb, cache_dir=trt.cache_dir, device=trt.device,
                   rebuild_on_miss=trt.rebuild_on_miss)


# ------------------------------------------------------------------------------- precision
def fast_precisions(compute_capability: tuple[int, int]) -> tuple[bool, bool]:
    """(fast FP16, fast INT8) from the compute capability. The builder's ``platform_has_fast_fp16``
    / ``platform_has_fast_int8`` answered this until TensorRT 10.5 deprecated them and 11.0
    removed them; the support matrix they mirrored is a function of the compute capability."""
    cc = (int(compute_capability[0]), int(compute_capability[1]))
    modern = cc >= (7, 0)
    return modern or cc in FAST_FP16_BELOW_7, modern or cc in FAST_INT8_BELOW_7


@dataclass(frozen=True)
class PrecisionDecision:
    precision: str            # fp32 | tf32 | fp16 | int8
    flags: tuple[str, ...]    # BuilderFlag names to set; TF32 is cleared unless listed
    reason: str


def has_qdq(model: ModelProto) -> bool:
    return any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in model.graph.node)


def choose_precision(requested: str, *, fast_fp16: bool, fast_int8: bool, quantized: bool,
                     strongly_typed: bool = False) -> PrecisionDecision:
    """Map the requested precision onto builder flags, refusing what cannot work.

    ``strongly_typed``: TensorRT 11 builds every network strongly typed and has no FP16/INT8
    builder flags (TF32 stays); the ONNX model's own types decide, so fp16/int8 requests are
    refused and ``auto`` means fp32."""
    if requested not in PRECISIONS:
        raise ValueError(f"TensorRT precision must be one of {', '.join(PRECISIONS)}, got {requested!r}")
    if strongly_typed and requested in ("fp16", "int8"):
        raise ValueError(f"this TensorRT builds strongly typed networks (no {requested.upper()} builder flag); "
                         "give an fp16/Q-DQ ONNX model and DYNNET_TRT_PRECISION=fp32, tf32 or auto")
    if strongly_typed and requested == "auto":
        return PrecisionDecision("fp32", (), "auto on a strongly typed TensorRT: the model's own types "
                                 "(no FP16 builder flag exists), TF32 off")
    if requested == "auto":
        if fast_fp16:
            return PrecisionDecision("fp16", ("FP16",), "auto: the GPU has fast FP16 (outputs differ from "
                                     "onnxruntime by FP16 rounding, ~1e-2 relative)")
        return PrecisionDecision("fp32", (), "auto: no fast FP16 on this GPU, so FP32 (TF32 off)")
    if requested == "fp32":
        return PrecisionDecision("fp32", (), "fp32 with TF32 off, so outputs match onnxruntime (rtol 1e-3)")
    if requested == "tf32":
        return PrecisionDecision("tf32", ("TF32",), "fp32 storage with TF32 tensor-core math (Ampere+)")
    if requested == "fp16":
        note = "" if fast_fp16 else " (this GPU has no fast FP16: expect little speed-up)"
        return PrecisionDecision("fp16", ("FP16",), "fp16 requested" + note)
    # int8: there is no calibration data in this project, so only explicitly quantized models
    if not quantized:
        raise ValueError("TensorRT int8 needs a Q/DQ-quantized model (QuantizeLinear/DequantizeLinear nodes); "
                         "this model has none and no calibrator is configured — use fp16")
    flags = ("INT8", "FP16") if fast_fp16 else ("INT8",)
    note = "" if fast_int8 else " (this GPU has no fast INT8)"
    return PrecisionDecision("int8", flags, "int8 from the model's Q/DQ scales, FP16 for the rest" + note)


# ------------------------------------------------------------------------------- memory
def activation_bytes(model: ModelProto, shapes: Mapping[str, tuple[int, ...]]) -> tuple[int, int]:
    """(most intermediate bytes live at once in graph order, tensors of unknown size) at
    ``shapes`` — an estimate of an execution context's activation memory (TensorRT fuses and
    reuses, so it usually needs less)."""
    work = ModelProto()
    work.CopyFrom(model)
    for value in work.graph.input:
        if value.name in shapes:
            dims = value.type.tensor_type.shape.dim
            for dim, size in zip(dims, shapes[value.name]):
                dim.ClearField("dim_param")
                dim.dim_value = int(size)
    try:
        inferred = onnx_proto.onnx_library().shape_inference.infer_shapes(work, data_prop=True)
    except Exception as exc:  # noqa: BLE001 - onnx's C++ inference raises several unrelated types
        log.info("onnx shape inference failed (%s); the workspace estimate is coarser", exc)
        inferred = work
    sizes: dict[str, int | None] = {}
    for value in list(inferred.graph.value_info) + list(inferred.graph.output) + list(inferred.graph.input):
        t = value.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
        if not t.HasField("shape") or any(d is None for d in dims) or not t.elem_type:
            sizes.setdefault(value.name, None)
            continue
        item = np.dtype(tensor_dtype_to_np_dtype(t.elem_type)).itemsize
        sizes[value.name] = math.prod(dims) * item
    weights = {i.name for i in model.graph.initializer}
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for name in shapes:
        first[name] = 0
    for index, node in enumerate(model.graph.node):
        for name in node.input:
            if name and name not in weights:
                last[name] = index
        for name in node.output:
            if name:
                first.setdefault(name, index)
    outputs = {o.name for o in model.graph.output}
    end = len(model.graph.node)
    buffers, unknown = [], 0
    for name, start in first.items():
        nbytes = sizes.get(name)
        if nbytes is None:
            unknown += 1
            continue
        stop = end if name in outputs else last.get(name, start) + 1
        buffers.append((start, max(stop, start + 1), nbytes))
    return lower_bound(buffers), unknown


@dataclass(frozen=True)
class WorkspaceDecision:
    bytes: int
    reason: str


def choose_workspace(budget_mb: float | None, *, weight_bytes: int, activation_bytes: int, precision: str,
                     free_device_bytes: int | None = None, explicit_mb: float | None = None) -> WorkspaceDecision:
    """Builder workspace (``MemoryPoolType.WORKSPACE``) from the model's memory budget.

    The budget bounds everything the engine holds for the model: resident weights, activation
    memory for the largest profile, and the tactic workspace. The workspace gets what is left,
    capped at ``MAX_WORKSPACE``; less than ``MIN_WORKSPACE`` left -> ValueError naming the numbers.
    """
    factor_w, factor_a = WEIGHT_FACTOR[precision], ACTIVATION_FACTOR[precision]
    weights, acts = int(weight_bytes * factor_w), int(activation_bytes * factor_a)
    if explicit_mb is not None:
        size = int(explicit_mb * MB)
        if size < MIN_WORKSPACE:
            raise ValueError(f"TensorRT workspace {explicit_mb} MB is below the {MIN_WORKSPACE // MB} MB minimum")
        return WorkspaceDecision(size, f"workspace {size / MB:.0f} MB set explicitly")
    if budget_mb is None:
        raw = DEFAULT_WORKSPACE if free_device_bytes is None else min(DEFAULT_WORKSPACE, free_device_bytes // 4)
        size = quantise_workspace(raw)
        where = ("default" if free_device_bytes is None
                 else f"min(1 GiB, free device memory / 4 = {free_device_bytes // 4 / MB:.0f} MB)")
        return WorkspaceDecision(size, f"no memory budget: workspace {size / MB:.0f} MB ({where}, rounded down "
                                       "to a power of two)")
    budget = int(budget_mb * MB)
    left = budget - weights - acts
    if left < MIN_WORKSPACE:
        need = (weights + acts + MIN_WORKSPACE) / MB
        raise ValueError(f"memory budget {budget_mb:g} MB is below the {need:.1f} MB TensorRT needs for this model at "
                         f"{precision}: weights ~{weights / MB:.1f} MB + activations ~{acts / MB:.1f} MB + "
                         f"workspace >= {MIN_WORKSPACE // MB} MB")
    size = quantise_workspace(min(left, MAX_WORKSPACE))
    return WorkspaceDecision(size, f"budget {budget_mb:g} MB - weights ~{weights / MB:.1f} MB - activations "
                                   f"~{acts / MB:.1f} MB ({precision}) = {left / MB:.0f} MB -> workspace "
                                   f"{size / MB:.0f} MB (power of two" + (", capped)" if left > MAX_WORKSPACE
                                                                          else ")"))


def quantise_workspace(size: int) -> int:
    """Largest power of two <= ``size`` (at least ``MIN_WORKSPACE``). The workspace is part of the
    engine cache key; a value derived from free device memory changes by a few KiB between
    starts, and each distinct value would cost a full rebuild (minutes on a Jetson)."""
    return max(MIN_WORKSPACE, 1 << (max(int(size), 1).bit_length() - 1))
