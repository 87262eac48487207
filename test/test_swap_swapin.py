"""Direct-I/O swap-in and its fallback, swap-out without write-back, the region's page layout."""
from __future__ import annotations

import errno
import os

import numpy as np
import pytest

from dynnet_ros.swap.swapin import ALIGN, HostArena, IoMode, WeightReader, decide_io_mode


@pytest.fixture()
def weight_file(tmp_path):
    data = np.random.default_rng(0).integers(0, 255, 8 * ALIGN, dtype=np.uint8)
    path = tmp_path / "weights.bin"
    data.tofile(path)
    return path, data


def test_io_mode_decision_table():
    assert decide_io_mode(prefer_direct=True, direct_open_ok=True, direct_read_ok=True) is IoMode.DIRECT
    assert decide_io_mode(prefer_direct=True, direct_open_ok=False, direct_read_ok=False) is IoMode.BUFFERED
    assert decide_io_mode(prefer_direct=True, direct_open_ok=True, direct_read_ok=False) is IoMode.BUFFERED
    assert decide_io_mode(prefer_direct=False, direct_open_ok=True, direct_read_ok=True) is IoMode.BUFFERED


def test_direct_read_into_arena(weight_file):
    path, data = weight_file
    reader = WeightReader(path)
    arena = HostArena(len(data))
    try:
        assert reader.read_into(arena.view(ALIGN, 4 * ALIGN), ALIGN) == 4 * ALIGN
        np.testing.assert_array_equal(arena.array[ALIGN:5 * ALIGN], data[ALIGN:5 * ALIGN])
        if reader.mode is IoMode.BUFFERED:  # e.g. a filesystem without O_DIRECT: the reason says so
            assert reader.reason != "ok"
    finally:
        reader.close()
        arena.close()


def test_fallback_when_open_with_o_direct_fails(weight_file):
    path, data = weight_file

    def opener(name, flags):
        if flags & getattr(os, "O_DIRECT", 0):
            raise OSError(errno.EINVAL, "Invalid argument")
        return os.open(name, flags)

    reader = WeightReader(path, opener=opener)
    arena = HostArena(len(data))
    try:
        assert reader.mode is IoMode.BUFFERED and "O_DIRECT" in reader.reason
        reader.read_into(arena.view(0, len(data)), 0)
        np.testing.assert_array_equal(arena.array[:len(data)], data)
    finally:
        reader.close()
        arena.close()


def test_fallback_when_direct_read_fails_later(weight_file, monkeypatch):
    path, data = weight_file
    reader = WeightReader(path)
    if reader.mode is not IoMode.DIRECT:
        pytest.skip(f"direct I/O unavailable on this filesystem: {reader.reason}")
    real = os.preadv
    direct_fd = reader._direct_fd

    def flaky(fd, buffers, offset):
        if fd == direct_fd:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(fd, buffers, offset)

    monkeypatch.setattr(os, "preadv", flaky)
    arena = HostArena(len(data))
    try:
        reader.read_into(arena.view(0, len(data)), 0)
        assert reader.mode is IoMode.BUFFERED
        np.testing.assert_array_equal(arena.array[:len(data)], data)
    finally:
        reader.close()
        arena.close()


def test_release_drops_pages_without_write_back(weight_file):
    path, data = weight_file
    arena = HostArena(len(data))
    reader = WeightReader(path)
    try:
        reader.read_into(arena.view(0, len(data)), 0)
        arena.release(0, 2 * ALIGN)
        assert not arena.array[:2 * ALIGN].any()                       # dropped: zero-filled on touch
        np.testing.assert_array_equal(arena.array[2 * ALIGN:len(data)], data[2 * ALIGN:])
        assert np.fromfile(path, dtype=np.uint8).tobytes() == data.tobytes()   # file untouched
    finally:
        reader.close()
        arena.close()


def test_huge_page_tail_is_charged_in_4k_pages_and_stays_out_of_huge_pages():
    from dynnet_ros.swap.swapin import HUGE_PAGE, arena_layout, huge_pages_available

    span = 12 * HUGE_PAGE + 3 * ALIGN
    if not huge_pages_available():
        pytest.skip("transparent huge pages unavailable")
    offsets, size = arena_layout([3 * ALIGN, span], True)
    arena = HostArena(size, huge_pages=True)
    arena.advise_spans(offsets, [3 * ALIGN, span])
    try:
        def rss_kb() -> int:
            with open("/proc/self/status") as handle:
                return next(int(line.split()[1]) for line in handle if line.startswith("VmRSS:"))

        before = rss_kb()
        arena.array[offsets[0]:offsets[0] + 3 * ALIGN] = 1  # a tail-only span: three 4 KiB pages
        grown = (rss_kb() - before) * 1024
        assert grown < HUGE_PAGE // 2, grown
    finally:
        arena.close()
