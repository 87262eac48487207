"""The planned CPU backend: RDP plans over onnxruntime kernels (engine/plan), the default "cpu".

``backend="ort"`` keeps the plain single-session executor (backends.cpu.OrtExecutor) for
comparison and as a fallback for models the planner cannot cut.
"""
from __future__ import annotations

import logging

import onnx

from dynnet_ros.engine.backends.cpu import OrtExecutor

log = logging.getLogger(__name__)


def create_planned_executor(model: onnx.ModelProto, *, threads: int | None = None):
    """A PlannedExecutor, or the plain executor (with a warning) if planning this model fails."""
    from dynnet_ros.engine.plan.executor import PlannedExecutor, PlannerOptions

    try:
        return PlannedExecutor(model, PlannerOptions(threads=threads))
    except ValueError as exc:
        log.warning("planned engine unavailable for this model (%s); using plain onnxruntime", exc)
        return OrtExecutor(model, threads=threads)
