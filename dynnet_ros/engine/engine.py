"""The Engine facade: the one object nodes, tools and tests run models through.

Its contract (docs/engine.md) stays fixed while the insides change: RDP plans, streamed weights and
kernel versions plug in as executors (runtime/base.py) without touching callers.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import onnxruntime as ort

from dynnet_ros.bytesize import MB
from dynnet_ros.engine.backends.registry import create_executor, load_for_backend
from dynnet_ros.engine.modelio.feeds import FeedCheck, plan_breach, shape_signature, validate_feeds
from dynnet_ros.engine.modelio.loader import source_path
from dynnet_ros.engine.modelio.models import (
    InputSpec,
    ModelLike,
    default_specs,
    input_specs,
    output_names,
    weight_bytes,
)
from dynnet_ros.engine.modelio.onnx_proto import ModelProto
from dynnet_ros.engine.plan.options import default_threads
from dynnet_ros.engine.reference import ORT_RUN_ERRORS, ReferenceRunner, plain_only_reason, refused
from dynnet_ros.engine.runtime.base import OVER_BUDGET_POLICIES, Executor, ExecutorStats, OverBudget, WindowStats
from dynnet_ros.engine.runtime.ort_executor import OrtExecutor
from dynnet_ros.shared_lock import SharedLock
from dynnet_ros.swap.budget_policy import BudgetModel, BudgetRefused, SwapPolicy, preferred_shapes

log = logging.getLogger(__name__)

#: integer inputs up to this many elements count as control values (swap.budget_policy.SwapPolicy.control_values)
CONTROL_INPUT_MAX = 16


def validate_budget_mb(mb: float | int | None) -> float | None:
    """None means unlimited; otherwise a finite positive number of MiB."""
    if mb is None:
        return None
    if isinstance(mb, bool) or not isinstance(mb, (int, float, np.integer, np.floating)):
        raise ValueError(f"memory budget must be a number of MB or None, got {mb!r}")
    value = float(mb)
    if not np.isfinite(value) or value <= 0:
        raise ValueError(f"memory budget must be a finite positive number of MB, got {mb!r}")
    return value


@dataclass(frozen=True)
class EngineStats:
    """What ``Engine.engine_stats()`` reports: the engine's own counters plus its executor's."""

    backend: str
    executor: str                       # the running executor's name ("cpu-planned", "swap", ...)
    last_latency_ms: float | None
    shape_signature: dict[str, list[int]] | None
    runs: int
    shape_signatures_seen: int
    weight_bytes: int
    memory_budget_mb: float | None
    executor_stats: ExecutorStats

    @property
    def window(self) -> WindowStats | None:
        """The streamed weights window (None when the executor does not stream weights)."""
        return self.executor_stats.window

    @property
    def over_budget(self) -> OverBudget | None:
        """The input size now run above the budget (``over_budget="run"``); None while it holds."""
        window = self.executor_stats.window
        return None if window is None else window.over_budget

    def as_dict(self) -> dict[str, Any]:
        """The dict docs/engine.md lists for ``Engine.stats()``."""
        ex = self.executor_stats
        over = self.over_budget
        window = None if ex.window is None else {**asdict(ex.window), "mode": "stream",
                                                 "last_frame_read_mb": ex.window.last_frame_read_bytes / MB,
                                                 "min_budget_mb": ex.window.min_budget_bytes / MB,
                                                 "budget_mb": None if ex.window.budget_bytes is None
                                                 else ex.window.budget_bytes / MB}
        return {
            "backend": self.backend,
            "executor": self.executor,
            "last_latency_ms": self.last_latency_ms,
            "shape_signature": self.shape_signature,
            "runs": self.runs,
            "versions": {"onnxruntime": ort.__version__, "shape_signatures_seen": self.shape_signatures_seen},
            "arena_bytes": ex.arena_bytes,
            "weight_bytes": self.weight_bytes,
            "blocks": ex.blocks,
            "memory_budget_mb": self.memory_budget_mb,
            **({} if ex.resident_weight_bytes is None else {"resident_weight_bytes": ex.resident_weight_bytes}),
            **ex.details,
            "swap": window,
            "over_budget": None if over is None else {"shapes": over.shapes, "minimum_mb": over.minimum_mb,
                                                      "budget_mb": over.budget_mb, "overshoot_mb": over.overshoot_mb},
        }


class Engine:
    """Run one ONNX model: validated inputs in, onnxruntime-compatible outputs out."""

    def __init__(self, model: ModelLike, backend: str = "cpu", *, threads: int | None = None,
                 memory_budget_mb: float | None = None, swappable: bool = False, layout: str = "nchwc",
                 input_shapes: Mapping[str, tuple[int, ...]] | None = None, over_budget: str = "run",
                 concurrent_runs: int = 1) -> None:
        """``swappable``: start on the executor that takes budgets later without a rebuild (the
        planned engine with streamed weights, all resident while there is no budget) — for
        callers whose budget will change, like the model nodes. Switching executors later
        would leave the first one's freed heap and code pages in the process.

        ``layout`` (cpu backend): "nchwc" runs onnxruntime's blocked-layout rewrite where this
        CPU has its kernels and the model as given elsewhere; "as-given" always runs the model
        as given. Budgets stream the weights of the same graph either way.

        ``input_shapes``: the input shapes budgets refer to until the first frame (default: the
        reference size, 480x640 for image inputs), e.g. the size a node will feed; the planned
        engine also weighs its cuts at this size (default: dynamic dims at 640).

        A budget bounds what this engine holds — its resident weights plus its footprint besides
        them at the input size (swap/footprint.py) — not the process's RSS, which other engines
        and the caller's own allocations change too.

        ``over_budget``: what a frame does whose input size needs more than the budget in force
        (its minimum there, measured before the first frame of each size, is above the budget):
        "raise" refuses it with ``BudgetExceeded`` (a ValueError naming the shapes and the
        minimum; nothing changes), "run" runs it in the smallest window, above the budget, and
        flags it in ``engine_stats().over_budget`` (shapes, minimum, overshoot) until a frame fits
        or the budget is raised. At every size whose minimum fits, the window re-sizes so the
        engine holds the budget.

        A budget known at start belongs here (``memory_budget_mb``), and an engine whose budget
        will change is built ``swappable``: the first budget given to an engine built with
        neither replaces its in-memory executor, whose freed heap and code pages stay in the
        process (its RSS peaked at the in-memory footprint before, and stays above what the
        budget counts after).

        ``concurrent_runs``: how many ``run`` calls may go at once from different threads, each
        with activations of its own (the planned cpu backend while no budget holds the engine;
        under a budget runs take turns, within one run's activations). ``threads`` then defaults
        to the CPUs shared between them: two single-threaded runs keep two cores busy where one
        run's two threads wait on each other between operators."""
        if layout not in ("nchwc", "as-given"):
            raise ValueError(f"unknown layout {layout!r} (nchwc | as-given)")
        if over_budget not in OVER_BUDGET_POLICIES:
            raise ValueError(f"over_budget must be one of {OVER_BUDGET_POLICIES}, got {over_budget!r}")
        if concurrent_runs < 1:
            raise ValueError(f"concurrent_runs must be >= 1, got {concurrent_runs}")
        self.concurrent_runs = int(concurrent_runs)
        if threads is None and concurrent_runs > 1:
            threads = max(1, default_threads() // concurrent_runs)
        self.over_budget = over_budget
        self.model_path = None if not isinstance(model, (str, bytes)) and not hasattr(model, "__fspath__") \
            else str(model)
        # planned cpu: weightless graph, weights stay in the file
        self._proto: ModelProto | None = load_for_backend(backend, model)
        self.inputs: list[InputSpec] = input_specs(self.proto)
        self.defaults: list[InputSpec] = default_specs(self.proto)  # inputs an initializer gives a value
        self._check_feeds = FeedCheck(self.inputs, self.defaults)
        #: why this model runs through plain onnxruntime although the planned backend was asked for
        self.plain_reason = plain_only_reason(self.inputs + self.defaults) if backend == "cpu" else None
        if self.plain_reason is not None:
            log.warning("%s; running the model through plain onnxruntime", self.plain_reason)
            backend = "ort"
            self._proto = load_for_backend(backend, model)
        self.backend = backend
        self.threads = threads
        # feeds onnxruntime takes but the model's declaration does not (feeds.plan_breach)
        self._reference = ReferenceRunner(self.model_path or source_path(self.proto) or self.proto, threads)
        self.outputs: list[str] = output_names(self.proto)
        self.weight_bytes = weight_bytes(self.proto)
        self.layout = layout
        self._swap = SwapPolicy(BudgetModel(
            load_proto=lambda: self.proto, backend=backend, threads=threads, layout=layout,
            weight_bytes=self.weight_bytes, create_executor=self._create_inmemory, over_budget=over_budget))
        self._expected_shapes = None if input_shapes is None else self._checked_shapes(input_shapes)
        #: the model file the planned backend reads its graph from again when a plan or a budget
        #: needs it (None: the graph is held). The graph is dropped before any session exists, so a
        #: model the planner runs as one plain session holds no more than onnxruntime's own session
        #: (``Constant`` weights inside ``If`` bodies stay in the graph, for one) and its heap is
        #: free for the session to reuse.
        self._graph_file: str | None = source_path(self.proto) if backend == "cpu" else None
        inmemory = memory_budget_mb is None and not swappable  # else the budget policy reads the graph at once
        if self._graph_file is not None and inmemory:
            self._proto = None
        # With a budget (or swappable) the budget policy builds the first executor: no full
        # in-memory one first.
        self._executor: Executor | None = self._create_inmemory() if inmemory else None
        self._allow_runs(self._executor)
        # held shared by runs that may overlap (the executor's runs_concurrently), exclusive by
        # everything that changes or reads the executor's state, runs that take turns included
        self._lock = SharedLock()
        self._stats_lock = threading.Lock()   # what runs record, from several threads at once
        self._budget_mb: float | None = None
        self._last_latency_ms: float | None = None
        self._last_signature: tuple | None = None
        self._runs = 0
        self._signatures: set = set()
        try:
            self.set_memory_budget(memory_budget_mb)
        except ValueError:
            self.close()  # an executor built for the refused budget would outlive this engine
            raise

    @property
    def proto(self) -> ModelProto:
        """The engine's graph (for the planned cpu backend and a model file: weightless, its
        weights are references into the file), read from the file again if it was dropped."""
        proto = self._proto
        if proto is None:
            if self._graph_file is None:  # the constructor holds the graph of every other model
                raise RuntimeError("the engine holds no graph")
            proto = self._proto = load_for_backend(self.backend, self._graph_file)
        return proto

    def _create_inmemory(self) -> Executor:
        # a dropped graph stays dropped: the backend reads the file itself and, where it runs one
        # plain session, never loads the graph at all
        model = self._graph_file if self._proto is None and self._graph_file is not None else self.proto
        return create_executor(self.backend, model, threads=self.threads, layout=self.layout,
                               input_shapes=self._expected_shapes)

    def _checked_shapes(self, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
        """``shapes`` as feeds of zeros would pass ``validate_feeds`` (ValueError otherwise)."""
        if not isinstance(shapes, Mapping):
            raise ValueError(f"input shapes must map input names to shapes, got {shapes!r}")
        try:
            out = {str(name): tuple(int(d) for d in shape) for name, shape in shapes.items()}
        except (TypeError, ValueError):
            raise ValueError(f"input shapes must be tuples of ints, got {dict(shapes)!r}") from None
        if any(spec.name not in out for spec in self.inputs):  # inputs not named: at the reference size
            try:
                reference = self._swap.reference_shapes()
            except ValueError:  # no size RDP allows for every input: the declared dims, checked below
                reference = preferred_shapes(self.proto)
            out = {**reference, **out}
        dtypes = {spec.name: spec.dtype for spec in self.inputs}
        # zero-stride views: checked like feeds, nothing allocated
        validate_feeds(self.inputs, {name: np.broadcast_to(np.zeros((), dtype=dtypes.get(name, np.float32)), shape)
                                     for name, shape in out.items()})
        return out

    def _shapes(self) -> dict[str, tuple[int, ...]] | None:
        """The input shapes budgets refer to: the last run, else those given at construction."""
        if self._last_signature is None:
            return self._expected_shapes
        return {name: tuple(shape) for name, shape in self._last_signature}

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Same semantics as ``InferenceSession.run(None, feeds)`` but keyed by output name."""
        checked = self._check_feeds(feeds)
        signature = shape_signature(checked)
        with self._lock.shared():
            executor = self._executor
            if executor is not None and _overlaps(executor):
                return self._run_on(executor, checked, signature)
        with self._lock:
            return self._run_on(self._executor, checked, signature)

    def _run_on(self, executor: Executor | None, checked: dict[str, np.ndarray],
                signature: tuple) -> dict[str, np.ndarray]:
        """One run on ``executor``, inside the engine's lock (shared where runs overlap)."""
        if executor is None:  # the constructor sets one or raises
            raise RuntimeError("the engine has no executor")
        # a plain session (backend "ort", or the planner's single-session verdict) holds no
        # plan that feeds outside the declaration could break
        plain = self.backend == "ort" or executor.name == OrtExecutor.name
        breach = None if plain else plan_breach(self.inputs, checked)
        start = time.perf_counter()
        try:
            outputs = executor.run(checked) if breach is None else self._reference.run(checked, breach)
        except ORT_RUN_ERRORS as exc:
            raise refused(checked, exc) from exc
        latency_ms = (time.perf_counter() - start) * 1e3
        with self._stats_lock:
            self._last_latency_ms = latency_ms
            self._runs += 1
            if breach is not None:  # budgets and calibrations describe the planned runs only
                return outputs
            self._record_control_values(checked)
            self._last_signature = signature
            self._swap.observe_run(latency_ms, signature)  # calibrates the in-memory table level
            self._signatures.add(signature)
        return outputs

    def _record_control_values(self, feeds: Mapping[str, Any]) -> None:
        """Keep the values of small integer inputs (a sample rate, a mode) for the footprint
        calibration, which would otherwise feed zeros that may steer ``If`` into a failing branch."""
        for name, value in feeds.items():
            if isinstance(value, np.ndarray) and value.size <= CONTROL_INPUT_MAX and value.dtype.kind in "biu":
                self._swap.control_values[name] = value.tolist()

    def set_memory_budget(self, mb: float | int | None) -> None:
        """Bound the engine's footprint for this model (None = unlimited).

        Raises ValueError (and keeps the previous budget) for values that are not a positive MB
        count.
        """
        value = validate_budget_mb(mb)
        with self._lock:
            try:
                self._executor = self._swap.apply(value, self._executor, in_force_mb=self._budget_mb,
                                                  shapes=self._shapes())
            except BudgetRefused as exc:  # the executor was replaced; the budget in force stays
                self._executor = exc.executor
                raise
            finally:
                self._allow_runs(self._executor)
            self._budget_mb = value

    @property
    def runs_overlap(self) -> bool:
        """Whether ``run`` calls from several threads go at once now (``concurrent_runs`` > 1,
        the planned backend, no budget, every weight resident), rather than taking turns."""
        executor = self._executor
        return executor is not None and _overlaps(executor)

    def _allow_runs(self, executor: Executor | None) -> None:
        """Tell ``executor`` how many runs may go at once (where it can run several)."""
        allow = getattr(executor, "allow_concurrent_runs", None)
        if allow is not None and self.concurrent_runs > 1:
            allow(self.concurrent_runs)

    def min_budget_mb(self, shapes: Mapping[str, tuple[int, ...]] | None = None) -> float:
        """Smallest budget ``set_memory_budget`` accepts: the engine's footprint besides weights
        at the input size + the weights of its heaviest step. ``shapes``: at these input shapes
        (a size class not run yet) instead of the last run's. The same value in every process
        state; measured once per model and shapes in a child process, then cached."""
        checked = None if shapes is None else self._checked_shapes(shapes)
        target = checked or self._shapes()
        if target is not None:
            self._swap.measure_ahead(target)  # outside the lock: frames keep running meanwhile
        with self._lock:
            return self._swap.min_budget_mb(self._executor, checked or self._shapes())

    def latency_table(self) -> list[tuple[float, float]]:
        """(budget MB, predicted latency ms) per precomputed budget level, increasing budget."""
        shapes = self._shapes()
        if shapes is not None:
            self._swap.measure_ahead(shapes)  # outside the lock: frames keep running meanwhile
        with self._lock:
            return self._swap.latency_table(self._executor, self._shapes(), self._last_signature,
                                            self._last_latency_ms)

    @property
    def memory_budget_mb(self) -> float | None:
        return self._budget_mb

    def engine_stats(self) -> EngineStats:
        """Typed statistics: what the nodes and the budget manager read."""
        executor = self._executor
        return EngineStats(
            backend=self.backend, executor=executor.name if executor is not None else "none",
            last_latency_ms=self._last_latency_ms,
            shape_signature=None if self._last_signature is None
            else {name: list(shape) for name, shape in self._last_signature},
            runs=self._runs, shape_signatures_seen=len(self._signatures), weight_bytes=self.weight_bytes,
            memory_budget_mb=self._budget_mb,
            executor_stats=executor.executor_stats() if executor is not None else ExecutorStats())

    def stats(self) -> dict[str, Any]:
        """The statistics as the dict docs/engine.md lists (diagnostics, JSON reports)."""
        return self.engine_stats().as_dict()

    def close(self) -> None:
        with self._lock:
            if self._executor is not None:
                self._executor.close()  # the streamed executor closes twice: idempotent
            self._swap.close()
            self._reference.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _overlaps(executor: Executor) -> bool:
    """Whether ``executor`` lets runs overlap now (``runs_concurrently``; executors without it: no)."""
    overlaps = getattr(executor, "runs_concurrently", None)
    return bool(overlaps()) if overlaps is not None else False
