"""The Engine's memory-budget policy: which executor runs a model under a given budget.

Kept out of engine.py so the facade only delegates (``Engine.set_memory_budget`` and friends);
the policy sees the model through ``BudgetModel`` and the executor it is handed, never the Engine.

* cpu backend: the StreamedExecutor (swap/streamed.py), the planned engine with its weights
  streamed through a window the budget sizes. It is built on the first budget (at construction
  for ``Engine(swappable=True)``) and kept from then on, ``None`` included: later budget changes
  only resize the window.
* A budget is judged against the engine's own footprint at the input shapes (resident weights +
  what the engine holds besides them, measured once per model and shapes in a clean child
  process: swap/footprint.py), never against the process's RSS: the minimum is the same in
  every process and ``min_budget_mb`` is exactly the smallest budget accepted.
* other backends: no budget (``None``) only; a budget is refused with the reason.
* a budget below the model's minimum -> ValueError with the reason; the budget in force stays.
"""
from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from dynnet_ros.bytesize import MB
from dynnet_ros.engine.modelio.onnx_proto import ModelProto
from dynnet_ros.engine.modelio.ort_features import ort_features
from dynnet_ros.engine.rdp import RDPWarning, analyze
from dynnet_ros.engine.rdp.solve import runnable_shapes
from dynnet_ros.engine.runtime.base import Executor
from dynnet_ros.memtrim import release_memory
from dynnet_ros.swap.footprint import Footprint, load_or_measure, shapes_key
from dynnet_ros.swap.streamed import StreamedExecutor, predict_latency_ms, prepare_weight_file
from dynnet_ros.swap.weight_file import StoreError, WeightFile

LOG = logging.getLogger(__name__)
#: onnxruntime's per-process environment, for the estimates of backends that cannot stream
ESTIMATED_BASE_BYTES = 10 * MB
#: The planned engine's footprint beyond its weights and main arena, for the estimate used where
#: the weights cannot be streamed (and so nothing is calibrated)
PLANNED_BASE_BYTES = 30 * MB
#: Input dims a budget refers to before the engine has run or been told its input size.
REFERENCE_DIMS = {"H": 480, "W": 640, "height": 480, "width": 640}

Shapes = Mapping[str, tuple[int, ...]]
Signature = tuple
#: Why a budget given to an engine that runs in memory cannot bound the process: the in-memory
#: executor it replaces leaves its freed heap and code pages behind (docs/swap.md).
SWITCH_WARNING = ("this engine was built without a budget and without swappable=True, so its first budget "
                  "replaces the in-memory executor: the process held the in-memory footprint (~{inmemory_mb:.0f} MB) "
                  "until now, and the freed heap and code pages it leaves stay in the process's RSS, which the "
                  "engine's budget does not count; give a budget known at start to the constructor "
                  "(Engine(..., memory_budget_mb=...)), or build an engine whose budget will change with "
                  "Engine(..., swappable=True)")


@dataclass(frozen=True)
class BudgetModel:
    """What the policy knows of the engine's model; fixed for the engine's life."""

    #: the engine's graph (weightless for the planned cpu backend), asked for only when a budget
    #: needs it: the engine of a model file does not hold it while no budget does
    load_proto: Callable[[], ModelProto]
    backend: str
    threads: int | None
    layout: str                             # "nchwc" where it applies, or "as-given" (see streamed.py)
    weight_bytes: int
    create_executor: Callable[[], Executor]  # the backend's in-memory executor
    over_budget: str = "run"                # a frame at an input size the budget cannot hold: "raise" | "run"

    @property
    def proto(self) -> ModelProto:
        return self.load_proto()


class BudgetRefused(ValueError):
    """A budget the policy could not meet after it had given up the executor it was handed:
    ``executor`` is the one now running (under the budget that was in force)."""

    def __init__(self, reason: str, executor: Executor) -> None:
        super().__init__(reason)
        self.executor = executor


