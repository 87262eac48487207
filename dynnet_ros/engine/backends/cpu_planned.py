"""The planned CPU backend: RDP plans over onnxruntime kernels (engine/plan), the default "cpu".

``backend="ort"`` keeps the plain single-session executor (backends.cpu.OrtExecutor) for
comparison and as a fallback for models the planner cannot cut.
"""
from __future__ import annotations

import json
import logging
import subprocess
import sys
from typing import Any, Mapping

import onnx

from dynnet_ros.engine.backends.base import Executor
from dynnet_ros.engine.backends.cpu import OrtExecutor
from dynnet_ros.engine.backends.cut_verdict import cut_verdict
from dynnet_ros.engine.plan.executor import CutsChosen, NothingToSave, PlannedExecutor
from dynnet_ros.engine.plan.layout import laid_out_skeleton
from dynnet_ros.engine.plan.loader import load_skeleton, source_path
from dynnet_ros.engine.plan.options import PlannerOptions, plan_profile

log = logging.getLogger(__name__)


def create_planned_executor(model: onnx.ModelProto | str, *, threads: int | None = None, layout: str = "nchwc",
                            input_shapes: Mapping[str, tuple[int, ...]] | None = None, **options) -> Executor:
    """A PlannedExecutor, or the plain executor (with a warning) if planning this model fails.

    ``layout="nchwc"`` plans onnxruntime's blocked-layout rewrite of the model (engine/plan/layout.py:
    its fast NCHWc kernels without reorder buffers at segment borders); where that rewrite is
    unavailable (no NCHWc kernels on this CPU, rewrite or planning fails) the model is planned as
    given. ``options``: further PlannerOptions fields (tools and benchmarks) over those of the
    profile $DYNNET_PLAN_PROFILE names (plan/options.py). ``input_shapes``: the size the plan is
    weighed at (PlannerOptions.reference_shapes; default: dynamic dims at 640).

    ``model``: a weightless graph from ``load_skeleton``, an in-memory model, or a model file's
    path. For a model file under the profile's options, whether it is cut at all comes from its
    cached verdict (cut_verdict.py, decided in a child process once): a model the planner would
    run as one plain session is never analysed in this process, and given as a path its graph is
    never loaded here either.
    """
    if layout not in ("nchwc", "as-given"):
        raise ValueError(f"unknown layout {layout!r} (nchwc | as-given)")
    profile = plan_profile()
    if input_shapes:
        profile["reference_shapes"] = {name: [int(d) for d in shape] for name, shape in input_shapes.items()}
    path = model if isinstance(model, str) else source_path(model)
    if path is not None and not options:
        verdict = cut_verdict(path, threads, layout, profile)
        if verdict is not None and verdict.get("fallback"):
            log.info("planned engine not used for this model: %s", verdict.get("reason"))
            return OrtExecutor(path, threads=threads, plan=verdict)
    graph = load_skeleton(model) if isinstance(model, str) else model
    return plan_here(graph, threads=threads, layout=layout, options={**profile, **options})


def plan_here(model: onnx.ModelProto, *, threads: int | None, layout: str, options: Mapping[str, Any]) -> Executor:
    """Plan ``model`` in this process (``options``: PlannerOptions fields); the single plain session
    where the cost model finds nothing to save, or where planning fails."""
    if layout == "nchwc":
        try:
            laid_out, _ = laid_out_skeleton(model)
            return PlannedExecutor(laid_out, PlannerOptions(threads=threads, optimization_level="basic",
                                                            nchwc_max_bytes=0, layout="nchwc", **options))
        except NothingToSave as exc:
            if options.get("decide_only"):
                raise
            return _one_session(model, threads, exc)
        except (ValueError, OSError, subprocess.SubprocessError) as exc:
            log.info("NCHWc layout not used for this model (%s); planning the model as given", exc)
    try:
        return PlannedExecutor(model, PlannerOptions(threads=threads, **options))
    except NothingToSave as exc:
        if options.get("decide_only"):
            raise
        return _one_session(model, threads, exc)
    except ValueError as exc:
        log.warning("planned engine unavailable for this model (%s); using plain onnxruntime", exc)
        return OrtExecutor(model, threads=threads)


def decide(path: str, threads: int | None, layout: str, options: Mapping[str, Any]) -> dict:
    """The cut verdict for the model file ``path`` (cut_verdict.py's child process runs this): the
    analysis of ``plan_here`` up to the cut choice, no session built."""
    model = load_skeleton(path)
    try:
        plan_here(model, threads=threads, layout=layout, options={**options, "decide_only": True})
    except NothingToSave as exc:
        return {"fallback": True, "reason": exc.choice.reason, "cuts": exc.choice.describe()}
    except CutsChosen:
        return {"fallback": False}
    return {"fallback": False}  # planning failed: the serving process plans and says why


def _one_session(model: onnx.ModelProto, threads: int | None, exc: NothingToSave) -> Executor:
    """One plain onnxruntime session with its own arena: the cost model found nothing to save."""
    log.info("planned engine not used for this model: %s", exc.choice.reason)
    # a weightless skeleton's external data is relative to its file: onnxruntime reads the file itself
    return OrtExecutor(source_path(model) or model, threads=threads,
                       plan={"fallback": True, "reason": exc.choice.reason, "cuts": exc.choice.describe()})


if __name__ == "__main__":  # cut_verdict.py's child: PATH THREADS LAYOUT OPTIONS_JSON -> the verdict as JSON
    print(json.dumps(decide(sys.argv[1], int(sys.argv[2]) or None, sys.argv[3], json.loads(sys.argv[4]))))
