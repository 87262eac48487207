"""The planned engine with its weights swapped: same segments, same arena, weights streamed.

Why the planned engine's own weights: it already holds activations in one planned arena, and
swapping only its weights keeps that, so a budget of "in-memory peak - 75 % of the weights"
leaves exactly 25 % of the weights' room for the window. The same window runs over either
layout the planned engine uses: onnxruntime's blocked (NCHWc) rewrite where the CPU has those
kernels, the model as given elsewhere (ARM, models without convolutions).

How (SwapNet §4-5 on CPU):
* weights: swap/weight_file.py writes them 4 KiB-aligned (large FC weights split by columns);
* memory: one private anonymous region the size of the file, one OrtValue view per tensor,
  given to every segment session by ``add_initializer`` (by reference; prepacking off);
* swap-in: ``O_DIRECT`` reads into the tensor's own place (fallback: ``pread`` +
  ``POSIX_FADV_DONTNEED``); swap-out: ``MADV_DONTNEED`` — no page-cache copy, no write-back;
* schedule: swap/residency.py streams tensors in order of use, as far ahead as the budget's
  weight allowance allows, pinning the latest-used ones when there is room to spare.

The budget bounds what this engine holds: its resident weights (counted exactly) plus what
it holds besides them at the input shapes it runs (arena, sessions, onnxruntime's runtime),
measured once per model and shapes in a clean child process (swap/footprint.py). The weight
allowance is the budget minus that and a margin. A budget change is a window resize (no
session is rebuilt).

A frame at an input size not run before is judged before it runs: its footprint there is
measured (once per size), the window re-sized to hold the budget, and where the budget is below
the minimum at that size, ``over_budget`` decides: "raise" refuses the frame (BudgetExceeded),
"run" runs it in the smallest window and reports the overshoot (``WindowStats.over_budget``).
"""
from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import tempfile
import time

import numpy as np
import onnxruntime as ort

from dynnet_ros.bytesize import MB
from dynnet_ros.engine.modelio import onnx_proto
from dynnet_ros.engine.modelio.loader import load_skeleton, source_path
from dynnet_ros.engine.modelio.model_check import file_digest
from dynnet_ros.engine.modelio.onnx_proto import ModelProto, tensor_dtype_to_np_dtype
from dynnet_ros.engine.plan.graph import all_graphs
from dynnet_ros.engine.plan.layout import laid_out_skeleton
from dynnet_ros.engine.plan.options import PlannerOptions, plan_profile
from dynnet_ros.engine.runtime.base import OVER_BUDGET_POLICIES, BudgetExceeded, ExecutorStats, OverBudget, WindowStats
from dynnet_ros.engine.runtime.executor import PlannedExecutor
from dynnet_ros.memtrim import release_memory
from dynnet_ros.swap.footprint import Footprint, Shapes, load_or_measure, shapes_key
from dynnet_ros.swap.residency import WeightWindow
from dynnet_ros.swap.swapin import HostArena, WeightReader, arena_layout, huge_pages_available
from dynnet_ros.swap.weight_file import LAYOUTS, WeightFile, ensure_weight_file

LOG = logging.getLogger(__name__)
#: split FC weights to at most this fraction of all weights (a 25 % budget holds two pieces)
SPLIT_FRACTION = 1 / 8
MIN_SPLIT_BYTES = MB
DEFAULT_READ_MB_S = 800.0  # O_DIRECT read rate on this class of VM (dd, 4 MiB blocks)


