"""The planned CPU backend: RDP plans over onnxruntime kernels (engine/plan), the default "cpu".

``backend="ort"`` keeps the plain single-session executor (backends.cpu.OrtExecutor) for
comparison and as a fallback for models the planner cannot cut.
"""
from __future__ import annotations

import logging
import os
import subprocess

import onnx

from dynnet_ros.engine.backends.cpu import OrtExecutor

log = logging.getLogger(__name__)


#: Planner settings per profile ($DYNNET_PLAN_PROFILE). "memory" (default): segments cut wherever
#: the arena plan can hold a big tensor, no onnxruntime arena — peak 0.30-0.56x a plain session,
#: wall time 1.2-1.5x on an idle machine. "balanced": segments only at data-dependent ops and
#: control flow, each session with onnxruntime's own arena — peak 0.35-0.86x, wall 1.02-1.28x
#: (docs/engine.md, "Profiles").
PROFILES: dict[str, dict] = {"memory": {}, "balanced": {"granularity": "coarse", "segment_arena": True}}


def plan_profile() -> dict:
    """The planner settings of $DYNNET_PLAN_PROFILE (ValueError for an unknown name)."""
    name = os.environ.get("DYNNET_PLAN_PROFILE", "memory") or "memory"
    if name not in PROFILES:
        raise ValueError(f"DYNNET_PLAN_PROFILE={name!r}: choose one of {sorted(PROFILES)}")
    return dict(PROFILES[name])


def create_planned_executor(model: onnx.ModelProto, *, threads: int | None = None, layout: str = "nchwc",
                            **options):
    """A PlannedExecutor, or the plain executor (with a warning) if planning this model fails.

    ``layout="nchwc"`` plans onnxruntime's blocked-layout rewrite of the model (engine/plan/layout.py:
    its fast NCHWc kernels without reorder buffers at segment borders); where that rewrite is
    unavailable (no NCHWc kernels on this CPU, rewrite or planning fails) the model is planned as
    given. ``options``: further PlannerOptions fields (tools and benchmarks).
    """
    from dynnet_ros.engine.plan.executor import PlannedExecutor, PlannerOptions

    options = {**plan_profile(), **options}
    if layout == "nchwc":
        from dynnet_ros.engine.plan.layout import laid_out_skeleton

        try:
            laid_out, _ = laid_out_skeleton(model)
            return PlannedExecutor(laid_out, PlannerOptions(threads=threads, optimization_level="basic",
                                                            nchwc_max_bytes=0, layout="nchwc", **options))
        except (ValueError, OSError, subprocess.SubprocessError) as exc:
            log.info("NCHWc layout not used for this model (%s); planning the model as given", exc)
    elif layout != "as-given":
        raise ValueError(f"unknown layout {layout!r} (nchwc | as-given)")
    try:
        return PlannedExecutor(model, PlannerOptions(threads=threads, **options))
    except ValueError as exc:
        log.warning("planned engine unavailable for this model (%s); using plain onnxruntime", exc)
        return OrtExecutor(model, threads=threads)