def preferred_shapes(model: ModelProto) -> dict[str, tuple[int, ...]]:
    """Concrete shape per graph input from its declaration alone: symbols from
    ``REFERENCE_DIMS``, other dynamic dims (unnamed, or ``-1`` as some exporters write them) 1
    for batch/channel axes and 224 for the rest."""
    inits = {init.name for init in model.graph.initializer}
    shapes: dict[str, tuple[int, ...]] = {}
    for value in model.graph.input:
        if value.name in inits:
            continue
        dims = []
        for axis, dim in enumerate(value.type.tensor_type.shape.dim):
            if dim.HasField("dim_value") and dim.dim_value >= 0:
                dims.append(int(dim.dim_value))
            elif dim.dim_param in REFERENCE_DIMS:
                dims.append(REFERENCE_DIMS[dim.dim_param])
            else:
                dims.append(1 if axis < 2 else 224)
        shapes[value.name] = tuple(dims)
    return shapes


def reference_shapes(model: ModelProto) -> dict[str, tuple[int, ...]]:
    """The input shapes budgets refer to before the engine has run or been told its input size:
    ``preferred_shapes``, with each dim RDP's requirements rule out moved to the closest size
    the model runs at (rdp/solve.py: a dim constrained to one value takes it). ValueError naming
    the inputs that need ``input_shapes`` where no such size can be derived."""
    preferred = preferred_shapes(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RDPWarning)  # an operator RDP does not know: reported by the planner
        try:
            result = analyze(model)
        except (ValueError, KeyError, TypeError) as exc:
            LOG.info("no shape analysis for the reference size (%s); using the declared dims", exc)
            return preferred
    return runnable_shapes(result, preferred)


def inmemory_estimate_bytes(weight_bytes: int, arena_bytes: int | None) -> int:
    """The in-memory footprint before it is measured: the planned engine holds one copy of the
    weights, its arena and ``PLANNED_BASE_BYTES``; an executor whose activations are not planned
    (plain onnxruntime, TensorRT) holds the weights twice (model and session) and the runtime."""
    if arena_bytes is None:
        return 2 * weight_bytes + ESTIMATED_BASE_BYTES + 8 * MB
    return weight_bytes + arena_bytes + PLANNED_BASE_BYTES


