"""Running one stage on one compute unit: a pinned onnxruntime session or a TensorRT engine.

Why: a CPU group is only a unit if the stage's threads stay on its cores, so its onnxruntime
session gets one intra-op thread per core with each pool thread pinned
(``session.intra_op_thread_affinities``: onnxruntime pins the pool's threads, not the calling
one) and the unit's worker thread pins itself (``os.sched_setaffinity``). A GPU or DLA stage is
built by the existing TensorRT backend: the GPU with the configured precision; a DLA core with
FP16, GPU fallback and a static shape (the DLA runs no dynamic shapes), one engine per input size.
``plan_unit`` makes that decision without TensorRT, so it is tested everywhere.
"""
from __future__ import annotations

import os
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import onnxruntime as ort

from dynnet_ros.engine.backends.tensorrt import TensorRTExecutor
from dynnet_ros.engine.backends.trt_config import TrtOptions
from dynnet_ros.engine.backends.trt_env import tensorrt_unavailable_reason
from dynnet_ros.engine.modelio.onnx_proto import ModelProto
from dynnet_ros.engine.runtime.base import Executor

from .hardware import ComputeUnit

_DLA_INDEX = re.compile(r"(\d+)\Z")


@dataclass(frozen=True)
class UnitPlan:
    """How a stage runs on a unit: the backend, its threads and pinning or TensorRT options."""

    unit: str
    backend: str                            # "ort" | "tensorrt"
    threads: int = 1
    cores: tuple[int, ...] = ()
    affinities: str | None = None           # session.intra_op_thread_affinities (pool threads only)
    trt: TrtOptions | None = None
    reason: str = ""
    static_shapes: Mapping[str, int] = field(default_factory=dict)   # dim name -> size (DLA)


def affinity_string(cores: tuple[int, ...]) -> str | None:
    """onnxruntime's affinity string for the pool threads of a session pinned to ``cores``: one
    entry per thread except the caller's (which runs the first share of work itself), logical
    processors counted from 1 (its documented format: ``1,2;3`` — thread 1 on processors 1 and 2)."""
    return ";".join(str(core + 1) for core in cores[1:]) or None


def dla_core_of(unit: ComputeUnit, dla_units: list[str]) -> int:
    """The DLA core a ``dla`` unit drives: the number its name ends in (dla0, dla1), else its
    position among the hardware's DLA units."""
    match = _DLA_INDEX.search(unit.name)
    return int(match.group(1)) if match else dla_units.index(unit.name)


def plan_unit(unit: ComputeUnit, *, dla_units: list[str], trt_reason: str | None,
              precision: str = "fp16", shapes: Mapping[str, int] | None = None) -> UnitPlan:
    """The decision for one stage on ``unit``; ValueError when the unit cannot run here.

    ``trt_reason``: why TensorRT is unusable here (None: usable); ``shapes``: the stage's named
    input dims at the current input size (a DLA engine is built for exactly these)."""
    if unit.kind == "cpu":
        cores = unit.cores or tuple(sorted(os.sched_getaffinity(0)))
        allowed = os.sched_getaffinity(0)
        missing = [c for c in cores if c not in allowed]
        if missing:
            raise ValueError(f"unit {unit.name}: cores {missing} are not available to this process "
                             f"(its cores: {sorted(allowed)})")
        return UnitPlan(unit.name, "ort", threads=len(cores), cores=tuple(cores), affinities=affinity_string(cores),
                        reason=f"onnxruntime, {len(cores)} thread(s) pinned to cores {list(cores)}")
    if trt_reason is not None:
        raise ValueError(f"unit {unit.name} ({unit.kind}) needs TensorRT: {trt_reason}")
    if unit.kind == "gpu":
        return UnitPlan(unit.name, "tensorrt", trt=TrtOptions(precision=precision, dla_core=None),
                        reason=f"TensorRT on the GPU ({precision})")
    core = dla_core_of(unit, dla_units)
    static = dict(shapes or {})
    spec = ",".join(f"{k}={v}" for k, v in sorted(static.items())) or None
    # the DLA runs FP16/INT8 only, static shapes only; unsupported layers fall back to the GPU
    options = TrtOptions(precision="int8" if precision == "int8" else "fp16", dla_core=core,
                         allow_gpu_fallback=True, shapes=spec, max_profiles=1)
    return UnitPlan(unit.name, "tensorrt", trt=options, static_shapes=static,
                    reason=f"TensorRT on DLA{core} ({options.precision}, GPU fallback, "
                           f"static shape {spec or 'as declared'})")


