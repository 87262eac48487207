"""Zero-copy swap-in: block weights go from disk straight into the arena, never via the page cache.

SwapNet §4: a normal ``read`` leaves a second copy of every block in the page cache, which both
defeats the memory budget and thrashes under pressure.  We read with ``O_DIRECT`` into
page-aligned anonymous memory; where the filesystem refuses direct I/O (some tmpfs/overlay
setups) we fall back to ``pread`` followed by ``posix_fadvise(DONTNEED)`` so the cached copy is
dropped at once.  Swap-out is ``madvise(MADV_DONTNEED)``: weights never change, so nothing is
written back, and the pages return to the OS immediately.
"""
from __future__ import annotations

import contextlib
import errno
import mmap
import os
import threading
from collections.abc import Callable
from enum import Enum

import numpy as np

from dynnet_ros.bytesize import MB
from dynnet_ros.hostcaps import host_caps

ALIGN = 4096  # direct I/O granularity of the weight file and its reads (the logical block of every common disk)


def align_up(value: int, alignment: int = ALIGN) -> int:
    return (value + alignment - 1) // alignment * alignment


class IoMode(str, Enum):
    DIRECT = "odirect"
    BUFFERED = "pread+fadvise"


def decide_io_mode(*, prefer_direct: bool, direct_open_ok: bool, direct_read_ok: bool) -> IoMode:
    """Direct I/O only when asked for, and when both the open and an aligned probe read work."""
    if prefer_direct and direct_open_ok and direct_read_ok:
        return IoMode.DIRECT
    return IoMode.BUFFERED


HUGE_PAGE = 2 * MB  # the usual transparent huge page (x86, arm64 with 4 KiB pages); see huge_page_size


def huge_pages_available() -> bool:
    """Transparent huge pages of at most 2 MiB usable with madvise (hostcaps.py reads the kernel's)."""
    return host_caps().huge_page is not None


def huge_page_size() -> int:
    """The kernel's transparent huge page where one is usable, else the usual 2 MiB."""
    return host_caps().huge_page or HUGE_PAGE


def page_unit() -> int:
    """Granularity of arena slots and of ``madvise`` ranges: the base page (4 KiB on x86 and
    Jetson, 16/64 KiB on some arm64 kernels), never below the 4 KiB direct I/O needs."""
    return max(ALIGN, host_caps().page_size)


def arena_layout(spans: list[int], huge_pages: bool) -> tuple[list[int], int]:
    """Arena offset of each span and the arena size.

    With huge pages every span starts on a huge-page boundary: a swap-in then faults in few huge
    pages instead of thousands of 4 KiB ones (2-3x faster direct reads measured here), and a
    swap-out frees whole huge pages.  The price is resident rounding (see ``resident_bytes``).
    Without, spans start on base pages, so dropping one span's pages never touches another's.
    """
    unit = huge_page_size() if huge_pages else page_unit()
    offsets, cursor = [], 0
    for span in spans:
        cursor = align_up(cursor, unit)
        offsets.append(cursor)
        cursor += span
    return offsets, align_up(max(cursor, ALIGN), unit)


class HostArena:
    """Page-aligned private anonymous memory; regions become resident only while swapped in.

    MAP_PRIVATE matters: a shared anonymous mapping is shmem, counted in ``Cached`` and not
    freed by MADV_DONTNEED.
    """

    kind = "host"

    def __init__(self, size: int, *, huge_pages: bool = False) -> None:
        self.page = page_unit()
        self.size = align_up(max(size, ALIGN), self.page)
        self.huge_pages = huge_pages
        self.huge_page = huge_page_size()
        extra = self.huge_page if huge_pages else 0
        self._map = mmap.mmap(-1, self.size + extra, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS,
                              prot=mmap.PROT_READ | mmap.PROT_WRITE)
        whole = np.frombuffer(self._map, dtype=np.uint8)
        self._base = (-whole.ctypes.data) % self.huge_page if huge_pages else 0
        del whole
        if huge_pages and hasattr(mmap, "MADV_HUGEPAGE"):
            self._map.madvise(mmap.MADV_HUGEPAGE, self._base, self.size)
        self._view = memoryview(self._map)[self._base:self._base + self.size]
        #: the arena as bytes; None once closed (a live view would keep the mapping open)
        self.array: np.ndarray | None = np.frombuffer(self._view, dtype=np.uint8)

    def view(self, offset: int, nbytes: int) -> memoryview:
        return self._view[offset:offset + nbytes]

    def advise_spans(self, offsets: list[int], spans: list[int]) -> None:
        """Huge pages for each span's whole huge-page units only; its tail stays in base pages.

        Why: a 24.01 MB atom would otherwise fault a 13th huge page for its last 10 KB, and up
        to 2 MiB per resident atom is budget the scheduler could spend on prefetching instead.
        """
        if not (self.huge_pages and hasattr(mmap, "MADV_NOHUGEPAGE")):
            return
        for offset, span in zip(offsets, spans):
            body = span // self.huge_page * self.huge_page
            tail = align_up(span, self.huge_page) - body
            if tail:
                self._map.madvise(mmap.MADV_NOHUGEPAGE, self._base + offset + body, tail)

    def advise(self, offset: int, nbytes: int, advice: int) -> None:
        """``madvise`` a range of the arena (huge pages on or off where the platform has them)."""
        if nbytes > 0:
            self._map.madvise(advice, self._base + offset, nbytes)

    def release(self, offset: int, nbytes: int) -> None:
        """Drop the pages of ``[offset, offset+nbytes)``: no write-back, zero-filled if touched."""
        if nbytes:
            self._map.madvise(mmap.MADV_DONTNEED, self._base + offset, align_up(nbytes, self.page))

    def close(self) -> None:
        self.array = None
        self._view.release()
        with contextlib.suppress(BufferError):  # an onnxruntime value still views the arena; the GC unmaps it later
            self._map.close()


