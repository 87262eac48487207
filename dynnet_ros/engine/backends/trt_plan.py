"""Everything about one TensorRT engine decided before any TensorRT call: profiles, precision,
placement (GPU or DLA core), workspace and the cache key — with the reason for each.

``tensorrt.py`` gathers a ``DeviceInfo`` from the real device and executes the plan; tests feed a
``DeviceInfo`` by hand (a Jetson Orin, a desktop GPU, ...) and check the decisions.

A plan is one or more *engine parts*, each one TensorRT engine with its own cache key: a GPU
plan is one engine holding every profile; a DLA plan is one engine per static shape, because
NVIDIA's DLA restrictions describe static-shape engines and do not cover several profiles in one
DLA engine.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from dynnet_ros.engine.backends.trt_cache import EngineKey, model_sha256
from dynnet_ros.engine.backends.trt_config import (
    PrecisionDecision,
    TrtOptions,
    WorkspaceDecision,
    activation_bytes,
    choose_precision,
    choose_workspace,
    fast_precisions,
    has_qdq,
)
from dynnet_ros.engine.backends.trt_dla import Placement, decide_placement
from dynnet_ros.engine.backends.trt_profiles import (
    ProfilePlan,
    ProfileSet,
    Signature,
    default_symbol_values,
    grid_samples,
    parse_shape_spec,
    plan_profiles,
    plan_static_profiles,
    weighted_samples,
)
from dynnet_ros.engine.modelio.models import input_specs, weight_bytes
from dynnet_ros.engine.modelio.onnx_proto import ModelProto


@dataclass(frozen=True)
class DeviceInfo:
    """What the build depends on, read from TensorRT/pycuda on the target."""

    name: str                         # e.g. "Orin" / "NVIDIA GeForce RTX 3060"
    compute_capability: tuple[int, int]
    tensorrt_version: str
    dla_cores: int = 0                # Runtime.num_DLA_cores
    sm_count: int = 0                 # multiprocessors (pycuda MULTIPROCESSOR_COUNT)
    free_bytes: int | None = None

    @property
    def fast_fp16(self) -> bool:
        return fast_precisions(self.compute_capability)[0]

    @property
    def fast_int8(self) -> bool:
        return fast_precisions(self.compute_capability)[1]

    @property
    def strongly_typed(self) -> bool:
        """TensorRT 11+ builds only strongly typed networks (no FP16/INT8 builder flags)."""
        major = self.tensorrt_version.split(".")[0]
        return major.isdigit() and int(major) >= 11


@dataclass(frozen=True)
class EnginePart:
    """One TensorRT engine of a plan: the profiles it holds, in index order, and its cache key."""

    profiles: ProfileSet
    key: EngineKey


@dataclass(frozen=True)
class EnginePlan:
    profile_plan: ProfilePlan
    precision: PrecisionDecision
    placement: Placement
    workspace: WorkspaceDecision
    activation_bytes: int
    parts: tuple[EnginePart, ...]

    @property
    def profiles(self) -> ProfileSet:
        """Every profile over all parts; profile ``i`` lives in the part that holds it."""
        return self.profile_plan.profiles

    def explain(self) -> str:
        p = self.profile_plan
        return (f"profiles ({len(p.profiles)}, {p.order}, waste {p.waste:.0%} vs {p.baseline_waste:.0%} for one "
                f"profile, covers {p.covered:.0%}): {p.profiles.describe()} | precision: {self.precision.reason} | "
                f"placement: {self.placement.reason} | workspace: {self.workspace.reason} | "
                f"{len(self.parts)} engine(s)")


def initial_samples(model: ModelProto, options: TrtOptions) -> dict[Signature, float]:
    """The shape distribution to plan for: ``options.shapes`` over the model's defaults."""
    specs = input_specs(model)
    given = parse_shape_spec(options.shapes) if options.shapes else None
    return weighted_samples(grid_samples(specs, default_symbol_values(specs, given)))


def plan_engine(model: ModelProto, samples: Mapping[Signature, float], options: TrtOptions,
                device: DeviceInfo, *, sha256: str | None = None) -> EnginePlan:
    """Decide every build setting; ValueError when a request cannot be met (e.g. int8 without
    Q/DQ, a budget below the model's minimum)."""
    precision = choose_precision(options.precision, fast_fp16=device.fast_fp16, fast_int8=device.fast_int8,
                                 quantized=has_qdq(model), strongly_typed=device.strongly_typed)
    weights = dict(samples)
    dynamic = plan_profiles(weights, options.max_profiles)
    profile_plan, placement = dynamic, None
    if options.dla_core is not None:
        if len(weights) <= options.max_profiles:  # every shape gets its own static profile
            static = plan_static_profiles(weights, options.max_profiles)
            placement = decide_placement(model, static.profiles, requested_core=options.dla_core,
                                         dla_cores=device.dla_cores, precision=precision.precision,
                                         allow_gpu_fallback=options.allow_gpu_fallback,
                                         tensorrt_version=device.tensorrt_version)
            if placement.device == "DLA":
                profile_plan = static
        else:
            placement = decide_placement(model, dynamic.profiles, requested_core=options.dla_core,
                                         dla_cores=device.dla_cores, precision=precision.precision,
                                         allow_gpu_fallback=options.allow_gpu_fallback,
                                         tensorrt_version=device.tensorrt_version)
            if placement.device == "GPU" and "static" in placement.reason:
                placement = Placement("GPU", None, False, placement.reason + f" — the shape distribution has "
                                      f"{len(weights)} shapes, more than max_profiles={options.max_profiles} static "
                                      "profiles; pin the sizes with DYNNET_TRT_SHAPES (e.g. H=480,W=640)")
    if placement is None:
        placement = decide_placement(model, dynamic.profiles, requested_core=None, dla_cores=device.dla_cores,
                                     precision=precision.precision)
    largest = max(profile_plan.profiles.profiles, key=lambda p: p.max_work())
    acts, _ = activation_bytes(model, {name: r.max for name, r in largest.inputs})
    workspace = choose_workspace(options.memory_budget_mb, weight_bytes=weight_bytes(model), activation_bytes=acts,
                                 precision=precision.precision, free_device_bytes=device.free_bytes,
                                 explicit_mb=options.workspace_mb)
    flags = tuple(sorted(set(precision.flags) | ({"GPU_FALLBACK"} if placement.gpu_fallback else set())))
    digest = sha256 or model_sha256(model)
    every = profile_plan.profiles
    groups = ([ProfileSet((p,)) for p in every.profiles] if placement.device == "DLA" else [every])
    parts = tuple(EnginePart(group, EngineKey(
        model_sha256=digest, tensorrt_version=device.tensorrt_version, device_name=device.name,
        compute_capability=(int(device.compute_capability[0]), int(device.compute_capability[1])),
        sm_count=int(device.sm_count), precision=precision.precision, flags=flags, profiles=group.to_json(),
        dla_core=placement.dla_core, gpu_fallback=placement.gpu_fallback, workspace_bytes=workspace.bytes))
        for group in groups)
    return EnginePlan(profile_plan, precision, placement, workspace, acts, parts)
