"""Backend names -> executor factories, with availability checks."""
from __future__ import annotations

from collections.abc import Mapping

from dynnet_ros.engine.backends.cpu_planned import create_planned_executor
from dynnet_ros.engine.backends.tensorrt import TensorRTExecutor
from dynnet_ros.engine.backends.trt_env import tensorrt_unavailable_reason
from dynnet_ros.engine.modelio.loader import load_skeleton
from dynnet_ros.engine.modelio.models import load_model
from dynnet_ros.engine.modelio.onnx_proto import ModelProto
from dynnet_ros.engine.runtime.base import Executor
from dynnet_ros.engine.runtime.ort_executor import OrtExecutor


def available_backends() -> dict[str, str | None]:
    """Backend name -> None when usable, else the reason it is not (TensorRT: tensorrt + pycuda
    import and a CUDA device exists, trt_env.probe)."""
    # "cpu": planned engine (engine/plan) over onnxruntime kernels; "ort": one plain session.
    return {"cpu": None, "ort": None, "tensorrt": tensorrt_unavailable_reason()}


def load_for_backend(backend: str, model) -> ModelProto:
    """The checked ModelProto the backend wants: for the planned "cpu" backend and a model file, a
    weightless graph whose weights are external-data references into that file (onnxruntime
    reads them once, straight into its sessions); otherwise the full model."""
    if backend == "cpu" and not isinstance(model, ModelProto):
        return load_skeleton(model)
    return load_model(model)


def create_executor(backend: str, model: ModelProto | str, *, threads: int | None = None,
                    layout: str = "nchwc", input_shapes: Mapping[str, tuple[int, ...]] | None = None) -> Executor:
    """The in-memory executor of ``backend`` for a ModelProto from ``load_for_backend`` or a
    model file's path (the planned backend then reads the file only where it plans);
    ``layout`` (cpu backend): "nchwc" where that rewrite applies, else the model as given;
    "as-given" always plans the model as given. ``input_shapes`` (cpu backend): the input size
    the plan is weighed at (default: 640 px)."""
    reasons = available_backends()
    if backend not in reasons:
        raise ValueError(f"unknown backend '{backend}'; choose one of {sorted(reasons)}")
    if reasons[backend] is not None:
        raise ValueError(f"backend '{backend}' is unavailable: {reasons[backend]}")
    if backend == "cpu":
        return create_planned_executor(model, threads=threads, layout=layout, input_shapes=input_shapes)
    proto = load_for_backend(backend, model) if isinstance(model, str) else model
    if backend == "tensorrt":  # options: DYNNET_TRT_* environment (docs/tensorrt.md)
        return TensorRTExecutor(proto, threads=threads)
    return OrtExecutor(proto, threads=threads)