class SwapPolicy:
    """Picks and keeps the executor for the engine's budget (see the module docstring)."""

    def __init__(self, model: BudgetModel) -> None:
        self.model = model
        self.streamed: StreamedExecutor | None = None
        self._inmemory_estimate: int | None = None
        #: measured in-memory latency (ms, smoothed) per input signature
        self._inmemory_ms: dict[Signature | None, float] = {}
        self._inmemory_seen: set[Signature | None] = set()
        self._weights: WeightFile | None = None  # the verified weight file, once a budget asked for streaming
        self._weights_error: str | None = None   # why the weights cannot be streamed
        self._rebuilt_reason: str | None = None
        self._calibrations: dict[str, Footprint] = {}
        #: last values of the model's small integer inputs (the engine records them): calibration
        #: feeds them instead of zeros, which may pick a control-flow path the model cannot run
        self.control_values: dict[str, list] = {}
        self._reference: dict[str, tuple[int, ...]] | None = None

    def reference_shapes(self) -> dict[str, tuple[int, ...]]:
        """``reference_shapes`` of the model, derived once (ValueError: the inputs that need
        ``input_shapes``)."""
        if self._reference is None:
            self._reference = reference_shapes(self.model.proto)
        return self._reference

    # ------------------------------------------------------------------ the engine's own footprint
    def _weight_file(self) -> WeightFile:
        """The verified weight file (built on first use); ValueError when the weights cannot be streamed."""
        if self._weights is None:
            if self._weights_error is not None:
                raise ValueError(self._weights_error)
            features = ort_features()
            if not features.initializer_by_reference:  # the window swaps bytes under the sessions
                self._weights_error = (f"weights cannot be streamed: onnxruntime {features.version} copies "
                                       "weights given by reference (add_initializer)")
                raise ValueError(self._weights_error)
            try:
                self._weights, self._rebuilt_reason = prepare_weight_file(self.model.proto, self.model.layout)
            except (ValueError, OSError, StoreError) as exc:
                self._weights_error = f"weights cannot be streamed: {exc}"
                raise ValueError(self._weights_error) from exc
            if self._rebuilt_reason:
                LOG.warning("weight file rebuilt: %s", self._rebuilt_reason)
        return self._weights

    def footprint(self, shapes: Shapes | None) -> Footprint:
        """The engine's footprint at ``shapes`` (None: the reference size); ValueError when the
        weights cannot be streamed or the model does not run at these shapes (at the reference
        size: naming the inputs whose shapes the engine needs to be given)."""
        if shapes is None:
            if self.streamed is None:
                self._weight_file()  # weights that cannot be streamed: that reason, not the shapes
            try:
                return self._footprint(self.reference_shapes())
            except ValueError as exc:
                dynamic = ", ".join(repr(name) for name, declared in preferred_shapes(self.model.proto).items()
                                    if declared != self._declared_static(name))
                raise ValueError(f"{exc} (no input size was given, and the reference size derived from the "
                                 f"declared dims and RDP's requirements is not one the model runs at: give "
                                 f"Engine(input_shapes=...) for {dynamic or 'its inputs'})") from exc
        return self._footprint(shapes)

    def _declared_static(self, name: str) -> tuple[int, ...] | None:
        """The input's declared shape when every dim has a value (None: some dim is dynamic)."""
        for value in self.model.proto.graph.input:
            if value.name == name:
                dims = value.type.tensor_type.shape.dim
                if all(d.HasField("dim_value") and d.dim_value >= 0 for d in dims):
                    return tuple(int(d.dim_value) for d in dims)
        return None

    def _footprint(self, shapes: Shapes) -> Footprint:
        if self.streamed is not None:
            return self.streamed.footprint(shapes)
        key = shapes_key(shapes)
        if key not in self._calibrations:
            self._calibrations[key] = load_or_measure(self._weight_file(), self.model.threads, shapes,
                                                      values=self.control_values)
        return self._calibrations[key]

    def measure_ahead(self, shapes: Shapes) -> None:
        """Fill the on-disk calibration cache for ``shapes`` without changing this policy's
        state: safe to call outside the engine's lock, so a size class is measured (a child
        process, seconds) while frames keep running. Before the weight file exists there is
        nothing to measure yet; the locked call builds it."""
        if self.model.backend != "cpu":
            return
        streamed, weights = self.streamed, self._weights
        if streamed is not None:
            streamed.measure_ahead(shapes)
        elif weights is not None:
            with contextlib.suppress(ValueError):  # reported by the locked call that follows
                load_or_measure(weights, self.model.threads, shapes, values=self.control_values)

    # ------------------------------------------------------------------ policy
    def apply(self, budget_mb: float | None, current: Executor | None, *, in_force_mb: float | None,
              shapes: Shapes | None) -> Executor:
        """The executor for ``budget_mb``; ``current`` is the one running (None: none yet),
        ``in_force_mb`` its budget and ``shapes`` the input shapes budgets refer to.

        Raises ValueError before anything changes when the budget cannot be met, or
        BudgetRefused when it found that out after ``current`` was closed."""
        budget = None if budget_mb is None else int(budget_mb * MB)
        if self.streamed is not None:
            self.streamed.set_budget(budget)  # ValueError: the window stays as it was
            return self.streamed
        if self.model.backend != "cpu":
            if budget is not None:
                raise ValueError(f"memory budgets need streamed weights, which run on the cpu backend only "
                                 f"(backend is '{self.model.backend}')")
            return current if current is not None else self.model.create_executor()
        if budget is None and current is not None:
            return current
        return self._start_streaming(budget, current, in_force_mb, shapes)

    def _start_streaming(self, budget: int | None, current: Executor | None, in_force_mb: float | None,
                         given: Shapes | None) -> Executor:
        """The streamed executor at ``budget``, replacing ``current`` (None: the engine's first
        executor, which then streams with every weight resident); ``given``: the input shapes
        budgets refer to (None: the reference size)."""
        try:  # before anything is closed: the weight file and the footprint at these shapes
            weights = self._weight_file()
            calibration = self.footprint(given)
            shapes = given or self.reference_shapes()
        except ValueError as exc:
            if budget is None:  # a swappable engine without a budget: run in memory
                LOG.warning("%s; running in memory", exc)
                return current if current is not None else self.model.create_executor()
            raise
        if budget is not None and budget < calibration.minimum_bytes():
            raise ValueError(f"memory budget {round(budget / MB, 3):g} MB is below this model's minimum "
                             f"{calibration.minimum_bytes() / MB:.1f} MB at input {shapes_key(shapes)} "
                             f"(engine without weights {calibration.footprint / MB:.1f} MB + "
                             f"{calibration.min_stream_bytes / MB:.1f} MB of weights one step needs)")
        if current is not None:
            LOG.warning("%s", SWITCH_WARNING.format(inmemory_mb=calibration.inmemory_bytes() / MB))
            current.close()
        release_memory()
        try:
            streamed = StreamedExecutor(threads=self.model.threads, weights=weights,
                                        rebuilt_reason=self._rebuilt_reason, over_budget=self.model.over_budget)
            streamed.control_values = self.control_values  # shared: the engine keeps it current
            streamed.calibrate(shapes)
        except (ValueError, OSError) as exc:  # unexpected after the checks above: back to memory
            raise BudgetRefused(f"the streamed executor could not be built: {exc}", self.model.create_executor()) \
                from exc
        self.streamed = streamed
        try:
            streamed.set_budget(budget)
        except ValueError as exc:
            # the executor it replaced is gone: this one runs under the budget that was in force
            try:
                streamed.set_budget(None if in_force_mb is None else int(in_force_mb * MB))
            except ValueError:
                streamed.set_budget(None)
            raise BudgetRefused(str(exc), streamed) from exc
        return streamed

    def inmemory_bytes(self, current: Executor | None, shapes: Shapes | None) -> int:
        """The budget at which every weight is resident: from the calibration where the weights
        stream (cpu), else estimated from the current executor's arena plan."""
        if self.model.backend == "cpu":
            try:
                return self.footprint(shapes).inmemory_bytes()
            except ValueError:
                pass  # weights that cannot be streamed: estimated below
        if self._inmemory_estimate is None:
            arena = None if current is None else current.arena_bytes_at(shapes or self.reference_shapes())
            self._inmemory_estimate = inmemory_estimate_bytes(self.model.weight_bytes, arena)
        return self._inmemory_estimate

    # ------------------------------------------------------------------ reporting
    def min_budget_mb(self, current: Executor | None, shapes: Shapes | None) -> float:
        """The smallest budget ``apply`` accepts at ``shapes`` (cpu backend; exact, in every
        process state); elsewhere, where no budget is accepted, the in-memory footprint."""
        if self.model.backend == "cpu":
            try:
                return self.footprint(shapes).minimum_bytes() / MB
            except ValueError:
                pass  # weights that cannot be streamed: no budget is accepted
        return self.inmemory_bytes(current, shapes) / MB

    def observe_run(self, latency_ms: float, signature: Signature) -> None:
        """Record a frame's latency; in-memory frames calibrate the table's in-memory level."""
        if self.streamed is not None:
            return
        if signature not in self._inmemory_seen:  # the first run at a size pays one-off set-up: not a sample
            self._inmemory_seen.add(signature)
            return
        old = self._inmemory_ms.get(signature)
        self._inmemory_ms[signature] = latency_ms if old is None else 0.8 * old + 0.2 * latency_ms

    def latency_table(self, current: Executor | None, shapes: Shapes | None, signature: Signature | None,
                      last_latency_ms: float | None) -> list[tuple[float, float]]:
        """Predicted latency from the minimum up to the in-memory level: the streamed executor's
        measured compute time and read rate once it ran; before, the in-memory latency."""
        measured = self._inmemory_ms.get(signature)
        streamed = self.streamed
        if measured is None and streamed is not None:
            measured = streamed.compute_ms
        if measured is None:  # one frame so far (its set-up included)
            measured = last_latency_ms
        if measured is None:
            return []
        inmemory = self.inmemory_bytes(current, shapes)
        if self.model.backend != "cpu":
            return [(inmemory / MB, measured)]
        if streamed is not None:
            rows = [row for row in streamed.latency_table(inmemory, measured) if row[0] < inmemory / MB]
            return rows + [(inmemory / MB, measured)]
        try:
            calibration = self.footprint(shapes)
        except ValueError:
            return [(inmemory / MB, measured)]
        rows = []
        for budget in np.linspace(calibration.minimum_bytes(), inmemory, 8)[:-1]:
            rows.append((float(budget) / MB, predict_latency_ms(measured, calibration.weight_span,
                                                                calibration.allowance(int(budget)),
                                                                calibration.min_stream_bytes, None)))
        return rows + [(inmemory / MB, measured)]

    def close(self) -> None:
        if self.streamed is not None:
            self.streamed.close()
            self.streamed = None
