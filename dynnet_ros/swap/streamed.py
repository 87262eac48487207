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

The budget bounds the process's RSS growth since the engine was created. What is not weights
(sessions, arena, onnxruntime's runtime) is *measured*: RSS minus resident weights after every
segment, its maximum over recent frames; the weight allowance is the budget minus that and a
margin. A budget change is a window resize (no session is rebuilt).
"""
from __future__ import annotations

import collections
import logging
import os
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

from dynnet_ros.engine.backends.base import ExecutorStats, WindowStats
from dynnet_ros.engine.memtrim import release_memory
from dynnet_ros.engine.plan.executor import PlannedExecutor
from dynnet_ros.engine.plan.graph import all_graphs
from dynnet_ros.engine.plan.layout import laid_out_skeleton
from dynnet_ros.engine.plan.loader import load_skeleton, source_path
from dynnet_ros.engine.plan.model_check import file_digest
from dynnet_ros.engine.plan.options import PlannerOptions, plan_profile
from dynnet_ros.swap.residency import WeightWindow
from dynnet_ros.swap.swapin import HostArena, WeightReader, arena_layout, huge_pages_available
from dynnet_ros.swap.weight_file import LAYOUTS, WeightFile, ensure_weight_file
from dynnet_ros.units import MB

LOG = logging.getLogger(__name__)
#: split FC weights to at most this fraction of all weights (a 25 % budget holds two pieces)
SPLIT_FRACTION = 1 / 8
MIN_SPLIT_BYTES = MB
#: what one segment's onnxruntime temporaries may add between two RSS samples (see docs/swap.md)
TRANSIENT_BYTES = 256 * 1024
MARGIN_FRACTION = 0.005
#: the table's lowest level sits this far above the measured minimum, which moves a little
#: with every frame's measurement (a level taken from the table must still be accepted)
LOWEST_LEVEL_SLACK = 1.02
#: the measured footprint may grow this much before the window shrinks mid-stream
RESIZE_SLACK_BYTES = 256 * 1024
#: frames over which the measured non-weight footprint's maximum is kept
HISTORY = 16
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
DEFAULT_READ_MB_S = 800.0  # O_DIRECT read rate on this class of VM (dd, 4 MiB blocks)


def prepare_weight_file(model: onnx.ModelProto, layout: str = "nchwc",
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
            onnx.save(model, source)
        return ensure_weight_file(source, source_key=file_digest(source), layout="as-given",
                                  split_bytes=split_bytes_for(total), root=store_root)


def split_bytes_for(weight_bytes: int) -> int:
    """The largest FC piece for a model with ``weight_bytes`` of weights."""
    return max(MIN_SPLIT_BYTES, int(weight_bytes * SPLIT_FRACTION))


def prepare(path: str | os.PathLike, layout: str = "nchwc") -> WeightFile:
    """Build ``path``'s weight file ahead of serving (``dynnet zoo build``, ``dynnet swap
    prepare``). ValueError for a model that cannot be loaded."""
    return prepare_weight_file(load_skeleton(path), layout)[0]


def rss_bytes(fd: int) -> int:
    """Current RSS from /proc/self/statm (one pread; cheap enough per segment)."""
    return int(os.pread(fd, 128, 0).split()[1]) * PAGE_SIZE


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


@dataclass
class Footprint:
    """What the engine holds besides weights, measured, with the margin the budget keeps."""

    nonweight: int
    margin: int

    def allowance(self, budget: int) -> int:
        return budget - self.nonweight - self.margin


class StreamedExecutor:
    """BudgetedExecutor (see backends.base): the planned engine with its weights streamed."""

    name = "swap"

    def __init__(self, model: onnx.ModelProto, *, threads: int | None = None, baseline_rss: int | None = None,
                 store_root: str | os.PathLike | None = None, layout: str = "nchwc",
                 weights: WeightFile | None = None, rebuilt_reason: str | None = None,
                 external_bytes: Callable[[], int] = lambda: 0) -> None:
        """``baseline_rss``: RSS before the model was loaded (budgets bound the growth since);
        ``layout``: see ``prepare_weight_file``; ``weights``: the model's verified weight file if
        the caller has it (else found or built), and ``rebuilt_reason`` why it was rebuilt;
        ``external_bytes``: what the caller allocated since and charges to itself."""
        self._external = external_bytes
        self._statm = os.open("/proc/self/statm", os.O_RDONLY)
        self.baseline = baseline_rss if baseline_rss is not None else rss_bytes(self._statm)
        before_build = rss_bytes(self._statm)
        self.file, self.rebuilt_reason = (weights, rebuilt_reason) if weights is not None else \
            prepare_weight_file(model, layout, store_root)
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
        self.planned = PlannedExecutor(graph, options)
        spans = {name: (t.offset, t.span, self.places[name]) for name, t in self.file.tensors.items()}
        self.window = WeightWindow(self.region, self.reader, spans, self.planned.segment_weight_names())
        self.planned.segment_hook = self
        # sessions, plans and the runtime this build added (what exists next to it is not ours)
        self._build_bytes = max(0, rss_bytes(self._statm) - before_build)
        if before_build - self.baseline < self._build_bytes:  # nothing else of the engine's was there
            self._build_bytes = max(0, rss_bytes(self._statm) - self.baseline)
        self._history: collections.deque[int] = collections.deque(maxlen=HISTORY)
        self._frame_max = 0
        self._budget: int | None = None
        self._latency_ms: float | None = None
        self._compute_ms: float | None = None

    def _views(self, graph: onnx.ModelProto) -> dict[str, ort.OrtValue]:
        arena = self.region.array
        if arena is None:
            raise RuntimeError("the weight arena is closed")
        values = {}
        for g in all_graphs(graph.graph):
            for tensor in g.initializer:
                entry = self.file.tensors.get(tensor.name)
                if entry is None or tensor.name in values:
                    continue
                dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type))
                where = self.places[tensor.name]
                view = arena[where:where + entry.nbytes].view(dtype).reshape(tuple(tensor.dims))
                values[tensor.name] = ort.OrtValue.ortvalue_from_numpy(view)
        return values

    def calibrate(self, shapes: Mapping[str, tuple[int, ...]]) -> None:
        """Run one frame of zeros at ``shapes`` through the smallest window, so the footprint
        without weights is measured (arena at that size, sessions' first-run allocations)
        before any budget is judged against it."""
        graph = self.planned.graph
        feeds = {name: np.zeros(shape, dtype=helper.tensor_dtype_to_np_dtype(graph.elem_types[name]))
                 for name, shape in shapes.items()}
        release_memory()  # the build's garbage is not the engine's footprint
        self.window.set_allowance(self.window.min_stream_bytes)
        try:
            self.planned.run(feeds)
        except ValueError as exc:
            LOG.info("calibration frame at %s failed (%s); the footprint stays estimated", shapes, exc)

    # ------------------------------------------------------------------ budget
    @property
    def weight_span(self) -> int:
        return self.window.total_span

    def footprint(self) -> Footprint:
        """Measured non-weight bytes (max over recent frames), else an estimate before the first."""
        if self._history:
            nonweight = max(self._history)
        else:
            arena = self.planned.last_plan.height if self.planned.last_plan is not None else \
                max((p.height for p in self.planned.plans.values()), default=0)
            nonweight = self._build_bytes + arena + TRANSIENT_BYTES
        return Footprint(max(nonweight, 0) + TRANSIENT_BYTES, int(MARGIN_FRACTION * (self._budget or 0)))

    def min_budget_bytes(self) -> int:
        """The smallest budget this executor can run in: non-weight footprint + one segment's
        weights (plus what stays live across it), with the margin."""
        fp = self.footprint()
        need = fp.nonweight + self.window.min_stream_bytes
        return int(need / (1 - MARGIN_FRACTION)) + 1

    def lowest_level_bytes(self) -> int:
        """The lowest budget a table offers: the minimum with room for the next frames'
        measurements to move it (relative for big models, 256 KiB for tiny ones)."""
        return int(self.min_budget_bytes() * LOWEST_LEVEL_SLACK) + RESIZE_SLACK_BYTES

    def inmemory_bytes(self) -> int:
        fp = self.footprint()
        return int((fp.nonweight + self.weight_span) / (1 - MARGIN_FRACTION)) + 1

    def set_budget(self, budget_bytes: int | None) -> None:
        """All weights resident for None; else the window the budget leaves (ValueError if too small)."""
        if budget_bytes is None:
            self._budget = None
            self.window.set_allowance(self.weight_span)
            return
        minimum = self.min_budget_bytes()
        if budget_bytes < minimum:
            fp = self.footprint()
            raise ValueError(f"memory budget {budget_bytes / MB:.1f} MB is below this model's minimum "
                             f"{minimum / MB:.1f} MB (engine without weights {fp.nonweight / MB:.1f} MB + "
                             f"{self.window.min_stream_bytes / MB:.1f} MB of weights one step needs)")
        self._budget = int(budget_bytes)
        self._apply_allowance()

    def _apply_allowance(self) -> None:
        allowance = self.weight_span if self._budget is None else \
            min(self.weight_span, max(self.footprint().allowance(self._budget), self.window.min_stream_bytes))
        if allowance != self.window.allowance:
            self.window.set_allowance(allowance)

    # ------------------------------------------------------------------ hook (PlannedExecutor calls these)
    def frame_start(self) -> None:
        self._frame_max = 0
        self.window.frame_start()

    def before(self, k: int) -> None:
        self.window.before(k)

    def after(self, k: int) -> None:
        self._frame_max = max(self._frame_max,
                              rss_bytes(self._statm) - self.baseline - self.window.resident_bytes - self._external())
        self.window.after(k)

    def frame_end(self) -> None:
        self.window.frame_end()
        previous = max(self._history) if self._history else None
        self._history.append(self._frame_max)
        if self._budget is not None and max(self._history) != previous:
            # the footprint moved (new input size, first frames): re-size the window
            current = self.window.allowance
            wanted = min(self.weight_span, max(self.footprint().allowance(self._budget), self.window.min_stream_bytes))
            # a resize restarts the stream (tensors dropped are read again): not for jitter the
            # margin already covers
            slack = max(RESIZE_SLACK_BYTES, self.footprint().margin)
            if wanted < current - slack or wanted > current + MB:
                self.window.set_allowance(wanted)

    def abort(self) -> None:
        self.window.abort()

    # ------------------------------------------------------------------ executor API
    def run(self, feeds, out=None):
        start = time.perf_counter()
        outputs = self.planned.run(feeds, out)
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
        allowance = self.footprint().allowance(budget_bytes)
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
        footprint = self.footprint()
        planned = self.planned.executor_stats()
        window = WindowStats(
            layout=self.file.layout, store=str(self.file.directory), weight_bytes=self.file.weight_bytes,
            weight_span_bytes=self.weight_span, allowance_bytes=self.window.allowance,
            pinned_bytes=self.window.pinned_bytes, resident_weight_bytes=self.window.resident_bytes,
            peak_resident_bytes=stats.peak_resident, nonweight_bytes=footprint.nonweight,
            min_budget_bytes=self.min_budget_bytes(), budget_bytes=self._budget,
            predicted_peak_bytes=footprint.nonweight + self.window.allowance, io_mode=self.reader.mode.value,
            frames=stats.frames, last_frame_read_bytes=stats.last_frame_read,
            last_frame_stall_ms=stats.last_frame_stall_ms, read_mb_s=stats.read_mb_s,
            split_bytes=self.split_bytes, rebuilt_reason=self.rebuilt_reason)
        return ExecutorStats(arena_bytes=planned.arena_bytes, blocks=sum(1 for names in self.window.needed if names),
                             resident_weight_bytes=self.window.resident_bytes, window=window,
                             details=planned.details)

    def close(self) -> None:
        """Idempotent (the Engine closes its executor and its swap control, here the same object)."""
        if self._statm < 0:
            return
        self.window.close()
        self.planned.close()
        self._values = {}
        self.reader.close()
        self.region.close()
        os.close(self._statm)
        self._statm = -1
