"""The planned CPU backend: RDP plans over onnxruntime kernels (engine/plan), the default "cpu".

``backend="ort"`` keeps the plain single-session executor (backends.cpu.OrtExecutor) for
comparison and as a fallback for models the planner cannot cut.
"""
from __future__ import annotations

import logging
import subprocess

import onnx

from dynnet_ros.engine.backends.base import Executor
from dynnet_ros.engine.backends.cpu import OrtExecutor
from dynnet_ros.engine.plan.executor import NothingToSave, PlannedExecutor
from dynnet_ros.engine.plan.layout import laid_out_skeleton
from dynnet_ros.engine.plan.loader import source_path
from dynnet_ros.engine.plan.options import PlannerOptions, plan_profile

log = logging.getLogger(__name__)


def create_planned_executor(model: onnx.ModelProto, *, threads: int | None = None, layout: str = "nchwc",
                            **options) -> Executor:
    """A PlannedExecutor, or the plain executor (with a warning) if planning this model fails.

    ``layout="nchwc"`` plans onnxruntime's blocked-layout rewrite of the model (engine/plan/layout.py:
    its fast NCHWc kernels without reorder buffers at segment borders); where that rewrite is
    unavailable (no NCHWc kernels on this CPU, rewrite or planning fails) the model is planned as
    given. ``options``: further PlannerOptions fields (tools and benchmarks) over those of the
    profile $DYNNET_PLAN_PROFILE names (plan/options.py).
    """
    options = {**plan_profile(), **options}
    if layout == "nchwc":
        try:
            laid_out, _ = laid_out_skeleton(model)
            return PlannedExecutor(laid_out, PlannerOptions(threads=threads, optimization_level="basic",
                                                            nchwc_max_bytes=0, layout="nchwc", **options))
        except NothingToSave as exc:
            return _one_session(model, threads, exc)
        except (ValueError, OSError, subprocess.SubprocessError) as exc:
            log.info("NCHWc layout not used for this model (%s); planning the model as given", exc)
    elif layout != "as-given":
        raise ValueError(f"unknown layout {layout!r} (nchwc | as-given)")
    try:
        return PlannedExecutor(model, PlannerOptions(threads=threads, **options))
    except NothingToSave as exc:
        return _one_session(model, threads, exc)
    except ValueError as exc:
        log.warning("planned engine unavailable for this model (%s); using plain onnxruntime", exc)
        return OrtExecutor(model, threads=threads)


def _one_session(model: onnx.ModelProto, threads: int | None, exc: NothingToSave) -> Executor:
    """One plain onnxruntime session with its own arena: the cost model found nothing to save."""
    log.info("planned engine not used for this model: %s", exc.choice.reason)
    # a weightless skeleton's external data is relative to its file: onnxruntime reads the file itself
    return OrtExecutor(source_path(model) or model, threads=threads,
                       plan={"fallback": True, "reason": exc.choice.reason, "cuts": exc.choice.describe()})
