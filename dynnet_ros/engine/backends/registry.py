"""Backend names -> executor factories, with availability checks."""
from __future__ import annotations

import onnx

from dynnet_ros.engine.backends.base import Executor


def _tensorrt_missing() -> str | None:
    """None when tensorrt + pycuda import and a CUDA device exists (trt_env.probe), else why not."""
    from dynnet_ros.engine.backends.trt_env import tensorrt_unavailable_reason

    return tensorrt_unavailable_reason()


def available_backends() -> dict[str, str | None]:
    """Backend name -> None when usable, else the reason it is not."""
    # "cpu": planned engine (engine/plan) over onnxruntime kernels; "ort": one plain session.
    return {"cpu": None, "ort": None, "tensorrt": _tensorrt_missing()}


def load_for_backend(backend: str, model) -> onnx.ModelProto:
    """The checked ModelProto the backend wants: for the planned "cpu" backend and a model file, a
    weightless graph whose weights are external-data references into that file (onnxruntime
    reads them once, straight into its sessions); otherwise the full model."""
    from dynnet_ros.engine.model_io import load_model

    if backend == "cpu" and not isinstance(model, onnx.ModelProto):
        from dynnet_ros.engine.plan.loader import load_skeleton

        return load_skeleton(model)
    return load_model(model)


def create_executor(backend: str, model: onnx.ModelProto, *, threads: int | None = None) -> Executor:
    reasons = available_backends()
    if backend not in reasons:
        raise ValueError(f"unknown backend '{backend}'; choose one of {sorted(reasons)}")
    if reasons[backend] is not None:
        raise ValueError(f"backend '{backend}' is unavailable: {reasons[backend]}")
    from dynnet_ros.engine.backends.cpu import OrtExecutor

    if backend == "tensorrt":  # options: DYNNET_TRT_* environment (docs/tensorrt.md)
        from dynnet_ros.engine.backends.tensorrt import TensorRTExecutor

        return TensorRTExecutor(model, threads=threads)
    if backend == "cpu":
        from dynnet_ros.engine.backends.cpu_planned import create_planned_executor

        return create_planned_executor(model, threads=threads)
    return OrtExecutor(model, threads=threads)
