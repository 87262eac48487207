"""Execution backends behind the Engine facade.

A backend turns a checked ModelProto into an *executor*: ``run(feeds) -> {name: array}`` and
``close()``. Backends that need optional packages (TensorRT, pycuda) report why they are
unavailable instead of failing at import time.
"""
from __future__ import annotations

from dynnet_ros.engine.backends.base import Executor
from dynnet_ros.engine.backends.registry import available_backends, create_executor, load_for_backend

__all__ = ["Executor", "available_backends", "create_executor", "load_for_backend"]
