"""Measure block delays on this machine and fit the delay model (``dynnet swap profile``).

Blocks are run with the loader synchronous (resident limit 1, nothing pinned), so t_in is the
pure swap-in time of each block and t_ex its pure compute.  Several groupings of the atoms and
several input sizes spread s, d and f so the regression is well conditioned.
"""
from __future__ import annotations

import os
from typing import Callable, Iterable, Mapping

import numpy as np

from dynnet_ros.swap import blocks
from dynnet_ros.swap.delay_model import BlockSample, DelayModel, fit
from dynnet_ros.swap.executor import SwappedExecutor
from dynnet_ros.swap.pipeline import RunTrace
from dynnet_ros.swap.store import Store


def groupings(atoms: int) -> list[tuple[int, ...]]:
    """Partitions with blocks of 1, 2, 3 atoms and one whole-model block."""
    result = []
    for width in (1, 2, 3):
        bounds = tuple(list(range(0, atoms, width)) + [atoms])
        if bounds not in result:
            result.append(bounds)
    if (0, atoms) not in result:
        result.append((0, atoms))
    return result


def sample_store(store: Store, feeds_for: Callable[[tuple[int, int]], Mapping[str, np.ndarray]],
                 sizes: Iterable[tuple[int, int]], *, repeats: int = 2, threads: int | None = None,
                 progress: Callable[[str], None] | None = None) -> list[BlockSample]:
    """Block samples of one model: every grouping x input size x repeat."""
    executor = SwappedExecutor(store, budget_mb=None, threads=threads)
    samples: list[BlockSample] = []
    try:
        atoms = [e.atom for e in store.atoms]
        for size in sizes:
            feeds = feeds_for(size)
            executor.run(feeds)  # warm-up at this size (kernel caches, page tables)
            for bounds in groupings(len(atoms)):
                partition = blocks.Partition(bounds, (False,) * (len(bounds) - 1), resident_limit=1).build(atoms)
                executor.pipeline.apply(partition)
                for _ in range(repeats):
                    trace = RunTrace()
                    flops = executor._table({k: tuple(v.shape) for k, v in feeds.items()})[2]
                    executor.pipeline.run(partition, feeds, executor._run_atom, trace, flops)
                    for timing in trace.blocks:
                        samples.append(BlockSample(timing.weight_bytes, timing.depth, timing.flops,
                                                   timing.t_in, timing.t_ex, timing.t_out))
                if progress:
                    progress(f"{store.path.name}: {size[0]}x{size[1]} blocks {len(bounds) - 1}")
    finally:
        executor.close()
    return samples


def profile(stores: list[tuple[Store, Callable]], sizes: list[tuple[int, int]], *, repeats: int = 2,
            threads: int | None = None, progress=None) -> tuple[DelayModel, list[BlockSample]]:
    samples: list[BlockSample] = []
    for store, feeds_for in stores:
        samples.extend(sample_store(store, feeds_for, sizes, repeats=repeats, threads=threads, progress=progress))
    return fit(samples, device=f"{os.uname().nodename} {os.uname().machine}, {os.cpu_count()} cpus"), samples
