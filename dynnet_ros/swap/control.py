"""The Engine's memory-budget policy: which executor runs a model under a given budget.

Kept out of engine.py so the facade only delegates (``Engine.set_memory_budget`` and friends);
the policy sees the model through ``BudgetModel`` and the executor it is handed, never the Engine.

* cpu backend: the StreamedExecutor (swap/streamed.py), the planned engine with its weights
  streamed through a window the budget sizes. It is built on the first budget (at construction
  for ``Engine(swappable=True)``) and kept from then on, ``None`` included: later budget changes
  only resize the window. It closes the executor it replaces *first*, so the footprint it
  measures is one engine's, not two side by side.
* other backends: no budget (``None``) only; a budget is refused with the reason.
* a budget below the model's minimum -> ValueError with the reason; the budget in force stays.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np
import onnx

from dynnet_ros.engine.backends.base import Executor
from dynnet_ros.engine.memtrim import release_memory
from dynnet_ros.swap.streamed import StreamedExecutor, predict_latency_ms, prepare_weight_file, split_bytes_for
from dynnet_ros.swap.weight_file import StoreError, WeightFile
from dynnet_ros.units import MB

LOG = logging.getLogger(__name__)
#: onnxruntime's per-process environment, for the estimates made before anything was measured.
ESTIMATED_BASE_BYTES = 10 * MB
#: The planned engine's footprint beyond its weights and main arena: onnxruntime's environment,
#: segment sessions, kernel code touched while running, If-branch arenas (docs/swap.md).
PLANNED_BASE_BYTES = 30 * MB
#: Input dims a budget refers to before the engine has run (the zoo's camera size).
REFERENCE_DIMS = {"H": 480, "W": 640, "height": 480, "width": 640}

Shapes = Mapping[str, tuple[int, ...]]
Signature = tuple


@dataclass(frozen=True)
class BudgetModel:
    """What the policy knows of the engine's model; fixed for the engine's life."""

    proto: onnx.ModelProto                  # the engine's graph (weightless for the planned cpu backend)
    backend: str
    threads: int | None
    layout: str                             # "nchwc" where it applies, or "as-given" (see streamed.py)
    weight_bytes: int
    baseline_rss: int                       # RSS before the model loaded: budgets bound the growth since
    external_bytes: Callable[[], int]       # bytes the caller allocated since and charges to itself
    create_executor: Callable[[], Executor]  # the backend's in-memory executor


class BudgetRefused(ValueError):
    """A budget the policy could not meet after it had given up the executor it was handed:
    ``executor`` is the one now running (under the budget that was in force)."""

    def __init__(self, reason: str, executor: Executor) -> None:
        super().__init__(reason)
        self.executor = executor


def reference_shapes(model: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    """Concrete shape per graph input at the reference size: symbols from ``REFERENCE_DIMS``,
    other dynamic dims 1 for batch/channel axes and 224 for the rest."""
    inits = {init.name for init in model.graph.initializer}
    shapes: dict[str, tuple[int, ...]] = {}
    for value in model.graph.input:
        if value.name in inits:
            continue
        dims = []
        for axis, dim in enumerate(value.type.tensor_type.shape.dim):
            if dim.HasField("dim_value"):
                dims.append(int(dim.dim_value))
            elif dim.dim_param in REFERENCE_DIMS:
                dims.append(REFERENCE_DIMS[dim.dim_param])
            else:
                dims.append(1 if axis < 2 else 224)
        shapes[value.name] = tuple(dims)
    return shapes


def inmemory_estimate_bytes(weight_bytes: int, arena_bytes: int | None) -> int:
    """The in-memory footprint before it is measured: the planned engine holds one copy of the
    weights, its arena and ``PLANNED_BASE_BYTES``; an executor whose activations are not planned
    (plain onnxruntime, TensorRT) holds the weights twice (model and session) and the runtime."""
    if arena_bytes is None:
        return 2 * weight_bytes + ESTIMATED_BASE_BYTES + 8 * MB
    return weight_bytes + arena_bytes + PLANNED_BASE_BYTES


class SwapControl:
    """Picks and keeps the executor for the engine's budget (see the module docstring)."""

    def __init__(self, model: BudgetModel) -> None:
        self.model = model
        self.streamed: StreamedExecutor | None = None
        self._inmemory: int | None = None
        #: measured in-memory latency (ms, smoothed) per input signature
        self._inmemory_ms: dict[Signature | None, float] = {}
        self._inmemory_seen: set[Signature | None] = set()
        self._weights: WeightFile | None = None  # the verified weight file, once a budget asked for streaming
        self._rebuilt_reason: str | None = None

    # ------------------------------------------------------------------ policy
    def apply(self, budget_mb: float | None, current: Executor | None, *, in_force_mb: float | None,
              shapes: Shapes | None) -> Executor:
        """The executor for ``budget_mb``; ``current`` is the one running (None: none yet),
        ``in_force_mb`` its budget and ``shapes`` the last input shapes run.

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
                         shapes: Shapes | None) -> Executor:
        """The streamed executor at ``budget``, replacing ``current`` (None: the engine's first
        executor, which then streams with every weight resident)."""
        if self._weights is None:  # before anything is closed: the weight file (verified once)
            try:
                self._weights, self._rebuilt_reason = prepare_weight_file(self.model.proto, self.model.layout)
            except (ValueError, OSError, StoreError) as exc:
                if budget is None:  # a swappable engine without a budget: run in memory
                    LOG.warning("weights cannot be streamed (%s); running in memory", exc)
                    return self.model.create_executor()
                raise ValueError(f"weights cannot be streamed: {exc}") from exc
            if self._rebuilt_reason:
                LOG.warning("weight file rebuilt: %s", self._rebuilt_reason)
        # a working in-memory executor is only given up for a budget that can plausibly be met
        if current is not None and budget is not None:
            estimate = self._stream_minimum_estimate(current, shapes)
            if budget < estimate:
                raise ValueError(f"memory budget {budget / MB:.1f} MB is below this model's minimum, estimated "
                                 f"{estimate / MB:.1f} MB (weights of its largest step + the engine without weights)")
        if current is not None:
            current.close()
        release_memory()
        try:
            streamed = StreamedExecutor(self.model.proto, threads=self.model.threads, weights=self._weights,
                                        rebuilt_reason=self._rebuilt_reason, baseline_rss=self.model.baseline_rss,
                                        external_bytes=self.model.external_bytes)
        except (ValueError, OSError) as exc:  # unexpected after the checks above: back to memory
            raise BudgetRefused(f"the streamed executor could not be built: {exc}", self.model.create_executor()) \
                from exc
        self.streamed = streamed
        streamed.calibrate(shapes or reference_shapes(self.model.proto))
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

    def _stream_minimum_estimate(self, current: Executor, shapes: Shapes | None) -> int:
        """Before the streamed executor exists, a lower bound of its minimum: the arena at the
        input size and the largest weight one step needs (FC weights split to 1/8 of all
        weights). Budgets below it are refused without a build. onnxruntime's environment is
        left out: the process may hold it already; the built executor measures what it adds."""
        sizes = sorted(int(np.prod(t.dims, dtype=np.int64)) * 4 for t in self.model.proto.graph.initializer)
        split = split_bytes_for(self.model.weight_bytes)
        step = min(sizes[-1], max(split, sizes[-2] if len(sizes) > 1 else 0)) if sizes else 0
        return self.inmemory_bytes(current, shapes) - self.model.weight_bytes - PLANNED_BASE_BYTES + step

    def inmemory_bytes(self, current: Executor | None, shapes: Shapes | None) -> int:
        """The in-memory footprint: measured by the streamed executor with every weight resident
        once it exists, else estimated from the current executor's arena plan."""
        if self.streamed is not None:
            return self.streamed.inmemory_bytes()
        if self._inmemory is None:
            arena = None if current is None else current.arena_bytes_at(shapes or reference_shapes(self.model.proto))
            self._inmemory = inmemory_estimate_bytes(self.model.weight_bytes, arena)
        return self._inmemory

    # ------------------------------------------------------------------ reporting
    def min_budget_mb(self, current: Executor | None, shapes: Shapes | None) -> float:
        """The smallest budget this model runs in: the streamed minimum (estimated before the
        streamed executor exists) or the in-memory footprint, whichever is smaller."""
        inmemory = self.inmemory_bytes(current, shapes)
        if self.model.backend != "cpu":
            return inmemory / MB
        if self.streamed is not None:
            minimum = self.streamed.min_budget_bytes()
        else:
            minimum = self._stream_minimum_estimate(current, shapes) if current is not None else inmemory
        return min(minimum, inmemory) / MB

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
        inmemory = self.inmemory_bytes(current, shapes)
        measured = self._inmemory_ms.get(signature)
        streamed = self.streamed
        if measured is None and streamed is not None:
            measured = streamed.compute_ms
        if measured is None:  # one frame so far (its set-up included)
            measured = last_latency_ms
        if measured is None:
            return []
        if self.model.backend != "cpu":
            return [(inmemory / MB, measured)]
        if streamed is not None:
            inmemory = max(inmemory, streamed.lowest_level_bytes())  # a level must stay above the minimum
            rows = [row for row in streamed.latency_table(inmemory, measured) if row[0] < inmemory / MB]
        elif current is None:
            rows = []
        else:
            rows = []
            for budget in np.linspace(self._stream_minimum_estimate(current, shapes), inmemory, 8)[:-1]:
                allowance = budget - (inmemory - self.model.weight_bytes)
                rows.append((float(budget) / MB,
                             predict_latency_ms(measured, self.model.weight_bytes, allowance, 0, None)))
        return rows + [(inmemory / MB, measured)]

    def close(self) -> None:
        if self.streamed is not None:
            self.streamed.close()
            self.streamed = None
