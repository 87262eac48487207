"""The planned CPU backend: RDP plans over onnxruntime kernels (engine/plan), the default "cpu".

``backend="ort"`` keeps the plain single-session executor (runtime.ort_executor.OrtExecutor) for
comparison and as a fallback for models the planner cannot cut.
"""
from __future__ import annotations

import json
import logging
import math
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from dynnet_ros.engine.backends.cut_timing import (
    Probe,
    candidates,
    load_per_core,
    reference_feeds,
    search,
    time_ratio,
)
from dynnet_ros.engine.backends.cut_verdict import cut_verdict
from dynnet_ros.engine.modelio.loader import load_skeleton, source_path
from dynnet_ros.engine.modelio.models import input_specs
from dynnet_ros.engine.modelio.onnx_proto import ModelProto
from dynnet_ros.engine.plan.compile import Plan, compile_plan
from dynnet_ros.engine.plan.cost_model import CutChoice
from dynnet_ros.engine.plan.layout import laid_out_skeleton
from dynnet_ros.engine.plan.options import PlannerOptions, plan_profile
from dynnet_ros.engine.runtime.base import Executor
from dynnet_ros.engine.runtime.executor import PlannedExecutor
from dynnet_ros.engine.runtime.ort_executor import OrtExecutor
from dynnet_ros.memtrim import pin_mmap_threshold

log = logging.getLogger(__name__)

#: timings of the lean single session at most, while its ratio stays over the limit (lean_verdict)
LEAN_TIMINGS = 3


