"""Run a partition block by block, prefetching swapped blocks while the current one runs.

Whole-block prefetch: at most ``resident_limit`` swapped blocks are resident (default 2: the
running one and the one being prefetched).  Streamed prefetch (``partition.ahead``): the loader
reads the later swapped blocks in order, in ``STREAM_CHUNK`` pieces, and never holds more than
``ahead[k]`` bytes beyond the running block k — the scheduler's time-varying allowance, large
where activations are small — so a big deep block can start loading during an earlier block
that has room for only part of it.  ``partition.wrap`` ends each frame by prefetching the next
frame's first swapped block.  Pinned blocks stay resident across frames.  The loader is one
background thread: ``os.preadv`` releases the GIL, so direct reads overlap onnxruntime's compute.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np

from dynnet_ros.swap.blocks import Partition
from dynnet_ros.swap.store import AtomEntry
from dynnet_ros.swap.swapin import HostArena, WeightReader, resident_bytes


@dataclass
class BlockTiming:
    block: int
    weight_bytes: int
    depth: int
    flops: int
    t_in: float = 0.0      # seconds spent loading (0 when already resident)
    t_ex: float = 0.0
    t_out: float = 0.0
    waited: float = 0.0    # compute thread's wait for a prefetch that was not done yet


@dataclass
class RunTrace:
    blocks: list[BlockTiming] = field(default_factory=list)


#: Streamed reads go in pieces of this size (direct I/O reaches full speed from 1-4 MiB).
STREAM_CHUNK = 4 << 20


class _Stream:
    """One frame's loader: reads atoms in order, chunk by chunk, never past ``limit`` bytes."""

    def __init__(self, pipeline: "BlockPipeline", order: list[int], limit: int) -> None:
        self.pipeline = pipeline
        self.order = order
        self.limit = limit
        self.loaded = 0          # bytes of ``order`` done (resident atoms count as done)
        self.done = False        # no further allowance will come: stop when blocked
        self.cancelled = False
        self.error: BaseException | None = None
        self._cond = threading.Condition()

    def allow(self, limit: int) -> None:
        with self._cond:
            self.limit = max(self.limit, limit)
            self._cond.notify_all()

    def finish(self) -> None:
        with self._cond:
            self.done = True
            self._cond.notify_all()

    def cancel(self) -> None:
        with self._cond:
            self.cancelled = True
            self._cond.notify_all()

    def wait_for(self, position: int) -> float:
        """Block until ``position`` bytes are loaded; seconds waited."""
        start = time.perf_counter()
        with self._cond:
            while self.loaded < position and self.error is None:
                self._cond.wait()
            if self.error is not None:
                raise self.error
        return time.perf_counter() - start

    def _may_read(self, end: int) -> bool:
        with self._cond:
            while end > self.limit and not (self.done or self.cancelled):
                self._cond.wait()
            return end <= self.limit and not self.cancelled

    def load_all(self) -> None:
        pipeline = self.pipeline
        try:
            position = 0
            for i in self.order:
                entry = pipeline.entries[i]
                span = entry.span_bytes
                with pipeline._lock:
                    present = i in pipeline._resident
                    if not present:
                        pipeline._touched.add(i)
                if not present:
                    view = pipeline.arena.view(pipeline.offsets[i], span)
                    for piece in range(0, span, STREAM_CHUNK):
                        size = min(STREAM_CHUNK, span - piece)
                        if not self._may_read(position + piece + size):
                            return
                        pipeline.reader.read_into(view[piece:piece + size], entry.span_offset + piece)
                        if piece + size < span:
                            with self._cond:
                                self.loaded = position + piece + size
                                self._cond.notify_all()
                    # resident before the compute thread may see it loaded (it may release it)
                    with pipeline._lock:
                        pipeline._resident.add(i)
                        pipeline._touched.discard(i)
                position += span
                with self._cond:
                    self.loaded = position
                    self._cond.notify_all()
        except BaseException as exc:  # noqa: BLE001 - handed to the compute thread
            with self._cond:
                self.error = exc
                self._cond.notify_all()