class WeightReader:
    """Reads aligned spans of the store's weight file into arena memory."""

    def __init__(self, path: str | os.PathLike, *, prefer_direct: bool = True,
                 opener: Callable[[str, int], int] = os.open) -> None:
        self.path = os.fspath(path)
        self._lock = threading.Lock()
        self._buffered_fd: int | None = opener(self.path, os.O_RDONLY)
        self._direct_fd: int | None = None
        direct_open_ok = direct_read_ok = False
        self.reason = "direct I/O not requested"
        if prefer_direct and hasattr(os, "O_DIRECT"):
            try:
                direct_fd = opener(self.path, os.O_RDONLY | os.O_DIRECT)
                self._direct_fd = direct_fd
                direct_open_ok = True
                direct_read_ok = self._probe(direct_fd)
                self.reason = "ok" if direct_read_ok else "aligned probe read failed (EINVAL)"
            except OSError as exc:
                self.reason = f"open(O_DIRECT) failed: {exc.strerror}"
        self.mode = decide_io_mode(prefer_direct=prefer_direct, direct_open_ok=direct_open_ok,
                                   direct_read_ok=direct_read_ok)
        if self.mode is IoMode.BUFFERED and self._direct_fd is not None:
            os.close(self._direct_fd)
            self._direct_fd = None

    @staticmethod
    def _probe(direct_fd: int) -> bool:
        scratch = mmap.mmap(-1, ALIGN, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        try:
            os.preadv(direct_fd, [memoryview(scratch)], 0)
            return True
        except OSError as exc:
            if exc.errno in (errno.EINVAL, errno.EOPNOTSUPP):
                return False
            raise
        finally:
            scratch.close()

    def read_into(self, view: memoryview, offset: int) -> int:
        """Fill ``view`` (page-aligned, length a multiple of 4096 for direct I/O) from ``offset``."""
        total = len(view)
        direct_fd, buffered_fd = self._direct_fd, self._buffered_fd
        if buffered_fd is None:
            raise ValueError(f"read from a closed WeightReader of {self.path}")
        if self.mode is IoMode.DIRECT:
            if direct_fd is None:  # DIRECT mode keeps its descriptor until close()
                raise RuntimeError(f"WeightReader of {self.path} is in direct mode without a direct descriptor")
            try:
                return self._read_all(direct_fd, view, offset)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                with self._lock:  # the filesystem changed its mind: fall back for good
                    self.mode, self.reason = IoMode.BUFFERED, f"pread(O_DIRECT) failed: {exc.strerror}"
        done = self._read_all(buffered_fd, view, offset)
        os.posix_fadvise(buffered_fd, offset, total, os.POSIX_FADV_DONTNEED)
        return done

    @staticmethod
    def _read_all(fd: int, view: memoryview, offset: int) -> int:
        done = 0
        total = len(view)
        while done < total:
            got = os.preadv(fd, [view[done:]], offset + done)
            if got <= 0:
                raise OSError(errno.EIO, f"short read: {done} of {total} bytes at offset {offset}")
            done += got
        return done

    def close(self) -> None:
        for fd in (self._direct_fd, self._buffered_fd):
            if fd is not None:
                os.close(fd)
        self._direct_fd = None
        self._buffered_fd = None