def prepare_weight_file(model: ModelProto, layout: str = "nchwc",
                        store_root: str | os.PathLike | None = None) -> tuple[WeightFile, str | None]:
    """The verified weight file of ``model`` (built if missing), and why it was rebuilt (None if
    it was current).

    ``layout="nchwc"``: the weights of onnxruntime's blocked-layout rewrite where this CPU has its
    kernels, else (ARM, a model without convolutions, a rewrite that fails) of the model as
    given; ``"as-given"``: always the model as given. ``model`` is a skeleton from
    ``load_skeleton`` or a full in-memory model (written to a temporary file for the build)."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r} ({' | '.join(LAYOUTS)})")
    if layout == "nchwc":
        try:
            laid_skeleton, laid = laid_out_skeleton(model)
        except (ValueError, OSError, subprocess.SubprocessError) as exc:
            LOG.info("NCHWc layout not used for this model (%s); streaming the model as given", exc)
        else:
            total = sum(int(np.prod(t.dims, dtype=np.int64)) * 4 for g in all_graphs(laid_skeleton.graph)
                        for t in g.initializer)
            del laid_skeleton
            return ensure_weight_file(laid.path, source_key=laid.path.parent.name, layout="nchwc",
                                      split_bytes=split_bytes_for(total), root=store_root)
    total = sum(int(np.prod(t.dims, dtype=np.int64)) * 4 for g in all_graphs(model.graph) for t in g.initializer)
    source = source_path(model)
    with tempfile.TemporaryDirectory() as work:
        if source is None:
            source = os.path.join(work, "model.onnx")
            onnx_proto.save(model, source)
        return ensure_weight_file(source, source_key=file_digest(source), layout="as-given",
                                  split_bytes=split_bytes_for(total), root=store_root)


def split_bytes_for(weight_bytes: int) -> int:
    """The largest FC piece for a model with ``weight_bytes`` of weights."""
    return max(MIN_SPLIT_BYTES, int(weight_bytes * SPLIT_FRACTION))


def prepare(path: str | os.PathLike, layout: str = "nchwc") -> WeightFile:
    """Build ``path``'s weight file ahead of serving (``dynnet zoo build``, ``dynnet swap
    prepare``). ValueError for a model that cannot be loaded."""
    return prepare_weight_file(load_skeleton(path), layout)[0]


def predict_latency_ms(compute_ms: float, weight_bytes: int, allowance: float, need: int,
                       read_mb_s: float | None) -> float:
    """Frame latency when ``allowance`` bytes of weights may be resident: the compute time plus
    the reads of what is not pinned, of which half the compute time hides (the window reads
    ahead while early layers run; measured stalls on the zoo: docs/swap.md)."""
    if allowance >= weight_bytes:
        return compute_ms
    pinned = max(0.0, allowance - 2 * need)
    read_ms = (weight_bytes - pinned) / MB / (read_mb_s or DEFAULT_READ_MB_S) * 1e3
    return compute_ms + max(0.0, read_ms - 0.5 * compute_ms)


class StreamedExecutor:
    """BudgetedExecutor (see runtime.base): the planned engine with its weights streamed."""

    name = "swap"

    def __init__(self, model: ModelProto | None = None, *, threads: int | None = None,
                 store_root: str | os.PathLike | None = None, layout: str = "nchwc",
                 weights: WeightFile | None = None, rebuilt_reason: str | None = None,
                 over_budget: str = "run") -> None:
        """``model``: found or built into a weight file unless ``weights`` (its verified weight
        file) is given, with ``rebuilt_reason`` why it was rebuilt; ``layout``: see
        ``prepare_weight_file``; ``store_root``: the swap cache (weight files, calibrations).
        Budgets are judged once ``calibrate`` named the input shapes. ``over_budget``: what a frame
        whose input size needs more than the budget does ("raise" | "run", see the module docstring)."""
        if over_budget not in OVER_BUDGET_POLICIES:
            raise ValueError(f"over_budget must be one of {OVER_BUDGET_POLICIES}, got {over_budget!r}")
        self.over_budget = over_budget
        if weights is None:
            if model is None:
                raise ValueError("a model or its weight file is needed")
            weights, rebuilt_reason = prepare_weight_file(model, layout, store_root)
        self.file, self.rebuilt_reason = weights, rebuilt_reason
        self._threads = threads
        self._store_root = store_root
        self.split_bytes = int(self.file.index["split_bytes"])
        graph = self.file.graph()
        # big tensors' whole 2 MiB units in huge pages (direct reads 2-3x cheaper than into 4 KiB
        # pages), everything else 4 KiB pages so RSS follows the window byte for byte
        tensors = sorted(self.file.tensors.values(), key=lambda t: t.offset)
        huge = huge_pages_available()
        offsets, region_size = arena_layout([t.span for t in tensors], huge)
        self.places = {t.name: offset for t, offset in zip(tensors, offsets)}
        self.region = HostArena(region_size, huge_pages=huge)
        self.region.advise_spans(offsets, [t.span for t in tensors])
        self.reader = WeightReader(self.file.weights_path)
        self._values = self._views(graph)
        # Rewrites that fold weights (BatchNormalization into a convolution, onnxruntime's
        # fusions, NCHWc reorders) would make new tensors the sessions own, outside the window:
        # the blocked graph has onnxruntime's full rewrite baked in already, so its segments run
        # at the basic level; the model as given runs unoptimised, its BatchNormalizations as ops.
        blocked = self.file.layout == "nchwc"
        options = PlannerOptions(threads=threads, optimization_level="basic" if blocked else "disabled",
                                 fold_weights=blocked, nchwc_max_bytes=0, layout=self.file.layout, versions=False,
                                 shared_weights=self._values, max_segment_weight_bytes=self.split_bytes,
                                 **plan_profile())
        self.planned = PlannedExecutor.from_model(graph, options)
        spans = {name: (t.offset, t.span, self.places[name]) for name, t in self.file.tensors.items()}
        self.window = WeightWindow(self.region, self.reader, spans, self.planned.segment_weight_names())
        self.planned.segment_hook = self
        self._calibrations: dict[str, Footprint] = {}
        self.control_values: dict[str, list] = {}  # what calibration feeds to small integer inputs (budget_policy.py)
        self._cal: Footprint | None = None  # at the input shapes in force
        self._shapes_key: str | None = None
        self._pending_shapes: Shapes | None = None  # last run's shapes, measured on demand
        self._warned: set[str] = set()
        self._over: OverBudget | None = None  # the input size in force needs more than the budget
        self._over_frames = 0
        self._budget: int | None = None
        self._latency_ms: float | None = None
        self._compute_ms: float | None = None
        self._closed = False

    def _views(self, graph: ModelProto) -> dict[str, ort.OrtValue]:
        arena = self.region.array
        if arena is None:
            raise RuntimeError("the weight arena is closed")
        values = {}
        for g in all_graphs(graph.graph):
            for tensor in g.initializer:
                entry = self.file.tensors.get(tensor.name)
                if entry is None or tensor.name in values:
                    continue
                dtype = np.dtype(tensor_dtype_to_np_dtype(tensor.data_type))
                where = self.places[tensor.name]
                view = arena[where:where + entry.nbytes].view(dtype).reshape(tuple(tensor.dims))
                values[tensor.name] = ort.OrtValue.ortvalue_from_numpy(view)
        return values

    def footprint(self, shapes: Shapes) -> Footprint:
        """This engine's footprint at ``shapes`` (measured once per model and shapes in a child
        process, then read from the cache). ValueError: the model does not run at ``shapes``."""
        key = shapes_key(shapes)
        if key not in self._calibrations:
            self._calibrations[key] = load_or_measure(self.file, self._threads, shapes, self._store_root,
                                                      values=self.control_values)
        return self._calibrations[key]

    def measure_ahead(self, shapes: Shapes) -> None:
        """Fill the on-disk cache for ``shapes`` (a child process measures, seconds) without
        touching this executor's state, so callers run it outside the engine's lock while frames
        go on. A failure is left to the ``calibration`` call that follows, which reports it."""
        with contextlib.suppress(ValueError):
            load_or_measure(self.file, self._threads, shapes, self._store_root, values=self.control_values)

    def calibrate(self, shapes: Shapes) -> None:
        """Judge budgets at ``shapes`` from now on; the window follows the footprint there."""
        key = shapes_key(shapes)
        if key == self._shapes_key:
            return
        self._cal = self.footprint(shapes)
        self._shapes_key = key
        if self._budget is not None and self.planned.fit_arena(shapes):
            release_memory()  # the footprint at these shapes is what the budget leaves the window room beside
        self._over = self._over_budget(self._cal, key)
        if self._over is not None and key not in self._warned:
            self._warned.add(key)
            LOG.warning("%s: running in the smallest window, %.1f MB over the budget, until the budget is raised",
                        self._over.describe(), self._over.overshoot_mb)
        self._apply_allowance()

    def _over_budget(self, cal: Footprint, key: str) -> OverBudget | None:
        if self._budget is None or self._budget >= cal.minimum_bytes():
            return None
        return OverBudget(shapes=key, minimum_mb=cal.minimum_bytes() / MB, budget_mb=self._budget / MB)

    def admit(self, shapes: Shapes) -> None:
        """Judge a frame at ``shapes`` before it runs: the window follows the footprint there;
        BudgetExceeded (nothing changed) where the budget is below the minimum at these shapes
        and the policy is "raise"."""
        key = shapes_key(shapes)
        if key != self._shapes_key and self.over_budget == "raise":
            over = self._over_budget(self.footprint(shapes), key)
            if over is not None:
                raise BudgetExceeded(over)
        self.calibrate(shapes)

    def _calibrated(self) -> Footprint:
        if self._pending_shapes is not None:
            pending, self._pending_shapes = self._pending_shapes, None
            self.calibrate(pending)
        if self._cal is None:
            raise RuntimeError("the streamed executor has no input shapes yet (calibrate first)")
        return self._cal

    # ------------------------------------------------------------------ budget
    @property
    def weight_span(self) -> int:
        return self.window.total_span

    def min_budget_bytes(self, shapes: Shapes | None = None) -> int:
        """The smallest budget accepted at ``shapes`` (default: the shapes in force): the
        footprint besides weights + the weights live at the heaviest segment, with the margin."""
        return (self._calibrated() if shapes is None else self.footprint(shapes)).minimum_bytes()

    def lowest_level_bytes(self) -> int:
        """The lowest budget a table offers: the minimum (it does not move between frames)."""
        return self.min_budget_bytes()

    def inmemory_bytes(self, shapes: Shapes | None = None) -> int:
        return (self._calibrated() if shapes is None else self.footprint(shapes)).inmemory_bytes()

    def allow_concurrent_runs(self, runs: int) -> None:
        """Up to ``runs`` frames at once while there is no budget and every weight is resident
        (the window then has nothing to do, and is bypassed); under a budget frames take turns
        through the window, in one lane."""
        self.planned.allow_concurrent_runs(runs)

    def runs_concurrently(self) -> bool:
        return self._budget is None and self.planned.lanes > 1 and self.window.holds_everything()

    def set_budget(self, budget_bytes: int | None) -> None:
        """All weights resident for None; else the window the budget leaves (ValueError if too small)."""
        if budget_bytes is None:
            self._budget = None
            self._over = None
            self.window.set_allowance(self.weight_span)
            return
        cal = self._calibrated()
        minimum = cal.minimum_bytes()
        if budget_bytes < minimum:
            raise ValueError(f"memory budget {round(budget_bytes / MB, 3):g} MB is below this model's minimum "
                             f"{minimum / MB:.1f} MB at input {self._shapes_key} (engine without weights "
                             f"{cal.footprint / MB:.1f} MB + {cal.min_stream_bytes / MB:.1f} MB of weights "
                             f"one step needs)")
        self._budget = int(budget_bytes)
        self._over = None
        self.planned.release_lanes()   # under a budget frames take turns: it counts one frame's activations
        self._apply_allowance()

    def _apply_allowance(self) -> None:
        allowance = self.weight_span if self._budget is None else \
            min(self.weight_span, max(self._calibrated().allowance(self._budget), self.window.min_stream_bytes))
        if allowance != self.window.allowance:
            self.window.set_allowance(allowance)

    # ------------------------------------------------------------------ hook (PlannedExecutor calls these)
    def frame_start(self) -> None:
        self.window.frame_start()

    def before(self, k: int) -> None:
        self.window.before(k)

    def after(self, k: int) -> None:
        self.window.after(k)

    def frame_end(self) -> None:
        self.window.frame_end()

    def abort(self) -> None:
        self.window.abort()

    # ------------------------------------------------------------------ executor API
    def run(self, feeds, out=None):
        shapes = {name: tuple(np.shape(value)) for name, value in feeds.items()}
        if self._budget is None:
            # every weight is resident and nothing is judged yet: the frame does not wait for a
            # measurement; it is taken when a budget or the footprint is asked for
            self._pending_shapes = None if shapes_key(shapes) == self._shapes_key else shapes
        else:
            self.admit(shapes)
        if self._over is not None:
            self._over_frames += 1
        start = time.perf_counter()
        outputs = self.planned.run_unhooked(feeds, out) if self.runs_concurrently() else self.planned.run(feeds, out)
        ms = (time.perf_counter() - start) * 1e3
        compute = ms - self.window.stats.last_frame_stall_ms
        self._latency_ms = ms if self._latency_ms is None else 0.7 * self._latency_ms + 0.3 * ms
        self._compute_ms = compute if self._compute_ms is None else 0.7 * self._compute_ms + 0.3 * compute
        return outputs

    @property
    def compute_ms(self) -> float | None:
        """Smoothed frame time minus waits for weights."""
        return self._compute_ms

    def predicted_latency_ms(self, budget_bytes: int, compute_ms: float | None = None) -> float | None:
        """``compute_ms``: the frame time to assume until this executor has measured its own."""
        compute = self._compute_ms if self._compute_ms is not None else compute_ms
        if compute is None:
            return None
        allowance = self._calibrated().allowance(budget_bytes)
        return predict_latency_ms(compute, self.weight_span, allowance, self.window.min_stream_bytes,
                                  self.window.stats.read_mb_s)

    def latency_table(self, top_bytes: int, compute_ms: float | None = None,
                      levels: int = 8) -> list[tuple[float, float]]:
        low = self.lowest_level_bytes()
        rows = []
        for budget in np.linspace(low, max(low, top_bytes), levels):
            ms = self.predicted_latency_ms(int(budget), compute_ms)
            if ms is not None:
                rows.append((float(budget) / MB, ms))
        return rows

    def arena_bytes_at(self, shapes) -> int | None:
        return self.planned.arena_bytes_at(shapes)

    def executor_stats(self) -> ExecutorStats:
        stats = self.window.stats
        footprint = 0 if self._cal is None else self._cal.footprint
        planned = self.planned.executor_stats()
        window = WindowStats(
            layout=self.file.layout, store=str(self.file.directory), weight_bytes=self.file.weight_bytes,
            weight_span_bytes=self.weight_span, allowance_bytes=self.window.allowance,
            pinned_bytes=self.window.pinned_bytes, resident_weight_bytes=self.window.resident_bytes,
            peak_resident_bytes=stats.peak_resident, nonweight_bytes=footprint,
            min_budget_bytes=0 if self._cal is None else self._cal.minimum_bytes(), budget_bytes=self._budget,
            predicted_peak_bytes=footprint + self.window.allowance, io_mode=self.reader.mode.value,
            frames=stats.frames, last_frame_read_bytes=stats.last_frame_read,
            last_frame_stall_ms=stats.last_frame_stall_ms, read_mb_s=stats.read_mb_s,
            split_bytes=self.split_bytes, rebuilt_reason=self.rebuilt_reason, over_budget=self._over,
            over_budget_frames=self._over_frames)
        return ExecutorStats(arena_bytes=planned.arena_bytes, blocks=sum(1 for names in self.window.needed if names),
                             resident_weight_bytes=self.window.resident_bytes, window=window,
                             details=planned.details)

    def close(self) -> None:
        """Idempotent (the Engine closes its executor and its swap control, here the same object)."""
        if self._closed:
            return
        self._closed = True
        self.window.close()
        self.planned.close()
        self._values = {}
        self.reader.close()
        self.region.close()
