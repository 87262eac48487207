"""Process-wide onnxruntime state the planned engine's segment sessions may share.

Why a module of its own: onnxruntime's environment (its global thread pool, its registered
allocators) exists once per process and can be configured only before or once; every executor
in the process sees the same state, so it is kept here, not on an executor.
"""
from __future__ import annotations

import logging

import onnxruntime as ort
from onnxruntime.capi import _pybind_state

log = logging.getLogger(__name__)

_shared_arena = False
_global_pool: int | None = None


def use_global_pool(threads: int) -> bool:
    """Size onnxruntime's process-wide thread pool once; True when segments can use it.

    Why: one pool per segment session means 20-45 pools whose threads wake and sleep around
    every segment, each thread with its own glibc malloc arena; a single pool is what a
    plain session has. Only possible before onnxruntime's environment exists, so the first
    executor's thread count wins (later ones with another count keep per-session pools).
    """
    global _global_pool
    if _global_pool is None:
        try:
            _pybind_state.set_global_thread_pool_sizes(int(threads), 1)
            _global_pool = int(threads)
        except Exception as exc:  # noqa: BLE001 - onnxruntime's own types: the environment exists already
            # (a session was made first): segments keep per-session pools
            log.info("global onnxruntime thread pool unavailable: %s", exc)
            _global_pool = 0
    return _global_pool == int(threads)


def register_shared_arena(strategy: int = 1) -> None:
    """One BFC arena for all segment sessions (1 = grow as requested, 0 = by powers of two).

    Process-wide and registered once: the first executor's strategy wins."""
    global _shared_arena
    if _shared_arena:
        return
    info = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
    ort.create_and_register_allocator(info, ort.OrtArenaCfg(0, int(strategy), -1, -1))
    _shared_arena = True
