"""onnxruntime on the CPU: the reference backend and the kernel library of the planned engine."""
from __future__ import annotations

import os
from typing import Mapping

import numpy as np
import onnx
import onnxruntime as ort

from dynnet_ros.engine.backends.base import ExecutorStats
from dynnet_ros.engine.plan.loader import source_path


def default_threads() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))


def session_options(threads: int | None = None) -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or default_threads()
    options.inter_op_num_threads = 1
    options.log_severity_level = 3  # warnings from ORT go to our diagnostics, not stderr spam
    return options


class OrtExecutor:
    """One onnxruntime InferenceSession over the whole model."""

    name = "cpu"

    def __init__(self, model: onnx.ModelProto | str, *, threads: int | None = None,
                 options: ort.SessionOptions | None = None, plan: dict | None = None) -> None:
        """``model``: a ModelProto with its weights, a weightless skeleton of a model file
        (plan/loader.py: onnxruntime reads the file it came from), or a model file's path.
        ``plan``: why the planned backend runs this plain session instead (its cost model's
        verdict), reported by ``executor_stats`` under "plan"."""
        self._plan = plan
        if not isinstance(model, str):
            model = source_path(model) or model  # a skeleton's weights are in its file
        try:
            self._session = ort.InferenceSession(
                model if isinstance(model, str) else model.SerializeToString(),
                sess_options=options or session_options(threads),
                providers=["CPUExecutionProvider"])
        except Exception as exc:  # ORT raises its own Fail/InvalidGraph types
            message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ValueError(f"onnxruntime cannot load the model: {message}") from exc
        self._outputs = [o.name for o in self._session.get_outputs()]

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        values = self._session.run(self._outputs, dict(feeds))
        # unpacked pairs: zip reuses one tuple, where dict(zip(...)) leaves one per output to the
        # interpreter's tuple free list on every run
        return {name: value for name, value in zip(self._outputs, values)}

    def executor_stats(self) -> ExecutorStats:
        return ExecutorStats(details={} if self._plan is None else {"plan": self._plan})

    def arena_bytes_at(self, shapes: Mapping[str, tuple[int, ...]]) -> int | None:
        return None  # onnxruntime's own arena: not planned, not known ahead

    def close(self) -> None:
        self._session = None
