"""One contiguous byte arena that holds every planned tensor of the current shape signature.

Why one buffer: per-tensor allocations through a caching allocator grow and fragment as input
shapes change (onnxruntime's BFC arena extends by powers of two and never gives memory back);
a single buffer sized to the planned height, reused across runs, costs exactly the plan.
"""
from __future__ import annotations

import numpy as np

ALIGN = 64  # bytes; cache-line and AVX-512 friendly, and a multiple of every dtype's itemsize


def align(nbytes: int, alignment: int = ALIGN) -> int:
    return (int(nbytes) + alignment - 1) // alignment * alignment


class Arena:
    """Grow-only byte buffer; ``generation`` changes whenever views into it become invalid."""

    def __init__(self) -> None:
        self._buffer: np.ndarray | None = None
        self._base = 0
        self.capacity = 0
        self.generation = 0
        self.high_water = 0

    def ensure(self, nbytes: int) -> None:
        """Make room for ``nbytes``; reallocating invalidates all earlier views (new generation)."""
        nbytes = align(max(int(nbytes), 1))
        self.high_water = max(self.high_water, nbytes)
        if nbytes <= self.capacity:
            return
        self._buffer = None  # release first so old and new never coexist at the peak
        raw = np.empty(nbytes + ALIGN, dtype=np.uint8)
        start = (-raw.ctypes.data) % ALIGN
        self._buffer = raw
        self._base = start
        self.capacity = nbytes
        self.generation += 1

    def view(self, offset: int, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        """A numpy view of ``shape``/``dtype`` at byte ``offset`` — no copy."""
        dtype = np.dtype(dtype)
        count = int(np.prod(shape)) if shape else 1
        start = self._base + offset
        if offset < 0 or offset + count * dtype.itemsize > self.capacity:
            raise ValueError(f"arena view [{offset}, {offset + count * dtype.itemsize}) exceeds capacity "
                             f"{self.capacity}")
        return self._allocated()[start:start + count * dtype.itemsize].view(dtype).reshape(shape)

    def address(self, offset: int) -> int:
        return int(self._allocated().ctypes.data) + self._base + offset

    def _allocated(self) -> np.ndarray:
        if self._buffer is None:
            raise ValueError("the arena holds no buffer: call ensure() before taking views")
        return self._buffer

    def contains(self, pointer: int) -> bool:
        if self._buffer is None:
            return False
        begin = int(self._buffer.ctypes.data) + self._base
        return begin <= pointer < begin + self.capacity

    def release(self) -> None:
        self._buffer = None
        self.capacity = 0
        self.generation += 1
