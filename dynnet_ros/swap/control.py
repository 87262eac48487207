"""The Engine's memory-budget policy: in memory while the budget allows, swapped weights below.

Kept out of engine.py so the facade only delegates (``Engine.set_memory_budget`` and friends):

* ``None``  -> the backend's normal in-memory executor (but see the next point).
* any budget, cpu backend -> the StreamedExecutor (swap/streamed.py): the planned engine with
  its weights streamed through a window the budget sizes, every weight resident when the budget
  allows. Built once (at construction for ``Engine(swappable=True)``) and kept, ``None``
  included: later budget changes only resize the window.
* ``DYNNET_SWAP_MODE=blocks``, models without the blocked layout, TensorRT: below the in-memory
  estimate the SwappedExecutor (per-block sessions, the look-up table's partition); at or above
  it the in-memory executor.
* a budget below the model's minimum -> ValueError with the reason; nothing changes.

In swap mode the Engine's ``proto`` is replaced by the store's weightless graph, because a
ModelProto holding every weight would itself exceed the budget.
"""
from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Callable

import numpy as np
import onnx

from dynnet_ros.engine.memtrim import release_memory
from dynnet_ros.swap import blocks
from dynnet_ros.swap.delay_model import load_or_default
from dynnet_ros.swap.executor import (ORT_BASE_BYTES, PER_ATOM_FLOOR_BYTES, RUNTIME_SLACK_BYTES, SwappedExecutor, atom_resident_bytes,
                                     overhead_floor_bytes, use_huge_pages)
from dynnet_ros.swap.scheduler import MB, AtomTable, LookupTable, MemoryModel, Scheduler
from dynnet_ros.swap.store import Store, StoreError, ensure_store
from dynnet_ros.swap.streamed import StreamedExecutor, prepare_weight_file

if TYPE_CHECKING:  # pragma: no cover
    from dynnet_ros.engine.engine import Engine

LOG = logging.getLogger(__name__)
#: onnxruntime's per-process environment (~9.5 MB on x86-64, ORT 1.32), for the in-memory estimate.
ESTIMATED_BASE_BYTES = 10 * MB
#: Until the in-memory executor has run at an input size, its latency is predicted as this
#: fraction of the all-resident swapped partition's prediction.  Why: the delay model prices
#: both the same (no I/O), but one whole-graph session avoids per-atom session calls and
#: activation re-faults; measured in-memory/swap@100 % mean latency was 0.70-0.94 over the zoo
#: (docs/swap.md), so 0.9 is the conservative end.
INMEMORY_LATENCY_PRIOR = 0.9
#: A leaner store variant is used only where it lowers the minimum budget by at least this much.
VARIANT_MIN_GAP_BYTES = MB


#: The planned engine's footprint beyond its weights and main arena: onnxruntime's environment,
#: segment sessions, kernel code touched while running, If-branch arenas. Measured at 480x640 on
#: the zoo models: 17.5-29.6 MB (gated, with four planned If branches, is the high end).
PLANNED_BASE_BYTES = 30 * MB


def inmemory_estimate_bytes(weight_bytes: int, act_bytes: int) -> int:
    """What the plain onnxruntime executor holds: the ModelProto's weights, the session's copy,
    activations in its arena and the runtime itself."""
    return 2 * weight_bytes + 2 * act_bytes + ESTIMATED_BASE_BYTES + 8 * MB


def planned_estimate_bytes(weight_bytes: int, arena_bytes: int) -> int:
    """What the planned engine holds: one copy of the weights (read from the model file), its
    arena at the reference shape and ``PLANNED_BASE_BYTES`` (real peaks: 0.77-0.99x this)."""
    return weight_bytes + arena_bytes + PLANNED_BASE_BYTES


def stream_mode() -> bool:
    """Swap by streaming the planned engine's weights (default) or by per-block sessions."""
    mode = os.environ.get("DYNNET_SWAP_MODE", "stream") or "stream"
    if mode not in ("stream", "blocks"):
        raise ValueError(f"DYNNET_SWAP_MODE={mode!r}: choose stream or blocks")
    return mode == "stream"