class BlockPipeline:
    """Swap-in/out of atoms' weight spans and the in-order execution of a partition."""

    def __init__(self, entries: Sequence[AtomEntry], arena: HostArena, reader: WeightReader,
                 last_reader: dict[str, int], keep: set[str], arena_offsets: Sequence[int] | None = None) -> None:
        self.entries = list(entries)
        self.offsets = list(arena_offsets) if arena_offsets is not None else [e.span_offset for e in self.entries]
        self.arena = arena
        self.reader = reader
        self._resident: set[int] = set()
        #: atoms whose pages may be partly resident (a streamed read started, not finished)
        self._touched: set[int] = set()
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dynnet-swapin")
        #: the next frame's first block, prefetched while the last block of a frame ran
        self._pending: Future | None = None
        self._pending_stream: _Stream | None = None
        # Tensors whose last reader is atom i are dropped from the environment right after it
        # (graph outputs are kept): activations live no longer than the model needs them.
        self._dead: dict[int, list[str]] = {}
        for name, last in last_reader.items():
            if name not in keep:
                self._dead.setdefault(last, []).append(name)

    # ------------------------------------------------------------------ residency
    def resident_atoms(self) -> set[int]:
        with self._lock:
            return set(self._resident)

    def resident_bytes(self) -> int:
        with self._lock:
            return sum(resident_bytes(self.entries[i].span_bytes, self.arena.huge_pages) for i in self._resident)

    def load(self, atoms: Sequence[int]) -> float:
        """Read the atoms' weights into their (fixed) arena addresses."""
        missing = [i for i in atoms if i not in self._resident]
        if not missing:
            return 0.0
        start = time.perf_counter()
        for i in missing:
            entry = self.entries[i]
            if entry.span_bytes:
                self.reader.read_into(self.arena.view(self.offsets[i], entry.span_bytes), entry.span_offset)
        with self._lock:
            self._resident.update(missing)
        return time.perf_counter() - start

    def _run_atoms(self, atoms, env: dict, run_atom) -> float:
        """Run a block's atoms in order, dropping each tensor after its last reader; seconds taken."""
        start = time.perf_counter()
        for i in atoms:
            env.update(run_atom(i, env))
            for name in self._dead.get(i, ()):
                env.pop(name, None)
        return time.perf_counter() - start

    def release(self, atoms: Sequence[int]) -> float:
        """Swap out without write-back: the pages are dropped, the sessions keep their pointers."""
        start = time.perf_counter()
        with self._lock:
            present = [i for i in atoms if i in self._resident or i in self._touched]
            self._resident.difference_update(present)
            self._touched.difference_update(present)
        for i in present:
            self.arena.release(self.offsets[i], self.entries[i].span_bytes)
        return time.perf_counter() - start

    def apply(self, partition: Partition) -> None:
        """Make residency match a new partition: unpinned atoms are dropped now; newly pinned
        ones load on their first use."""
        self.drain(cancel=True)
        pinned = {i for block in partition.blocks if block.pinned for i in block.atoms}
        with self._lock:
            held = self._resident | self._touched
        self.release(sorted(held - pinned))

    def drain(self, cancel: bool = False) -> float:
        """Wait for a cross-frame prefetch still in flight; seconds waited.  ``cancel``: a
        streamed one stops after its current chunk (a partition change drops it anyway)."""
        pending, self._pending = self._pending, None
        stream, self._pending_stream = self._pending_stream, None
        if pending is None:
            return 0.0
        if cancel and stream is not None:
            stream.cancel()
        start = time.perf_counter()
        try:
            pending.result()
        except Exception:  # noqa: BLE001 - the block simply loads again when needed
            pass
        return time.perf_counter() - start

    # ------------------------------------------------------------------ execution
    def run(self, partition: Partition, feeds: Mapping[str, np.ndarray],
            run_atom: Callable[[int, dict], dict], trace: RunTrace | None = None,
            flops: Sequence[int] | None = None) -> dict[str, np.ndarray]:
        if partition.ahead is not None:
            return self._run_streamed(partition, feeds, run_atom, trace, flops)
        env: dict[str, np.ndarray] = dict(feeds)
        blocks = partition.blocks
        prefetch = partition.resident_limit >= 2
        futures: dict[int, Future] = {}
        carried = self.drain()  # the previous frame's prefetch of this frame's first block
        resident = self.resident_atoms()
        swapped = [k for k, block in enumerate(blocks) if not block.pinned]
        wrap_block = swapped[0] if partition.wrap and prefetch and swapped and swapped[0] != len(blocks) - 1 \
            else None

        def needs_load(k: int) -> bool:
            return any(i not in resident for i in blocks[k].atoms)

        try:
            for k, block in enumerate(blocks):
                timing = BlockTiming(k, block.weight_bytes, block.depth,
                                     sum(flops[i] for i in block.atoms) if flops else 0)
                if k == 0:
                    timing.waited = carried
                if k in futures:
                    wait_start = time.perf_counter()
                    timing.t_in = futures.pop(k).result()
                    timing.waited = time.perf_counter() - wait_start
                elif needs_load(k):
                    timing.t_in = self.load(block.atoms)
                    timing.waited = timing.t_in
                if prefetch:
                    nxt = next((j for j in range(k + 1, len(blocks)) if needs_load(j) and j not in futures), None)
                    if nxt is not None:
                        futures[nxt] = self._pool.submit(self.load, blocks[nxt].atoms)
                    elif k == len(blocks) - 1 and wrap_block is not None:
                        self._pending = self._pool.submit(self.load, blocks[wrap_block].atoms)
                timing.t_ex = self._run_atoms(block.atoms, env, run_atom)
                if not block.pinned:
                    timing.t_out = self.release(block.atoms)
                resident = self.resident_atoms() | {i for j in futures for i in blocks[j].atoms}
                if trace is not None:
                    trace.blocks.append(timing)
        finally:
            for future in futures.values():  # an error mid-frame: finish and drop prefetches
                try:
                    future.result()
                except Exception:
                    pass
            for j in futures:
                if not blocks[j].pinned:
                    self.release(blocks[j].atoms)
        return env

    def _run_streamed(self, partition: Partition, feeds: Mapping[str, np.ndarray],
                      run_atom: Callable[[int, dict], dict], trace: RunTrace | None,
                      flops: Sequence[int] | None) -> dict[str, np.ndarray]:
        """Streamed prefetch: the loader reads later swapped blocks in order, in chunks, at most
        ``partition.ahead[k]`` bytes beyond the running block k (the scheduler's time-varying
        allowance); with ``wrap`` it ends with the next frame's first swapped block, whose load
        finishes after this frame returns."""
        env: dict[str, np.ndarray] = dict(feeds)
        blocks = partition.blocks
        carried = self.drain()
        swapped = [k for k, block in enumerate(blocks) if not block.pinned]
        wrap = swapped[0] if partition.wrap and swapped and swapped[0] != len(blocks) - 1 else None
        order = [i for k in swapped for i in blocks[k].atoms] + (list(blocks[wrap].atoms) if wrap is not None else [])
        ends, position = [], 0
        for block in blocks:
            if not block.pinned:
                position += sum(self.entries[i].span_bytes for i in block.atoms)
            ends.append(position)
        stream = _Stream(self, order, limit=ends[0] + partition.ahead[0])
        self._pending = self._pool.submit(stream.load_all)
        self._pending_stream = stream
        try:
            for k, block in enumerate(blocks):
                timing = BlockTiming(k, block.weight_bytes, block.depth,
                                     sum(flops[i] for i in block.atoms) if flops else 0)
                timing.waited = carried if k == 0 else 0.0
                stream.allow(ends[k] + partition.ahead[k])
                timing.waited += stream.wait_for(ends[k])
                if block.pinned:
                    timing.t_in = self.load(block.atoms)  # first use after pinning
                timing.t_ex = self._run_atoms(block.atoms, env, run_atom)
                if not block.pinned:
                    timing.t_out = self.release(block.atoms)
                if trace is not None:
                    trace.blocks.append(timing)
        except BaseException:
            stream.cancel()
            self.drain()
            self.release([i for i in order if i not in {j for b in blocks if b.pinned for j in b.atoms}])
            raise
        stream.finish()  # read up to the last allowance (the wrapped block), then stop
        return env

    def close(self) -> None:
        self.drain(cancel=True)
        self._pool.shutdown(wait=True)
        self.release(sorted(self.resident_atoms()))
