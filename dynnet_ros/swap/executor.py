"""SwappedExecutor: the executor protocol (engine/backends/base.py) over a block store.

Built once per model: one weightless onnxruntime session per atom, bound by reference to fixed
arena addresses.  Per input size it keeps a partition look-up table; a budget change is a
table lookup plus dropping the pages of blocks that are no longer pinned.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict
from typing import Mapping

import numpy as np
import psutil

from dynnet_ros.engine.memtrim import pin_mmap_threshold
from dynnet_ros.swap import blocks
from dynnet_ros.swap.assembly import OrtAtom
from dynnet_ros.swap.delay_model import DelayModel, load_or_default
from dynnet_ros.swap.graphinfo import fixed_input_model, infer_shapes
from dynnet_ros.swap.pipeline import BlockPipeline, RunTrace
from dynnet_ros.swap.scheduler import MB, AtomTable, LookupTable, MemoryModel, Scheduler
from dynnet_ros.swap.store import Store
from dynnet_ros.swap.swapin import HostArena, WeightReader, arena_layout, huge_pages_available, resident_bytes

LOG = logging.getLogger(__name__)

#: Allocations at or above this size are mmapped by glibc and returned to the OS on free.
MMAP_THRESHOLD = 256 * 1024
#: Headroom for what onnxruntime allocates per run outside our estimates (kernel scratch).
RUNTIME_SLACK_BYTES = 4 * MB
#: onnxruntime's per-process environment (kernel registries, thread pools: ~9.5 MB measured on
#: x86-64, ORT 1.32) is part of what loading a model costs a process, and each weightless atom
#: session ~0.15 MB.  Used as a floor because measured growth under-reads when the runtime was
#: already up or the process just freed memory.
ORT_BASE_BYTES = 10 * MB
PER_ATOM_FLOOR_BYTES = MB // 4


def overhead_floor_bytes(atoms: int) -> int:
    return ORT_BASE_BYTES + atoms * PER_ATOM_FLOOR_BYTES


def use_huge_pages(store: Store) -> bool:
    return store.weights_bytes >= HUGE_PAGE_MIN_WEIGHTS and huge_pages_available()


def atom_resident_bytes(store: Store, huge_pages: bool) -> tuple[int, ...]:
    """What each atom adds to RSS while resident (its aligned span, huge-page rounded)."""
    return tuple(resident_bytes(e.span_bytes, huge_pages) for e in store.atoms)
#: Huge-page arenas pay up to 2 MiB of rounding per resident atom; worth it for large models only.
HUGE_PAGE_MIN_WEIGHTS = 16 * MB


def rss_bytes() -> int:
    return psutil.Process().memory_info().rss


class SwappedExecutor:
    """Runs a model from its block store inside a memory budget."""

    name = "swap"

    def __init__(self, store: Store, *, budget_mb: float | None, threads: int | None = None,
                 resident_limit: int = 2, delay: DelayModel | None = None, prefer_direct: bool = True,
                 act_factor: float = 1.1, lut_levels: int = 24, naive: bool = False,
                 shapes: Mapping[str, tuple[int, ...]] | None = None, huge_pages: bool | None = None,
                 stream: bool | None = None, bind_outputs: bool | None = None) -> None:
        if resident_limit < 1:
            raise ValueError(f"resident_limit must be >= 1, got {resident_limit}")
        self.store = store
        self.resident_limit = resident_limit
        self.delay = delay or load_or_default()
        self.act_factor = act_factor
        self.lut_levels = lut_levels
        self.naive = naive
        # streamed prefetch (scheduler.ahead_limits); DYNNET_SWAP_STREAM=0 turns it off
        self.stream = os.environ.get("DYNNET_SWAP_STREAM", "1") != "0" if stream is None else stream
        # atom outputs into huge-page arrays via IOBinding; DYNNET_SWAP_BIND_OUTPUTS=0 turns it off
        self.bind_outputs = os.environ.get("DYNNET_SWAP_BIND_OUTPUTS", "1") != "0" \
            if bind_outputs is None else bind_outputs
        self._output_specs: OrderedDict[tuple, list[dict | None]] = OrderedDict()
        self._run_specs: list[dict | None] | None = None
        self._lock = threading.RLock()
        self._graph_inputs = list(store.index["reference_shapes"])
        self._outputs = [o.name for o in store.graph().graph.output]
        pin_mmap_threshold(MMAP_THRESHOLD)  # activations freed after each atom must leave RSS
        before = rss_bytes()
        entries = store.atoms
        self.huge_pages = use_huge_pages(store) if huge_pages is None else huge_pages
        self.arena_offsets, arena_size = arena_layout([e.span_bytes for e in entries], self.huge_pages)
        self.arena = HostArena(arena_size, huge_pages=self.huge_pages)
        self.arena.advise_spans(self.arena_offsets, [e.span_bytes for e in entries])
        self.reader = WeightReader(store.weights_path, prefer_direct=prefer_direct)
        last_reader: dict[str, int] = {}
        for entry in entries:
            for name in entry.atom.inputs:
                last_reader[name] = entry.atom.index
        self.pipeline = BlockPipeline(entries, self.arena, self.reader, last_reader, set(self._outputs),
                                      self.arena_offsets)
        self.atoms: list[OrtAtom] = []
        start = time.perf_counter()
        for entry in entries:
            # Weights are present while the session is created (nothing sees zeros), then dropped:
            # the session keeps only pointers, so dropping the pages costs it nothing.
            self.pipeline.load([entry.atom.index])
            self.atoms.append(OrtAtom(store, entry, self.arena, threads=threads,
                                      arena_offset=self.arena_offsets[entry.atom.index]))
            self.pipeline.release([entry.atom.index])
        self.assembly_seconds = time.perf_counter() - start
        self.measured_overhead_bytes = rss_bytes() - before
        self.overhead_bytes = max(overhead_floor_bytes(len(self.atoms)), self.measured_overhead_bytes) \
            + RUNTIME_SLACK_BYTES
        self._tables: OrderedDict[tuple, tuple[Scheduler, LookupTable, tuple[int, ...]]] = OrderedDict()
        self._shapes = {k: tuple(v) for k, v in (shapes or store.index["reference_shapes"]).items()}
        self._budget_bytes = 0
        self._unbounded = False
        self.partition: blocks.Partition | None = None
        self.switch_ms: list[float] = []
        self.last_trace: RunTrace | None = None
        self._warned: set[tuple] = set()
        self.set_budget(budget_mb)

    # ------------------------------------------------------------------ scheduling
    def _table(self, shapes: Mapping[str, tuple[int, ...]]) -> tuple[Scheduler, LookupTable, tuple[int, ...]]:
        key = tuple(sorted((k, tuple(v)) for k, v in shapes.items()))
        hit = self._tables.get(key)
        if hit is not None:
            self._tables.move_to_end(key)
            return hit
        reference = {k: tuple(v) for k, v in self.store.index["reference_shapes"].items()}
        costs = self.store.reference_costs() if dict(shapes) == reference else self.store.costs_at(dict(shapes))
        table = AtomTable(atom_resident_bytes(self.store, self.huge_pages),
                          tuple(e.atom.depth for e in self.store.atoms), costs.flops, costs.act_bytes)
        scheduler = Scheduler(table, self.delay, MemoryModel(self.overhead_bytes, self.act_factor),
                              resident_limit=self.resident_limit, stream=self.stream)
        entry = (scheduler, LookupTable(scheduler, self.lut_levels), costs.flops)
        self._tables[key] = entry
        while len(self._tables) > 16:
            self._tables.popitem(last=False)
        return entry

    def _choose(self, scheduler: Scheduler, lut: LookupTable, budget: int) -> blocks.Partition:
        partition = scheduler.naive(budget) if self.naive else lut.lookup(budget)
        return blocks.Partition(partition.bounds, partition.pinned, partition.predicted_ms,
                                partition.predicted_peak_bytes, partition.resident_limit, wrap=partition.wrap,
                                ahead=partition.ahead).build([e.atom for e in self.store.atoms])

    def set_budget(self, budget_mb: float | None) -> None:
        """Switch to the budget's partition; ValueError (previous budget kept) if it cannot fit.

        None means "everything resident" (the table's top level).
        """
        start = time.perf_counter()
        with self._lock:
            scheduler, lut, _ = self._table(self._shapes)
            budget = lut.levels[-1] if budget_mb is None else int(float(budget_mb) * MB)
            partition = self._choose(scheduler, lut, budget)  # raises before anything changes
            self._budget_bytes = budget
            self._unbounded = budget_mb is None
            self.partition = partition
            self.pipeline.apply(partition)
        self.switch_ms.append((time.perf_counter() - start) * 1e3)
        del self.switch_ms[:-256]

    def min_budget_mb(self, shapes: Mapping[str, tuple[int, ...]] | None = None) -> float:
        with self._lock:
            return self._table(shapes or self._shapes)[0].min_budget_bytes() / MB

    def latency_table(self, shapes: Mapping[str, tuple[int, ...]] | None = None) -> list[tuple[float, float]]:
        with self._lock:
            return self._table(shapes or self._shapes)[1].latency_table()

    # ------------------------------------------------------------------ executor protocol
    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        shapes = {name: tuple(int(d) for d in value.shape) for name, value in feeds.items()}
        with self._lock:
            if shapes != self._shapes:
                scheduler, lut, _ = self._table(shapes)
                if self._unbounded:
                    self._budget_bytes = lut.levels[-1]
                partition = self._choose(scheduler, lut, max(self._budget_bytes, scheduler.min_budget_bytes()))
                if self._budget_bytes < scheduler.min_budget_bytes():
                    # once per (input size, budget) at WARNING; the camera cycling back is DEBUG
                    state = (tuple(sorted(shapes.items())), self._budget_bytes)
                    level = logging.DEBUG if state in self._warned else logging.WARNING
                    self._warned.add(state)
                    LOG.log(level, "input %s needs %.1f MB, above the %.1f MB budget; running with the "
                            "smallest partition", shapes, scheduler.min_budget_bytes() / MB,
                            self._budget_bytes / MB)
                self._shapes = shapes
                self.partition = partition
                self.pipeline.apply(partition)
            _, _, flops = self._table(shapes)
            self._run_specs = self._specs_for(shapes)
            trace = RunTrace()
            env = self.pipeline.run(self.partition, feeds, self._run_atom, trace, flops)
            self.last_trace = trace
        return {name: env[name] for name in self._outputs}

    def _run_atom(self, index: int, env: dict) -> dict:
        specs = self._run_specs[index] if self._run_specs is not None else None
        if specs is None:
            return self.atoms[index].run(env)
        try:
            return self.atoms[index].run(env, specs)
        except Exception as exc:  # noqa: BLE001 - inferred shapes wrong for this atom: let ORT allocate
            LOG.debug("atom %d: bound outputs refused (%s); onnxruntime allocates them", index, exc)
            self._run_specs[index] = None
            return self.atoms[index].run(env)

    def _specs_for(self, shapes: Mapping[str, tuple[int, ...]]) -> list[dict | None] | None:
        """Per atom, every output's (shape, dtype) at these input sizes, or None for an atom with
        an output whose shape only execution reveals (it then allocates its own outputs)."""
        if not self.bind_outputs:
            return None
        key = tuple(sorted((k, tuple(v)) for k, v in shapes.items()))
        hit = self._output_specs.get(key)
        if hit is not None:
            self._output_specs.move_to_end(key)
            return hit
        try:
            table = infer_shapes(fixed_input_model(self.store.graph(), dict(shapes)))
        except Exception as exc:  # noqa: BLE001 - shape inference refused: let onnxruntime allocate
            LOG.debug("no output shapes for %s: %s", shapes, exc)
            table = {}
        specs: list[dict | None] = []
        for entry in self.store.atoms:
            atom_specs: dict | None = {}
            for name in entry.atom.outputs:
                shape, dtype = table.get(name, (None, None))
                if shape is None or any(d is None or d <= 0 for d in shape):
                    atom_specs = None
                    break
                atom_specs[name] = (tuple(int(d) for d in shape), np.dtype(dtype))
            specs.append(atom_specs)
        self._output_specs[key] = specs
        while len(self._output_specs) > 16:
            self._output_specs.popitem(last=False)
        return specs

    def stats(self) -> dict:
        partition = self.partition
        return {
            "blocks": partition.count if partition else None,
            "atoms": len(self.atoms),
            "partition": list(partition.bounds) if partition else None,
            "pinned_blocks": sum(partition.pinned) if partition else 0,
            "resident_limit": partition.resident_limit if partition else self.resident_limit,
            "wrap_prefetch": partition.wrap if partition else False,
            "streamed": bool(partition and partition.ahead is not None),
            "resident_weight_bytes": self.pipeline.resident_bytes(),
            "weight_bytes": self.store.weights_bytes,
            "predicted_ms": partition.predicted_ms if partition else None,
            "predicted_peak_bytes": partition.predicted_peak_bytes if partition else None,
            "overhead_bytes": self.overhead_bytes,
            "measured_overhead_bytes": self.measured_overhead_bytes,
            "budget_bytes": self._budget_bytes,
            "io_mode": self.reader.mode.value,
            "huge_pages": self.huge_pages,
            "io_reason": self.reader.reason,
            "store": str(self.store.path),
            "optimized": self.store.index.get("optimized"),
            "switch_ms_last": self.switch_ms[-1] if self.switch_ms else None,
        }

    def close(self) -> None:
        with self._lock:
            self.pipeline.close()
            for atom in self.atoms:
                atom.close()
            self.atoms = []
            self.reader.close()
            self.arena.close()
