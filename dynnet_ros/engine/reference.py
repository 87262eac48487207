"""Plain onnxruntime for what it runs and the planned engine cannot: the Engine's promise that it
never refuses a model or feed that ``InferenceSession`` runs.

Two cases reach it. A model with a non-tensor input (sequence, map, optional, sparse) runs
through onnxruntime as a whole: the planner plans tensors only. And feeds that onnxruntime
accepts although they break the model's own declaration (``feeds.plan_breach``) run through a
session built here on first use, so that a model whose callers keep to its declaration never
pays for a second session.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np
from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

from dynnet_ros.engine.modelio.models import InputSpec
from dynnet_ros.engine.modelio.onnx_proto import ModelProto
from dynnet_ros.engine.runtime.ort_executor import OrtExecutor

log = logging.getLogger(__name__)

#: What onnxruntime raises when a session refuses feeds (bad values, kernels that reject shapes).
ORT_RUN_ERRORS: tuple[type[BaseException], ...] = (ort_state.Fail, ort_state.InvalidArgument,
                                                   ort_state.RuntimeException, ort_state.NotImplemented)


def plain_only_reason(specs: list[InputSpec]) -> str | None:
    """Why the planned engine cannot run this model at all (None when it can)."""
    for spec in specs:
        if spec.kind != "tensor":
            return f"input '{spec.name}' is a {spec.kind} value and the planner plans tensors only"
    return None


def refused(feeds: Mapping[str, Any], exc: BaseException) -> ValueError:
    """onnxruntime's refusal of ``feeds`` as the one ValueError the Engine raises for bad input."""
    shapes = ", ".join(f"{name}: {list(np.shape(value)) if isinstance(value, np.ndarray) else type(value).__name__}"
                       for name, value in feeds.items())
    text = str(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    return ValueError(f"onnxruntime cannot run the inputs ({shapes}): {first}")


class ReferenceRunner:
    """One plain onnxruntime session over the source model, built on first use."""

    def __init__(self, source: ModelProto | str, threads: int | None) -> None:
        """``source``: the model file's path (onnxruntime reads it) or the full in-memory model."""
        self._source = source
        self._threads = threads
        self._executor: OrtExecutor | None = None
        self._reasons: set[str] = set()
        self.runs = 0

    def run(self, feeds: Mapping[str, Any], reason: str) -> dict[str, np.ndarray]:
        if reason not in self._reasons:
            self._reasons.add(reason)
            log.warning("running these inputs through plain onnxruntime: %s", reason)
        if self._executor is None:
            self._executor = OrtExecutor(self._source, threads=self._threads)
        self.runs += 1
        return self._executor.run(feeds)

    def close(self) -> None:
        if self._executor is not None:
            self._executor.close()
            self._executor = None