def create_planned_executor(model: ModelProto | str, *, threads: int | None = None, layout: str = "nchwc",
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
            return OrtExecutor(path, threads=threads, plan=verdict, lean=bool(verdict.get("lean", True)))
        options = timed_point(verdict)
    graph = load_skeleton(model) if isinstance(model, str) else model
    return plan_here(graph, threads=threads, layout=layout, options={**profile, **options})


def timed_point(verdict: Mapping[str, Any] | None) -> dict[str, Any]:
    """PlannerOptions fields that make the planner take a timed verdict's point of its curve
    (none where the verdict names no point: the cost model's pick stands)."""
    if not verdict or verdict.get("segments") is None:
        return {}
    return {"curve_segments": int(verdict["segments"]), "curve_reason": str(verdict.get("reason", ""))}


def plan_here(model: ModelProto, *, threads: int | None, layout: str, options: Mapping[str, Any]) -> Executor:
    """Plan ``model`` in this process (``options``: PlannerOptions fields) and run the plan; the
    single plain session where the cost model finds nothing to save, or where planning fails."""
    if layout == "nchwc":
        try:
            return _run(model, threads, compile_plan(_laid_out(model), _nchwc_options(threads, options)))
        except (ValueError, OSError, subprocess.SubprocessError) as exc:
            log.info("NCHWc layout not used for this model (%s); planning the model as given", exc)
    try:
        return _run(model, threads, compile_plan(model, _pinned(PlannerOptions(threads=threads, **options))))
    except ValueError as exc:
        log.warning("planned engine unavailable for this model (%s); using plain onnxruntime", exc)
        return OrtExecutor(model, threads=threads, lean=True)


def compile_here(model: ModelProto, *, threads: int | None, layout: str,
                 options: Mapping[str, Any]) -> Plan | None:
    """The plan ``plan_here`` would run, compiled without building anything: blocked layout where
    it applies, else the model as given; None where the model cannot be planned."""
    if layout == "nchwc":
        try:
            return compile_plan(_laid_out(model), _nchwc_options(threads, options))
        except (ValueError, OSError, subprocess.SubprocessError) as exc:
            log.info("NCHWc layout not used for this model (%s); planning the model as given", exc)
    try:
        return compile_plan(model, _pinned(PlannerOptions(threads=threads, **options)))
    except ValueError as exc:
        log.info("planned engine unavailable for this model (%s)", exc)
        return None


def _laid_out(model: ModelProto) -> ModelProto:
    return laid_out_skeleton(model)[0]


def _nchwc_options(threads: int | None, options: Mapping[str, Any]) -> PlannerOptions:
    return _pinned(PlannerOptions(threads=threads, optimization_level="basic", nchwc_max_bytes=0, layout="nchwc",
                                  **options))


def _pinned(options: PlannerOptions) -> PlannerOptions:
    """``options``, with glibc's mmap threshold pinned before planning allocates (process-wide)."""
    if options.mmap_threshold:
        pin_mmap_threshold(options.mmap_threshold)
    return options


def _run(model: ModelProto, threads: int | None, plan: Plan) -> Executor:
    """The executor of ``plan``: one plain session where it says so, else its planned segments."""
    if plan.one_session:
        return _one_session(model, threads, plan)
    return PlannedExecutor(plan)


def decide(path: str, threads: int | None, layout: str, options: Mapping[str, Any]) -> dict:
    """The cut verdict for the model file ``path`` (cut_verdict.py's child process runs this): the
    plan ``plan_here`` would run, compiled without building it; where ``options`` set a latency
    limit, its cut choice timed against one plain session (``timed_verdict``), and a single
    session's lean options timed against onnxruntime's defaults (``lean_verdict``)."""
    model = load_skeleton(path)
    limit = options.get("latency_limit")
    plan = compile_here(model, threads=threads, layout=layout, options=options)
    if plan is None:
        return {"fallback": False}  # planning failed: the serving process plans and says why
    choice = plan.cut_choice
    if choice is None or not limit:
        if plan.one_session and choice is not None:
            return {"fallback": True, "reason": choice.reason, "cuts": choice.describe(), "lean": choice.chosen.lean}
        return {"fallback": False}
    feeds = reference_feeds(input_specs(model), plan.reference_inputs)
    if plan.one_session:
        lean = choice.chosen.lean  # the cost model's: where it predicts a saving
        verdict = {"fallback": True, "reason": choice.reason, "cuts": choice.describe(), "lean": lean}
        if not lean:
            return verdict
        baseline = OrtExecutor(path, threads=threads)
        try:
            return {**verdict, **lean_verdict(path, threads, baseline, feeds, float(limit))}
        finally:
            baseline.close()
    return timed_verdict(path, threads, layout, options, choice, feeds, float(limit))


def timed_verdict(path: str, threads: int | None, layout: str, options: Mapping[str, Any], choice: CutChoice,
                  feeds: Mapping[str, np.ndarray], limit: float) -> dict:
    """The leanest point of ``choice``'s curve whose run on ``feeds`` (the reference shapes) stays
    within ``limit`` x one plain onnxruntime session's time, or one plain session where none does
    (cut_timing.py), lean where that is within the limit too."""
    points = candidates(choice, float(options.get("fallback_min_saving", PlannerOptions.fallback_min_saving)))
    shapes = {name: feed.shape for name, feed in feeds.items()}
    baseline = OrtExecutor(path, threads=threads)
    try:
        def measure(index: int) -> float:
            planned = plan_here(load_skeleton(path), threads=threads, layout=layout,
                                options={**options, "curve_segments": points[index].sessions})
            try:
                return time_ratio(planned, baseline, feeds)
            finally:
                planned.close()

        at = "x".join(str(d) for shape in shapes.values() for d in shape)
        try:
            index, taken = search(len(points), measure, limit)
        except (ValueError, RuntimeError) as exc:  # feeds the model refuses at the reference shape
            log.info("cut choice not timed (%s)", exc)
            return {"fallback": False,
                    "timing": {"error": str(exc).splitlines()[0] if str(exc) else type(exc).__name__}}
        timing = {"limit": limit, "shapes": {name: list(shape) for name, shape in shapes.items()},
                  "load_per_core": load_per_core(),
                  "probes": [Probe(points[k].sessions, ratio).describe() for k, ratio in taken]}
        reference = choice.onnxruntime.activation_bytes or 1
        if index is None:
            fastest = points[-1]
            ratio = dict(taken)[len(points) - 1]
            reason = (f"one onnxruntime session: every cut set that saves memory ran over {limit:.2f}x its time "
                      f"at {at} (the fastest, {fastest.sessions} segments, took {ratio:.2f}x)")
            lean = lean_verdict(path, threads, baseline, feeds, limit) if choice.session.lean else {"lean": False}
            return {"fallback": True, "reason": reason, "cuts": choice.describe(), "timing": timing, **lean}
    finally:
        baseline.close()
    point, ratio = points[index], dict(taken)[index]
    reason = (f"the leanest cut set timed within {limit:.2f}x one onnxruntime session's time at {at}: "
              f"{point.sessions} segments took {ratio:.2f}x ({point.activation_bytes / reference:.2f}x onnxruntime's "
              f"predicted activations)")
    return {"fallback": False, "segments": point.sessions, "reason": reason, "timing": timing}


def lean_verdict(path: str, threads: int | None, baseline: OrtExecutor, feeds: Mapping[str, np.ndarray],
                 limit: float) -> dict:
    """``{"lean": ..., "lean_ratio": ...}``: whether the single session runs lean (OrtExecutor),
    which holds less memory over a sequence of shapes, where its time on ``feeds`` is within
    ``limit`` x ``baseline``'s (onnxruntime's defaults); lean, untimed, where the feeds fail.

    The two sides run the same kernels, so their ratio sits near 1 and one timing's noise could
    cost the memory: a ratio over the limit is timed again, up to ``LEAN_TIMINGS`` in all, and
    the smallest kept (other processes only ever add time)."""
    lean = OrtExecutor(path, threads=threads, lean=True)
    ratio = math.inf
    try:
        for _ in range(LEAN_TIMINGS):
            ratio = min(ratio, time_ratio(lean, baseline, feeds))
            if ratio <= limit:
                break
    except Exception as exc:  # noqa: BLE001 - onnxruntime's own types: the feeds, not the options, failed
        log.info("lean session not timed (%s)", exc)
        return {"lean": True, "lean_ratio": None}
    finally:
        lean.close()
    return {"lean": ratio <= limit, "lean_ratio": round(ratio, 3)}


def _one_session(model: ModelProto, threads: int | None, plan: Plan) -> Executor:
    """One onnxruntime session (OrtExecutor), lean where the cost model predicts that saves: the
    cost model found nothing to save by cutting. Untimed (a model given in memory, or explicit
    options), as the "memory" profile runs."""
    choice = plan.cut_choice
    assert choice is not None  # a one-session plan carries the choice that made it
    log.info("planned engine not used for this model: %s", choice.reason)
    # a weightless skeleton's external data is relative to its file: onnxruntime reads the file itself
    return OrtExecutor(source_path(model) or model, threads=threads, lean=choice.chosen.lean,
                       plan={"fallback": True, "reason": choice.reason, "cuts": choice.describe()})


if __name__ == "__main__":  # cut_verdict.py's child: PATH THREADS LAYOUT OPTIONS_JSON -> the verdict as JSON
    print(json.dumps(decide(sys.argv[1], int(sys.argv[2]) or None, sys.argv[3], json.loads(sys.argv[4]))))