def pin_current_thread(cores: tuple[int, ...]) -> None:
    """Keep the calling thread on ``cores`` (Linux: a thread id is a valid pid here)."""
    if cores:
        os.sched_setaffinity(threading.get_native_id(), set(cores))


class OrtStage:
    """A stage's onnxruntime session on a CPU group; ``run`` can be cancelled mid-graph."""

    def __init__(self, model: ModelProto, plan: UnitPlan) -> None:
        options = ort.SessionOptions()
        options.intra_op_num_threads = plan.threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        # no spinning: an idle stage must not burn the cores another stage is mapped to
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        if plan.affinities:
            options.add_session_config_entry("session.intra_op_thread_affinities", plan.affinities)
        try:
            self._session = ort.InferenceSession(model.SerializeToString(), options,
                                                 providers=["CPUExecutionProvider"])
        except Exception as exc:  # ORT raises its own Fail/InvalidGraph types
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ValueError(f"onnxruntime cannot load stage model {model.graph.name}: {first}") from exc
        self._outputs = [o.name for o in self._session.get_outputs()]

    def run(self, feeds: Mapping[str, np.ndarray], run_options: ort.RunOptions | None = None) -> dict[str, np.ndarray]:
        return dict(zip(self._outputs, self._session.run(self._outputs, dict(feeds), run_options)))

    def close(self) -> None:
        self._session = None


class TensorRTStage:
    """A stage through the TensorRT backend: one executor per static input size on a DLA, one
    (with its own profiles) on the GPU. Cancelling drops the result; an engine is not interrupted."""

    def __init__(self, model: ModelProto, plan: UnitPlan) -> None:
        self._factory = TensorRTExecutor
        self._model = model
        self._plan = plan
        self._executors: dict[tuple, Executor] = {}

    def run(self, feeds: Mapping[str, np.ndarray], run_options: ort.RunOptions | None = None) -> dict[str, np.ndarray]:
        key = tuple(sorted((k, v.shape) for k, v in feeds.items())) if self._plan.static_shapes else ()
        executor = self._executors.get(key)
        if executor is None:
            options = self._plan.trt
            assert options is not None, "a TensorRT stage plan carries its options"
            if self._plan.static_shapes:
                shapes = {}
                for value in self._model.graph.input:
                    for dim, size in zip(value.type.tensor_type.shape.dim, feeds[value.name].shape):
                        if dim.HasField("dim_param") and dim.dim_param:
                            shapes[dim.dim_param] = int(size)
                spec = ",".join(f"{k}={v}" for k, v in sorted(shapes.items())) or None
                options = TrtOptions(precision=options.precision, dla_core=options.dla_core,
                                     allow_gpu_fallback=True, shapes=spec, max_profiles=1)
            executor = self._executors[key] = self._factory(self._model, options=options)
        return executor.run(feeds)

    def close(self) -> None:
        for executor in self._executors.values():
            executor.close()
        self._executors.clear()


def open_stage(model: ModelProto, plan: UnitPlan) -> OrtStage | TensorRTStage:
    """The runner ``plan`` asks for."""
    return OrtStage(model, plan) if plan.backend == "ort" else TensorRTStage(model, plan)


def trt_reason() -> str | None:
    """Why TensorRT is unusable here (None: usable), probed once per process."""
    return tensorrt_unavailable_reason()
