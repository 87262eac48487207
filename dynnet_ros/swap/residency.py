"""Which weights are in memory while a planned model runs: a window streamed through the frame.

The planned executor calls ``before(k)`` / ``after(k)`` around each segment. Weights live in
one page-aligned anonymous region (each tensor at a fixed place; big ones on 2 MiB boundaries
so their bodies fill whole huge pages), so a tensor is swapped in by one direct read into its
own place and swapped out by dropping its pages; onnxruntime's sessions keep pointing at the
same addresses throughout.

* Up to ``allowance`` bytes are resident. Tensors chosen as *pinned* (the latest-used ones,
  whose reads have the least compute left to hide behind) stay for good; the rest stream.
* A background thread reads streamed tensors in order of first use, as far ahead as the
  allowance lets it — past the frame's end into the next frame's first tensors.
* ``after(k)`` drops every streamed tensor whose last reader was segment k, unless the
  reader thread already claimed it for the next frame.

Progress is guaranteed when the allowance covers the weights live at any one segment plus the
pinned set (``min_stream_bytes``); the owner rejects smaller allowances.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from dynnet_ros.bytesize import MB
from dynnet_ros.swap.swapin import HostArena, WeightReader

LOG = logging.getLogger(__name__)
PINNED = 1 << 62  # claim of a tensor that is never dropped
READ_CHUNK = 2 * MB
READ_WORKERS = 2


@dataclass
class _Tensor:
    name: str
    offset: int          # in the weight file
    span: int
    where: int           # in the region
    first: int           # first segment reading it
    last: int            # last segment reading it
    resident: bool = False
    loading: bool = False
    claim: int = -1      # frame the tensor is held for (PINNED: always)


@dataclass
class WindowStats:
    frames: int = 0
    bytes_read: int = 0
    read_seconds: float = 0.0
    stall_seconds: float = 0.0
    last_frame_read: int = 0
    last_frame_stall_ms: float = 0.0
    peak_resident: int = 0
    _frame_read_start: int = field(default=0, repr=False)
    _frame_stall: float = field(default=0.0, repr=False)

    @property
    def read_mb_s(self) -> float | None:
        return self.bytes_read / self.read_seconds / MB if self.read_seconds > 0 else None


class WeightWindow:
    """Streams a model's weights through ``region`` segment by segment (the executor's hook)."""

    def __init__(self, region: HostArena, reader: WeightReader, tensors: dict[str, tuple[int, int, int]],
                 segment_names: list[list[str]], allowance: int | None = None) -> None:
        """``tensors``: name -> (file offset, span, region offset); ``segment_names``: per
        segment, the tensors it reads; ``allowance`` None: the smallest window."""
        self.region = region
        self.reader = reader
        first: dict[str, int] = {}
        last: dict[str, int] = {}
        for k, names in enumerate(segment_names):
            for name in names:
                first.setdefault(name, k)
                last[name] = k
        self.tensors = [_Tensor(name, *tensors[name], first=first[name], last=last[name]) for name in first]
        self.order = sorted(range(len(self.tensors)), key=lambda i: (self.tensors[i].first, self.tensors[i].offset))
        by_name = {t.name: i for i, t in enumerate(self.tensors)}
        self.needed = [[by_name[n] for n in names] for names in segment_names]
        self.ending: list[list[int]] = [[] for _ in segment_names]
        for i, tensor in enumerate(self.tensors):
            self.ending[tensor.last].append(i)
        self.total_span = sum(t.span for t in self.tensors)
        #: most bytes that must be resident at one segment: its own weights and those live across it
        self.min_stream_bytes = max((sum(t.span for t in self.tensors if t.first <= k <= t.last)
                                     for k in range(len(self.needed))), default=0)
        self.stats = WindowStats()
        self._cond = threading.Condition()
        self._allowance = 0
        self._resident = 0
        self._frame = 0          # the frame running, or the next to run
        self._running = False
        self._pos = 0            # reader cursor: index into order ...
        self._pos_frame = 0      # ... for this frame
        self._epoch = 0          # bumped when the cursor is reset under the reader's feet
        self._error: BaseException | None = None
        self._closed = False
        self._current = -1       # the segment running (or last run)
        self._blocked = False    # the reader waits for room
        self._warned = False
        #: the paper's "w/o-pat-sch" baseline: load each segment's weights when it starts, nothing ahead, no pins
        self.naive = False
        self._pool = ThreadPoolExecutor(READ_WORKERS, thread_name_prefix="weight-read")
        self._thread = threading.Thread(target=self._reader_loop, name="weight-window", daemon=True)
        self.set_allowance(self.min_stream_bytes if allowance is None else allowance)
        self._thread.start()

    # ------------------------------------------------------------------ sizing
    def _choose_pinned(self, allowance: int) -> set[int]:
        """Latest-first tensors that fit next to twice the streaming need (current + next)."""
        if allowance >= self.total_span:
            return set(range(len(self.tensors)))
        if self.naive:
            return set()
        need = self.min_stream_bytes
        room = allowance - 2 * need
        pinned: set[int] = set()
        for i in sorted(range(len(self.tensors)), key=lambda i: -self.tensors[i].first):
            span = self.tensors[i].span
            if span <= room:
                pinned.add(i)
                room -= span
        return pinned

    def set_allowance(self, allowance: int) -> None:
        """Resize the window between frames; drops what no longer fits at once."""
        if allowance < self.min_stream_bytes:
            raise ValueError(f"weight allowance {allowance / MB:.1f} MB is below the "
                             f"{self.min_stream_bytes / MB:.1f} MB one segment needs")
        with self._cond:
            pinned = self._choose_pinned(allowance)
            self._allowance = allowance
            for i, tensor in enumerate(self.tensors):
                if i in pinned:
                    tensor.claim = PINNED
                elif tensor.claim == PINNED:
                    tensor.claim = self._frame
            # latest-needed first out, until the rest fits
            for i in sorted(self.order, key=lambda i: -self.tensors[i].first):
                if self._resident <= allowance:
                    break
                tensor = self.tensors[i]
                if tensor.resident and tensor.claim != PINNED:
                    self._drop(tensor)
            self._reset_cursor()
            self._cond.notify_all()

    @property
    def allowance(self) -> int:
        return self._allowance

    @property
    def resident_bytes(self) -> int:
        return self._resident

    def holds_everything(self) -> bool:
        """Every weight is resident and the allowance keeps it so: a frame then needs nothing
        from the window, which may be bypassed until the allowance changes."""
        with self._cond:   # not ``_resident``: it counts a tensor from the start of its read
            return self._allowance >= self.total_span and all(t.resident for t in self.tensors)

    @property
    def pinned_bytes(self) -> int:
        return sum(t.span for t in self.tensors if t.claim == PINNED)

    # ------------------------------------------------------------------ executor hooks
    def frame_start(self) -> None:
        with self._cond:
            self._current = -1
            self._running = True
            self.stats._frame_read_start = self.stats.bytes_read
            self.stats._frame_stall = 0.0
            self._cond.notify_all()

    def before(self, k: int) -> None:
        needed = self.needed[k]
        self._current = k
        if not needed:
            return
        with self._cond:
            if self.naive:
                self._cond.notify_all()
            start = None
            while not all(self.tensors[i].resident for i in needed):
                if self._error is not None:
                    raise ValueError(f"swapping weights in failed: {self._error}") from self._error
                if start is None:
                    start = time.perf_counter()
                elif self._blocked and not any(self.tensors[i].loading for i in needed):
                    self._make_room(k, needed)
                self._cond.wait(0.05)
                if time.perf_counter() - start > 10 and not self._warned:
                    self._warned = True
                    LOG.warning("segment %d has waited 10 s for its weights: %s", k, self.describe(needed))
            if start is not None:
                waited = time.perf_counter() - start
                self.stats.stall_seconds += waited
                self.stats._frame_stall += waited

    def after(self, k: int) -> None:
        ending = self.ending[k]
        if not ending:
            return
        with self._cond:
            for i in ending:
                tensor = self.tensors[i]
                if tensor.resident and tensor.claim != PINNED and tensor.claim <= self._frame:
                    self._drop(tensor)
            self._cond.notify_all()

    def frame_end(self) -> None:
        with self._cond:
            self._running = False
            self._frame += 1
            stats = self.stats
            stats.frames += 1
            stats.last_frame_read = stats.bytes_read - stats._frame_read_start
            stats.last_frame_stall_ms = stats._frame_stall * 1e3
            self._cond.notify_all()

    def abort(self) -> None:
        """A frame failed midway: drop what it held and restart the stream at the next frame."""
        with self._cond:
            self._running = False
            self._frame += 1
            self._error = None  # reported to the failed frame; the reader retries for the next
            for tensor in self.tensors:
                if tensor.resident and tensor.claim != PINNED:
                    self._drop(tensor)
            self._reset_cursor()
            self._cond.notify_all()

    def _make_room(self, k: int, needed: list[int]) -> None:
        """The reader waits for room the segment about to run needs (a resize kept tensors of
        later segments resident): drop what segment ``k`` does not need and is not live across
        it, and restart the cursor at ``k``. Called with the lock held."""
        dropped = False
        for tensor in self.tensors:
            if (tensor.resident and not tensor.loading and tensor.claim != PINNED
                    and (tensor.first > k or tensor.last < k)):
                self._drop(tensor)
                dropped = True
        if dropped:
            self._pos = next((p for p, i in enumerate(self.order) if self.tensors[i].first >= k), len(self.order))
            self._pos_frame = self._frame
            self._epoch += 1
            self._cond.notify_all()

    def describe(self, needed: Sequence[int] = ()) -> str:
        return (f"frame {self._frame} running={self._running} cursor={self._pos}/{len(self.order)}@{self._pos_frame} "
                f"resident={self._resident} allowance={self._allowance} blocked={self._blocked} "
                f"needed={[(t.name, t.resident, t.loading, t.claim) for t in (self.tensors[i] for i in needed)]}")

    # ------------------------------------------------------------------ reader thread
    def _reset_cursor(self) -> None:
        self._pos, self._pos_frame = 0, self._frame
        self._epoch += 1

    def _drop(self, tensor: _Tensor) -> None:
        self.region.release(tensor.where, tensor.span)
        tensor.resident = False
        self._resident -= tensor.span

    def _reader_loop(self) -> None:
        with self._cond:
            while not self._closed:
                if not self.order:  # a graph whose segments read no streamed weight: nothing to read
                    self._cond.wait()
                    continue
                if self._pos >= len(self.order):
                    self._pos, self._pos_frame = 0, self._pos_frame + 1
                tensor = self.tensors[self.order[self._pos]]
                ahead_limit = self._frame + (1 if self._running else 0)
                if self.naive and tensor.claim != PINNED and (self._pos_frame > self._frame or not self._running
                                                              or tensor.first > self._current):
                    self._cond.wait()
                    continue
                if self._pos_frame > ahead_limit or not self.order:
                    self._cond.wait()
                    continue
                if tensor.resident or tensor.loading:
                    if tensor.claim != PINNED:
                        tensor.claim = max(tensor.claim, self._pos_frame)
                    self._pos += 1
                    continue
                if self._resident + tensor.span > self._allowance:
                    self._blocked = True
                    self._cond.notify_all()
                    self._cond.wait()
                    self._blocked = False
                    continue
                tensor.loading = True
                self._resident += tensor.span
                self.stats.peak_resident = max(self.stats.peak_resident, self._resident)
                epoch = self._epoch
                frame_for = self._pos_frame
                self._cond.release()
                try:
                    start = time.perf_counter()
                    self._read(tensor)
                    seconds = time.perf_counter() - start
                    failed = None
                except BaseException as exc:  # noqa: BLE001 - reported to the waiting run
                    failed = exc
                finally:
                    self._cond.acquire()
                tensor.loading = False
                if failed is not None:
                    self._resident -= tensor.span
                    self.region.release(tensor.where, tensor.span)
                    self._error = failed
                    self._cond.notify_all()
                    self._cond.wait(1.0)
                    continue
                self._error = None
                tensor.resident = True
                if tensor.claim != PINNED:
                    tensor.claim = max(tensor.claim, frame_for)
                self.stats.bytes_read += tensor.span
                self.stats.read_seconds += seconds
                if epoch == self._epoch:
                    self._pos += 1
                self._cond.notify_all()

    def _read(self, tensor: _Tensor) -> None:
        """One tensor, in ``READ_CHUNK`` pieces on ``READ_WORKERS`` threads: two direct reads in
        flight reach 1.6 GB/s on a virtio disk where one reaches 1.0-1.3 (bench: iotest in docs/swap.md)."""
        pieces = [(start, min(READ_CHUNK, tensor.span - start)) for start in range(0, tensor.span, READ_CHUNK)]
        if len(pieces) == 1:
            self.reader.read_into(self.region.view(tensor.where, tensor.span), tensor.offset)
            return
        read = lambda piece: self.reader.read_into(  # noqa: E731
            self.region.view(tensor.where + piece[0], piece[1]), tensor.offset + piece[0])
        list(self._pool.map(read, pieces))

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=10)
        self._pool.shutdown(wait=True)
        with self._cond:
            for tensor in self.tensors:
                if tensor.resident:
                    self._drop(tensor)
