"""Backend names -> executor factories, with availability checks."""
from __future__ import annotations

import importlib.util

import onnx

from dynnet_ros.engine.backends.base import Executor


def _tensorrt_missing() -> str | None:
    missing = [name for name in ("tensorrt", "pycuda") if importlib.util.find_spec(name) is None]
    return f"needs the Python package(s) {', '.join(missing)}, not importable here" if missing else None


def available_backends() -> dict[str, str | None]:
    """Backend name -> None when usable, else the reason it is not."""
    return {"cpu": None, "tensorrt": _tensorrt_missing() or "not built into this version of dynnet_ros"}


def create_executor(backend: str, model: onnx.ModelProto, *, threads: int | None = None) -> Executor:
    reasons = available_backends()
    if backend not in reasons:
        raise ValueError(f"unknown backend '{backend}'; choose one of {sorted(reasons)}")
    if reasons[backend] is not None:
        raise ValueError(f"backend '{backend}' is unavailable: {reasons[backend]}")
    from dynnet_ros.engine.backends.cpu import OrtExecutor

    return OrtExecutor(model, threads=threads)
