"""The planned engine's knobs: PlannerOptions, onnxruntime's optimisation levels by name, profiles.

Why apart from the executor: the options are read by the executor, its segment sessions, its
nested control-flow executors and the backends that pick a profile; none of them needs the
executor to know what the knobs are.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import onnxruntime as ort

from dynnet_ros.bytesize import MB
from dynnet_ros.engine.plan.cost_model import CostTable
from dynnet_ros.settings import settings


@dataclass
class PlannerOptions:
    """Knobs of the planned engine (defaults are what the benchmarks chose; see docs/engine.md)."""

    threads: int | None = None
    granularity: str = "choose"            # choose (cheaper of auto/fine, see _choose_partition) | auto | fine | coarse
    small_bytes: int = 64 * 1024           # tensors below this stay inside a segment
    reference_side: int = 640              # the symbol value the partitioner sizes tensors at
    # Input shapes to size tensors at instead (name -> shape; inputs not named: reference_side):
    # the size a node will feed, e.g. 48-pixel text lines, where a 640-pixel square would weigh
    # every cut at a size the model never sees.
    reference_shapes: Mapping[str, tuple[int, ...]] | None = None
    plan_cache_size: int = 16              # shape signatures whose plans are kept (LRU)
    optimization_level: str = "extended"   # onnxruntime level inside segments: disabled | basic | extended | all
    segment_arena: bool = False            # onnxruntime's own BFC arena inside each segment session
    shared_arena: bool = False             # one process-wide onnxruntime arena shared by all segment sessions
    shared_arena_strategy: int = 1         # its growth: 1 = kSameAsRequested, 0 = kNextPowerOfTwo
    versions: bool = True                  # shape-specialised segment sessions for hot signatures
    hot_after: int = 8                     # uses of a signature before its version is built
    version_budget_mb: float = 4.0         # bytes all versions may hold (their weight copies + sessions)
    simplify: bool = True
    fold_weights: bool = True              # simplify folds BatchNormalization into new conv weights
    use_rdp: bool = True
    order: str = "memory"                  # memory (exec_order) | model
    prepacking: bool = True                # onnxruntime's weight prepacking (a second copy of Gemm/MatMul B)
    # glibc serves blocks above this by mmap, so onnxruntime's per-run workspaces go back to the
    # OS instead of fragmenting the heap. 128 KiB matters: convolution working buffers are
    # exactly 128 KiB at 2 threads (docs/engine.md). Process-wide; costs a page fault per
    # touched page of big allocations.
    mmap_threshold: int | None = 128 * 1024
    # False: every parallel op wakes its threads. True: onnxruntime's default (idle pools keep
    # spinning, which starves the next segment's pool on a small CPU). "run": spin during a
    # segment's run only (force_spinning_stop) — slower next to a CPU-bound process, so not
    # the default (docs/engine.md)
    spinning: bool | str = False
    plan_branches: bool = True             # If: taken branch / Loop: body per iteration, own plans (control/loop.py)
    light_segment_threads: int | None = 1  # threads for segments without Conv/Gemm/MatMul (None: same)
    nchwc_max_bytes: int = MB              # segments whose tensors stay below this use ORT_ENABLE_ALL (NCHWc)
    nchwc_shared_arena: bool = False       # NCHWc segments' reorder buffers from one shared onnxruntime arena
    in_place: bool = True                  # element-wise segments write over an input that dies there
    stem_bands: int = 4                    # at least this many row bands for the stem convs (plan/banded.py); 0 = off
    stem_min_bytes: int = MB               # ... when the first conv's output is at least this big (reference shape)
    stem_min_gain: float = 0.1             # ... and banding lowers the reference arena bound by this fraction
    global_threads: bool = False           # all segment sessions share onnxruntime's process-wide thread pool
    layout: str = "as-given"               # "nchwc": the graph is onnxruntime's blocked-layout rewrite (plan/layout.py)
    # Weights bound by reference (name -> OrtValue over memory someone else owns and may swap;
    # swap/streamed.py): sessions get them through add_initializer, which keeps the pointer only
    # with prepacking off, so setting this turns prepacking off.
    shared_weights: Mapping[str, ort.OrtValue] | None = None
    max_segment_weight_bytes: int | None = None  # cut segments holding more weight than this (swapping unit)
    # Cut choice by the measured CPU cost model (plan/cost_model.py): merge segments whose cut costs
    # more time than it saves memory, or run one plain session where no cut set saves memory. Only
    # for weights held in memory: streamed weights keep the memory-first cut (their swapping unit).
    cost_model: bool = True
    memory_target: float = 0.6             # activation peak the cut choice aims at, x onnxruntime's
    fallback_min_saving: float = 0.1       # below this saving of onnxruntime's activations: one session
    cost_table: CostTable | None = None    # None: this machine's measured table (plan/cost_table.py)
    # The most time the cut set may take, x one plain onnxruntime session's, timed on the model
    # at its reference shape by the verdict's child process (backends/cut_timing.py); None: the
    # cost model's pick is not timed. A model given in memory (no file, so no verdict) is not timed.
    latency_limit: float | None = None
    # The curve's point with this many segments instead of the cost model's pick, and why (the
    # timed verdict's choice, handed to the serving process)
    curve_segments: int | None = None
    curve_reason: str = ""


def default_threads() -> int:
    """The threads a session gets when ``PlannerOptions.threads`` is None: this process's CPUs."""
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))


#: onnxruntime's graph optimisation level for each ``PlannerOptions.optimization_level`` name.
LEVELS = {"disabled": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
          "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
          "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
          "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}

#: Planner settings per profile ($DYNNET_PLAN_PROFILE). "auto" (default): the leanest cut set
#: whose timed run stays within ``AUTO_LATENCY_LIMIT`` x one plain onnxruntime session's, else one
#: plain session. "memory": the cost model's pick, untimed: segments cut wherever the arena plan
#: can hold a big tensor, no onnxruntime arena (lowest peak, whatever it costs in time).
#: "balanced": segments only at data-dependent ops and control flow, each session with
#: onnxruntime's own arena. Figures: docs/engine.md, "Profiles".
AUTO_LATENCY_LIMIT = 1.05  # "no slower than onnxruntime", with room for the timing's noise
PROFILES: dict[str, dict[str, Any]] = {"auto": {"latency_limit": AUTO_LATENCY_LIMIT}, "memory": {},
                                       "balanced": {"granularity": "coarse", "segment_arena": True}}


def plan_profile() -> dict[str, Any]:
    """The PlannerOptions fields of the profile $DYNNET_PLAN_PROFILE names (settings.py checks it)."""
    return dict(PROFILES[settings().planner.profile])
