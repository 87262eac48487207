"""release_memory(): gc + glibc malloc_trim give a replaced engine's freed heap back to the OS."""
from __future__ import annotations

import ctypes.util
import platform

import pytest

from dynnet_ros.bytesize import MB
from dynnet_ros.memtrim import release_memory
from dynnet_ros.procmem import status_bytes


@pytest.mark.skipif(platform.system() != "Linux" or not ctypes.util.find_library("c"),
                    reason="malloc_trim is glibc-only (Linux)")
def test_release_memory_returns_freed_heap_to_the_os():
    # 2-KiB objects: above pymalloc's limit, below glibc's mmap threshold -> glibc heap chunks;
    # every other one kept alive so the heap cannot simply shrink from its top on free
    blocks = [bytes(2048) + bytes([i % 256]) for i in range(20000)]
    keep = blocks[::64]
    before_free = status_bytes("VmRSS")
    del blocks
    after_free = status_bytes("VmRSS")
    assert release_memory() is True
    after_trim = status_bytes("VmRSS")
    # ~40 MiB were freed but stay in RSS (glibc keeps the heap); trimming returns most of it
    assert after_trim < after_free - 20 * MB, (before_free / MB, after_free / MB, after_trim / MB)
    assert keep


@pytest.mark.skipif(platform.system() != "Linux" or not ctypes.util.find_library("c"),
                    reason="mallopt is glibc-only (Linux)")
def test_pinned_mmap_threshold_keeps_the_lowest_request():
    from dynnet_ros import memtrim

    assert memtrim.pin_mmap_threshold(256 * 1024)
    assert memtrim.pin_mmap_threshold(128 * 1024)
    assert memtrim.pin_mmap_threshold(256 * 1024)  # a later, larger request does not raise it
    assert memtrim._pinned_threshold == 128 * 1024