class SwapControl:
    #: keep the other store variant's executor warm (sessions only) when the budget has room
    keep_warm = os.environ.get("DYNNET_SWAP_KEEP_WARM", "1") != "0"

    def __init__(self, engine: "Engine", create_executor: Callable) -> None:
        self.engine = engine
        self._create_executor = create_executor
        self.stores: dict[str, Store] = {}
        self.swapped: SwappedExecutor | None = None
        #: executors of the other store variant kept warm (sessions only, no weights resident), so
        #: a budget crossing between variants is a table lookup instead of a rebuild
        self.parked: dict[str, SwappedExecutor] = {}
        self.rebuilt_reason: str | None = None
        self._estimates: dict[tuple, LookupTable] = {}
        self._inmemory: int | None = None
        self._original_proto: onnx.ModelProto | None = None
        #: measured in-memory latency (ms, smoothed) per input signature
        self._inmemory_ms: dict = {}
        self._inmemory_seen: set = set()
        self._store_dir = os.environ.get("DYNNET_SWAP_STORE") or None
        self.streamed: StreamedExecutor | None = None
        self._stream_unavailable: str | None = None  # why this model cannot stream (then: blocks)
        self._weight_file = None  # the verified weight file, once a budget asked for streaming

    @property
    def store(self) -> Store | None:
        """The store of the active swapped executor (else the preferred one, if built)."""
        if self.swapped is not None:
            return self.swapped.store
        return self.stores.get(self._levels()[0])

    def _levels(self) -> list[str]:
        """Store variants in order of preference: level-ALL atoms are fastest; "basic" atoms
        allocate less activation memory (no blocked layouts), so they reach lower budgets."""
        if self.engine.backend == "tensorrt":  # TensorRT parses the skeletons: ONNX-domain ops only
            return ["basic"]
        forced = os.environ.get("DYNNET_SWAP_OPTIMIZE")
        return [forced] if forced else ["all", "basic"]

    # ------------------------------------------------------------------ store / estimates
    def _ensure_store(self, level: str | None = None) -> Store:
        level = level or self._levels()[0]
        if level not in self.stores:
            source = self.engine.model_path or self.engine.proto
            directory = self._store_dir
            if directory and level != self._levels()[0]:
                directory = f"{directory}-{level}"
            self.stores[level], reason = ensure_store(source, directory, optimize=level)
            release_memory()  # opening (checksums) or building a store leaves freed heap in RSS
            if reason:
                self.rebuilt_reason = reason
                LOG.warning("swap store for %s rebuilt: %s", self.engine.model_path, reason)
        return self.stores[level]

    def _shapes(self) -> dict | None:
        """The last input shapes the engine ran (the budget tables are per input size)."""
        signature = getattr(self.engine, "_last_signature", None)
        return None if signature is None else {name: tuple(shape) for name, shape in signature}

    def _estimated_table(self, level: str | None = None) -> LookupTable:
        level = level or self._levels()[0]
        shapes = self._shapes()
        key = (level, None if shapes is None else tuple(sorted(shapes.items())))
        if key not in self._estimates:
            store = self._ensure_store(level)
            costs = store.reference_costs() if shapes is None else store.costs_at(shapes)
            table = AtomTable(atom_resident_bytes(store, use_huge_pages(store)), tuple(e.atom.depth for e in store.atoms),
                              costs.flops, costs.act_bytes)
            overhead = overhead_floor_bytes(len(store.atoms)) + RUNTIME_SLACK_BYTES
            self._estimates[key] = LookupTable(Scheduler(table, load_or_default(), MemoryModel(overhead)))
        return self._estimates[key]

    def _table(self, level: str) -> LookupTable:
        """Measured table of the active executor for its level, else the estimate."""
        if self.swapped is not None and self.swapped.store is self.stores.get(level):
            return self.swapped._table(self._shapes() or self.swapped._shapes)[1]
        if level in self.parked:
            return self.parked[level]._table(self._shapes() or self.parked[level]._shapes)[1]
        return self._estimated_table(level)

    def _useful_levels(self) -> list[str]:
        """The preferred variant, plus leaner ones only where they lower the minimum budget by at
        least ``VARIANT_MIN_GAP_BYTES``: a crossing rebuilds or wakes an executor, which is not
        worth a fraction of a MB (lane at 480x640: 0.03 MB apart)."""
        levels = self._levels()
        useful = levels[:1]
        for level in levels[1:]:
            if self._table(level).levels[0] <= self._table(useful[-1]).levels[0] - VARIANT_MIN_GAP_BYTES:
                useful.append(level)
        return useful

    def _level_for(self, budget_bytes: int) -> str:
        """The preferred store variant whose minimum the budget meets (ValueError if none)."""
        levels = self._useful_levels()
        for level in levels:
            if budget_bytes >= self._table(level).levels[0]:
                return level
        lowest = min(levels, key=lambda lv: self._table(lv).levels[0])
        raise ValueError(self._table(lowest).scheduler.below_minimum_message(budget_bytes))

    def inmemory_bytes(self) -> int:
        """Estimated in-memory footprint: from the planned executor's arena plan at the reference
        shape when it exists, else from the graph alone (no store is built). Once weights are
        streamed: that executor's measured footprint with every weight resident."""
        if self.streamed is not None:
            return self.streamed.inmemory_bytes()
        if self._inmemory is None:
            planned = self._planned_arena_bytes()
            if planned is not None:
                self._inmemory = planned_estimate_bytes(self.engine.weight_bytes, planned)
                return self._inmemory
            if self.store is not None:
                act = max(self.store.reference_costs().act_bytes)
            else:
                graph = self.engine.proto
                shapes = blocks.reference_shapes(graph)
                act = max(blocks.atom_costs(graph, blocks.split(graph, max_atoms=1, input_shapes=shapes),
                                            shapes).act_bytes)
            self._inmemory = inmemory_estimate_bytes(self.engine.weight_bytes, act)
        return self._inmemory

    def _planned_arena_bytes(self) -> int | None:
        """The in-memory planned executor's arena height at the reference input shape, if it runs."""
        executor = getattr(self.engine, "_executor", None)
        if executor is None or not hasattr(executor, "plan_for"):
            return None
        try:
            return int(executor.plan_for(self._shapes() or blocks.reference_shapes(self.engine.proto)).height)
        except (ValueError, KeyError):
            return None

    # ------------------------------------------------------------------ policy
    def apply(self, budget_mb: float | None, current):
        """Return the executor for ``budget_mb`` (closing ``current`` if replaced).

        Raises ValueError before anything changes when the budget cannot be met.
        """
        wants_stream = budget_mb is not None or self.streamed is not None or \
            (current is None and getattr(self.engine, "swappable", False))
        if self._streaming() and wants_stream:
            streamed = self._apply_stream(None if budget_mb is None else int(budget_mb * MB), current)
            if streamed is not None:
                return streamed
        if budget_mb is None or budget_mb * MB >= self.inmemory_bytes():
            self._close_parked()
            if self.swapped is None:
                if current is None:  # Engine built with a budget: first executor
                    return self._create_executor(self.engine.backend, self.engine.proto, threads=self.engine.threads)
                return current
            proto = self._full_proto()
            executor = self._create_executor(self.engine.backend, proto, threads=self.engine.threads)
            self.swapped.close()
            self.swapped = None
            return executor
        if budget_mb * MB < self.inmemory_bytes() <= self._swapped_minimum_bytes():
            raise ValueError(f"memory budget {budget_mb:.1f} MB is below this model's minimum "
                             f"{self.inmemory_bytes() / MB:.1f} MB (in memory; swapped blocks would need "
                             f"{self._swapped_minimum_bytes() / MB:.1f} MB)")
        if self.engine.backend != "cpu":
            raise ValueError(f"memory budgets below the in-memory footprint need block swapping, which this "
                             f"version runs on the cpu backend only (backend is '{self.engine.backend}')")
        level = self._level_for(int(budget_mb * MB))
        store = self._ensure_store(level)
        if self.swapped is not None and self.swapped.store is store:
            self._set_budget(self.swapped, budget_mb, keep=self.parked)
            return self.swapped
        swapped = self.parked.pop(level, None)
        built = swapped is None
        if not built and self._shapes():
            swapped._shapes = self._shapes()  # parked at an older input size: plan for the current one
        if built:
            swapped = SwappedExecutor(store, budget_mb=None, threads=self.engine.threads, shapes=self._shapes())
        # the executor being replaced may stay warm next to the new one if the budget has room for it
        previous = self.swapped if self.swapped is not None else current
        keep = dict(self.parked)
        if isinstance(previous, SwappedExecutor) and self.keep_warm:
            keep[self._level_of(previous)] = previous
        try:
            kept = self._set_budget(swapped, budget_mb, keep=keep)
        except ValueError:
            if built:
                swapped.close()
            else:
                self.parked[level] = swapped
            raise
        for lv, executor in keep.items():
            if lv in kept:
                executor.pipeline.drain(cancel=True)  # a prefetch must not land after the release
                executor.pipeline.release(sorted(executor.pipeline.resident_atoms()))  # sessions only
            else:
                executor.close()
        self.parked = kept
        if previous is not None and all(previous is not e for e in keep.values()):
            previous.close()  # the in-memory executor, or a swapped one not kept warm
        self.swapped = swapped
        if not self.engine.model_path and self._original_proto is None:
            # An in-memory ModelProto holds every weight, which the budget cannot afford twice: the
            # engine keeps the weightless graph; the caller's proto is kept for a return to memory.
            self._original_proto = self.engine.proto
            self.engine.proto = store.graph()
        return swapped

    # ------------------------------------------------------------------ streamed weights
    def _streaming(self) -> bool:
        return self.engine.backend == "cpu" and self._stream_unavailable is None and stream_mode()

    def _apply_stream(self, budget: int | None, current):
        """The streamed executor at ``budget`` (None: every weight resident); None if this model
        cannot stream (the block path takes over). ValueError below the minimum, budget unchanged.

        Built on the first budget and kept from then on, whatever the budget: a change is a
        window resize, never a rebuild. The executor it replaces is closed *first*, so the
        measured footprint is the streamed engine's, not two engines' side by side."""
        if self.streamed is not None:
            self.streamed.set_budget(budget)  # ValueError: the window stays as it was
            return self.streamed
        weights = self._weight_file
        if weights is None:  # before anything is closed: can this model stream at all (layout, weight file)?
            try:
                weights, rebuilt = prepare_weight_file(self.engine.proto)
            except (ValueError, OSError, StoreError) as exc:
                self._stream_unavailable = str(exc)
                LOG.warning("weights of %s cannot be streamed (%s); swapping per-block sessions instead",
                            self.engine.model_path or "this model", exc)
                return None
            if rebuilt:
                self.rebuilt_reason = rebuilt
                LOG.warning("weight file of %s rebuilt: %s", self.engine.model_path, rebuilt)
            self._weight_file = weights  # verified once (its checksums read 50 MB for depth), not per attempt
        # a working in-memory executor is only given up for a budget that can plausibly be met
        estimate = self._stream_minimum_estimate() if current is not None else 0
        if budget is not None and budget < estimate:
            raise ValueError(f"memory budget {budget / MB:.1f} MB is below this model's minimum, estimated "
                             f"{estimate / MB:.1f} MB (weights of its largest step + the engine without weights)")
        for executor in (current, self.swapped):
            if executor is not None:
                executor.close()
        self.swapped = None
        self._close_parked()
        release_memory()
        try:
            streamed = StreamedExecutor(self.engine.proto, threads=self.engine.threads, weights=weights,
                                        baseline_rss=self.engine.baseline_rss,
                                        external_bytes=lambda: getattr(self.engine, "external_bytes", 0))
        except (ValueError, OSError) as exc:  # unexpected after the checks above: back to memory
            self.engine._executor = self._create_executor(self.engine.backend, self._full_proto(),
                                                          threads=self.engine.threads)
            raise ValueError(f"the streamed executor could not be built: {exc}") from exc
        self.streamed = streamed
        streamed.calibrate(self._shapes() or blocks.reference_shapes(self.engine.proto))
        try:
            streamed.set_budget(budget)
        except ValueError:
            # the executor it replaced is gone: this one runs under the budget that was in force
            previous = self.engine.memory_budget_mb
            try:
                streamed.set_budget(None if previous is None else int(previous * MB))
            except ValueError:
                streamed.set_budget(None)
            self.engine._executor = streamed
            raise
        return streamed

    def _stream_minimum_estimate(self) -> int:
        """Before the streamed executor exists, a low estimate of its minimum: the arena at the
        reference shape, onnxruntime's environment and the largest weight one step needs (FC
        weights split to 1/8 of all weights). Budgets below it are refused without a build."""
        from dynnet_ros.swap.streamed import split_bytes_for

        sizes = sorted(int(np.prod(t.dims, dtype=np.int64)) * 4 for t in self.engine.proto.graph.initializer)
        split = split_bytes_for(self.engine.weight_bytes)
        step = min(sizes[-1], max(split, sizes[-2] if len(sizes) > 1 else 0)) if sizes else 0
        return self.inmemory_bytes() - self.engine.weight_bytes - PLANNED_BASE_BYTES + ESTIMATED_BASE_BYTES + step

    def _level_of(self, executor: SwappedExecutor) -> str:
        return next(lv for lv, st in self.stores.items() if st is executor.store)

    @staticmethod
    def _warm_cost_bytes(executor: SwappedExecutor) -> int:
        """What a parked executor holds: its sessions and skeletons (weights released).  The
        process-wide onnxruntime environment, part of the first executor's measured overhead,
        stays whether or not the executor is kept, so it is not charged here."""
        return max(executor.measured_overhead_bytes - ORT_BASE_BYTES, PER_ATOM_FLOOR_BYTES * len(executor.atoms))

    def _set_budget(self, executor: SwappedExecutor, budget_mb: float,
                    keep: dict[str, SwappedExecutor]) -> dict[str, SwappedExecutor]:
        """Apply ``budget_mb`` to ``executor`` minus what the warm executors in ``keep`` hold.

        Returns the warm executors that still fit; the others are left for the caller (or, for
        an in-place change, closed here).  Raises ValueError if even alone it cannot fit.
        """
        kept = dict(keep)
        while True:
            reserve = sum(self._warm_cost_bytes(e) for e in kept.values()) / MB
            try:
                executor.set_budget(budget_mb - reserve)
                break
            except ValueError:
                if not kept:
                    raise
                kept.popitem()  # no room to keep the sibling warm at this budget
        if keep is self.parked:  # in-place change: close what no longer fits
            for lv in [lv for lv in self.parked if lv not in kept]:
                self.parked.pop(lv).close()
        return kept

    def _close_parked(self) -> None:
        for executor in self.parked.values():
            executor.close()
        self.parked = {}

    def _full_proto(self) -> onnx.ModelProto:
        from dynnet_ros.engine.model_io import load_model

        if self.engine.model_path and os.path.isfile(self.engine.model_path):
            try:
                from dynnet_ros.engine.backends import load_for_backend
            except ImportError:  # older registry: the full model
                return load_model(self.engine.model_path)
            return load_for_backend(self.engine.backend, self.engine.model_path)
        proto, self._original_proto = self._original_proto, None
        self.engine.proto = proto
        return proto

    # ------------------------------------------------------------------ reporting
    def min_budget_mb(self) -> float:
        """The smaller of the swapped minimum and the in-memory footprint (a lean model may need
        less in memory than its swapped blocks' runtime floor)."""
        if self._streaming():
            minimum = self.streamed.min_budget_bytes() if self.streamed is not None else self._stream_minimum_estimate()
            return min(minimum, self.inmemory_bytes()) / MB
        return min(self._swapped_minimum_bytes(), self.inmemory_bytes()) / MB

    def _swapped_minimum_bytes(self) -> int:
        return min(self._table(level).levels[0] for level in self._useful_levels())

    def observe_run(self, latency_ms: float) -> None:
        """Record a frame's latency; in-memory frames calibrate the table's in-memory level."""
        if self.swapped is not None or self.streamed is not None:
            return
        key = getattr(self.engine, "_last_signature", None)
        if key not in self._inmemory_seen:  # the first run at a size pays one-off set-up: not a sample
            self._inmemory_seen.add(key)
            return
        old = self._inmemory_ms.get(key)
        self._inmemory_ms[key] = latency_ms if old is None else 0.8 * old + 0.2 * latency_ms

    def latency_table(self) -> list[tuple[float, float]]:
        """Budget levels of the fastest variant, extended below its minimum by the leaner one,
        and topped by the in-memory level (its footprint estimate; measured latency once it ran,
        else ``INMEMORY_LATENCY_PRIOR`` x the all-resident swapped prediction)."""
        if self._streaming():
            return self._stream_latency_table()
        levels = self._useful_levels()
        tables = [self._table(level) for level in levels]
        rows = list(tables[0].latency_table())
        for table in tables[1:]:
            floor = rows[0][0] if rows else float("inf")
            rows = [row for row in table.latency_table() if row[0] < floor] + rows
        inmemory_mb = self.inmemory_bytes() / MB
        measured = self._inmemory_ms.get(getattr(self.engine, "_last_signature", None))
        top_ms = rows[-1][1] if rows else measured
        inmemory_ms = measured if measured is not None else INMEMORY_LATENCY_PRIOR * top_ms
        rows = [row for row in rows if row[0] < inmemory_mb]
        rows.append((inmemory_mb, inmemory_ms))
        return rows

    def _stream_latency_table(self) -> list[tuple[float, float]]:
        """Predicted latency from the minimum up to the in-memory level (streamed executor's
        measured compute time and read rate once it ran; before, the in-memory latency)."""
        from dynnet_ros.swap.streamed import predict_latency_ms

        inmemory = self.inmemory_bytes()
        measured = self._inmemory_ms.get(getattr(self.engine, "_last_signature", None))
        if self.streamed is not None and self.streamed.compute_ms is not None:
            measured = measured if measured is not None else self.streamed.compute_ms
        if measured is None:  # one frame so far (its set-up included)
            measured = getattr(self.engine, "_last_latency_ms", None)
        if measured is None:
            return []
        if self.streamed is not None:
            inmemory = max(inmemory, self.streamed.lowest_level_bytes())  # a level must stay above the minimum
            rows = [row for row in self.streamed.latency_table(inmemory, measured) if row[0] < inmemory / MB]
        else:
            rows = []
            for budget in np.linspace(self._stream_minimum_estimate(), inmemory, 8)[:-1]:
                allowance = budget - (inmemory - self.engine.weight_bytes)
                rows.append((float(budget) / MB,
                             predict_latency_ms(measured, self.engine.weight_bytes, allowance, 0, None)))
        return rows + [(inmemory / MB, measured)]

    def stats(self) -> dict:
        if self.streamed is not None:
            info = self.streamed.engine_stats()
            return {"blocks": info["blocks"], "resident_weight_bytes": info["resident_weight_bytes"],
                    "swap": info["swap"]}
        if self.swapped is None:
            return {"swap": None}
        info = {**self.swapped.stats(), "warm_variants": sorted(self.parked),
                "warm_bytes": sum(self._warm_cost_bytes(e) for e in self.parked.values())}
        return {"blocks": info["blocks"], "resident_weight_bytes": info["resident_weight_bytes"], "swap": info}

    def close(self) -> None:
        self._close_parked()
        if self.streamed is not None:
            self.streamed.close()
            self.streamed = None
        if self.swapped is not None:
            self.swapped.close()
            self.swapped = None
