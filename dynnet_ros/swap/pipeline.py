"""Run a partition block by block, prefetching the next swapped block while the current one runs.

At most ``resident_limit`` swapped blocks are resident (default 2: the running one and the one
being prefetched); pinned blocks stay resident across frames.  The loader is one background
thread: ``os.preadv`` releases the GIL, so direct reads overlap onnxruntime's compute.
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


class BlockPipeline:
    """Swap-in/out of atoms' weight spans and the in-order execution of a partition."""

    def __init__(self, entries: Sequence[AtomEntry], arena: HostArena, reader: WeightReader,
                 last_reader: dict[str, int], keep: set[str], arena_offsets: Sequence[int] | None = None) -> None:
        self.entries = list(entries)
        self.offsets = list(arena_offsets) if arena_offsets is not None else [e.span_offset for e in self.entries]
        self.arena = arena
        self.reader = reader
        self._resident: set[int] = set()
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dynnet-swapin")
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

    def release(self, atoms: Sequence[int]) -> float:
        """Swap out without write-back: the pages are dropped, the sessions keep their pointers."""
        start = time.perf_counter()
        with self._lock:
            present = [i for i in atoms if i in self._resident]
            self._resident.difference_update(present)
        for i in present:
            self.arena.release(self.offsets[i], self.entries[i].span_bytes)
        return time.perf_counter() - start

    def apply(self, partition: Partition) -> None:
        """Make residency match a new partition: unpinned atoms are dropped now; newly pinned
        ones load on their first use."""
        pinned = {i for block in partition.blocks if block.pinned for i in block.atoms}
        self.release(sorted(self.resident_atoms() - pinned))

    # ------------------------------------------------------------------ execution
    def run(self, partition: Partition, feeds: Mapping[str, np.ndarray],
            run_atom: Callable[[int, dict], dict], trace: RunTrace | None = None,
            flops: Sequence[int] | None = None) -> dict[str, np.ndarray]:
        env: dict[str, np.ndarray] = dict(feeds)
        blocks = partition.blocks
        prefetch = partition.resident_limit >= 2
        futures: dict[int, Future] = {}
        resident = self.resident_atoms()

        def needs_load(k: int) -> bool:
            return any(i not in resident for i in blocks[k].atoms)

        try:
            for k, block in enumerate(blocks):
                timing = BlockTiming(k, block.weight_bytes, block.depth,
                                     sum(flops[i] for i in block.atoms) if flops else 0)
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
                start = time.perf_counter()
                for i in block.atoms:
                    env.update(run_atom(i, env))
                    for name in self._dead.get(i, ()):
                        env.pop(name, None)
                timing.t_ex = time.perf_counter() - start
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

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self.release(sorted(self.resident_atoms()))
