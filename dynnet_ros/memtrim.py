"""glibc heap tuning shared by every executor: what a memory budget counts is RSS.

Why: a closed engine's Python objects may sit in reference cycles until the next GC pass, and
glibc keeps freed heap pages (below the mmap threshold) in its arenas. Both count in the
node's RSS, which is what a memory budget bounds, so a budget change or model reload would
otherwise leave the old engine's memory charged to the new one. Likewise glibc raises its mmap
threshold as large blocks are freed, after which freed activations stay in the heap; pinning
the threshold keeps them in mmapped chunks that go straight back to the OS.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import gc
from functools import lru_cache


@lru_cache(maxsize=1)
def _malloc_trim():
    """glibc's ``malloc_trim`` or None (musl, macOS: nothing to call)."""
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        fn = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


def release_memory() -> bool:
    """``gc.collect()`` then ``malloc_trim(0)``; True when glibc returned memory to the OS."""
    gc.collect()
    trim = _malloc_trim()
    return bool(trim(0)) if trim is not None else False


_M_MMAP_THRESHOLD = -3  # mallopt parameter number in glibc's malloc.h
_pinned_threshold: int | None = None


def pin_mmap_threshold(threshold: int) -> bool:
    """Serve blocks above ``threshold`` bytes by mmap, process-wide; the lowest request wins.

    Several executors may share a process (planned engine, swapped blocks); each asks for the
    threshold its memory accounting assumes, and the smallest one satisfies them all.
    Returns True when glibc accepted it (False elsewhere: nothing to tune).
    """
    global _pinned_threshold
    if _pinned_threshold is not None and _pinned_threshold <= threshold:
        return True
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        accepted = bool(ctypes.CDLL(name).mallopt(_M_MMAP_THRESHOLD, int(threshold)))
    except (OSError, AttributeError):
        return False
    if accepted:
        _pinned_threshold = int(threshold)
    return accepted
