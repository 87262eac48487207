"""Zero-copy swap-in: block weights go from disk straight into the arena, never via the page cache.

SwapNet §4: a normal ``read`` leaves a second copy of every block in the page cache, which both
defeats the memory budget and thrashes under pressure.  We read with ``O_DIRECT`` into
page-aligned anonymous memory; where the filesystem refuses direct I/O (some tmpfs/overlay
setups) we fall back to ``pread`` followed by ``posix_fadvise(DONTNEED)`` so the cached copy is
dropped at once.  Swap-out is ``madvise(MADV_DONTNEED)``: weights never change, so nothing is
written back, and the pages return to the OS immediately.

On Jetson-class devices (integrated GPU, unified memory) the arena should instead be CUDA
mapped pinned memory the GPU reads in place; ``decide_arena_kind`` makes that choice and
``CudaMappedArena`` implements it where pycuda is present.
"""
from __future__ import annotations

import errno
import mmap
import os
import threading
from dataclasses import dataclass
from enum import Enum
from typing import Callable

import numpy as np

ALIGN = 4096


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


HUGE_PAGE = 2 << 20


def huge_pages_available() -> bool:
    """Transparent huge pages usable with madvise (enabled is 'always' or 'madvise')."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as handle:
            return "[never]" not in handle.read()
    except OSError:
        return False


def arena_layout(spans: list[int], huge_pages: bool) -> tuple[list[int], int]:
    """Arena offset of each span and the arena size.

    With huge pages every span starts on a 2 MiB boundary: a swap-in then faults in few huge
    pages instead of thousands of 4 KiB ones (2-3x faster direct reads measured here), and a
    swap-out frees whole huge pages.  The price is resident rounding (see ``resident_bytes``).
    """
    unit = HUGE_PAGE if huge_pages else ALIGN
    offsets, cursor = [], 0
    for span in spans:
        cursor = align_up(cursor, unit)
        offsets.append(cursor)
        cursor += span
    return offsets, align_up(max(cursor, ALIGN), unit)


def resident_bytes(span: int, huge_pages: bool) -> int:
    """What a resident span adds to RSS: its huge-page body plus its tail in 4 KiB pages
    (``HostArena.advise_spans`` keeps the tail out of huge pages)."""
    if not span:
        return 0
    if not huge_pages:
        return align_up(span)
    body = span // HUGE_PAGE * HUGE_PAGE
    return body + align_up(span - body)


def huge_page_empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An uninitialised array whose whole 2 MiB units are transparent huge pages (the tail is
    4 KiB pages, so RSS grows by exactly its bytes, as with malloc).

    Why: activations go back to the OS after their last reader (the budget counts RSS), so the
    next frame faults them in again; a 4 KiB fault costs ~0.6 us per KiB on the development VM,
    a huge-page fault about a fifth of that.  Arrays below 2 MiB come from ``np.empty``.
    """
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize if shape else dtype.itemsize
    if nbytes < HUGE_PAGE or not hasattr(mmap, "MADV_HUGEPAGE"):
        return np.empty(shape, dtype)
    size = align_up(nbytes)
    # virtual slack only (never touched): room to start on a 2 MiB boundary
    region = mmap.mmap(-1, align_up(size, HUGE_PAGE) + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS,
                       prot=mmap.PROT_READ | mmap.PROT_WRITE)
    whole = np.frombuffer(region, dtype=np.uint8)
    base = (-whole.ctypes.data) % HUGE_PAGE
    body = size // HUGE_PAGE * HUGE_PAGE
    region.madvise(mmap.MADV_HUGEPAGE, base, body)
    if size > body and hasattr(mmap, "MADV_NOHUGEPAGE"):
        region.madvise(mmap.MADV_NOHUGEPAGE, base + body, HUGE_PAGE)
    return whole[base:base + nbytes].view(dtype).reshape(shape)


class HostArena:
    """Page-aligned private anonymous memory; regions become resident only while swapped in.

    MAP_PRIVATE matters: a shared anonymous mapping is shmem, counted in ``Cached`` and not
    freed by MADV_DONTNEED.
    """

    kind = "host"

    def __init__(self, size: int, *, huge_pages: bool = False) -> None:
        self.size = align_up(max(size, ALIGN))
        self.huge_pages = huge_pages
        extra = HUGE_PAGE if huge_pages else 0
        self._map = mmap.mmap(-1, self.size + extra, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS,
                              prot=mmap.PROT_READ | mmap.PROT_WRITE)
        whole = np.frombuffer(self._map, dtype=np.uint8)
        self._base = (-whole.ctypes.data) % HUGE_PAGE if huge_pages else 0
        del whole
        if huge_pages and hasattr(mmap, "MADV_HUGEPAGE"):
            self._map.madvise(mmap.MADV_HUGEPAGE, self._base, self.size)
        self._view = memoryview(self._map)[self._base:self._base + self.size]
        self.array = np.frombuffer(self._view, dtype=np.uint8)

    def view(self, offset: int, nbytes: int) -> memoryview:
        return self._view[offset:offset + nbytes]

    def advise_spans(self, offsets: list[int], spans: list[int]) -> None:
        """Huge pages for each span's whole 2 MiB units only; its tail stays in 4 KiB pages.

        Why: a 24.01 MB atom would otherwise fault a 13th huge page for its last 10 KB, and up
        to 2 MiB per resident atom is budget the scheduler could spend on prefetching instead.
        """
        if not (self.huge_pages and hasattr(mmap, "MADV_NOHUGEPAGE")):
            return
        for offset, span in zip(offsets, spans):
            body = span // HUGE_PAGE * HUGE_PAGE
            tail = align_up(span, HUGE_PAGE) - body
            if tail:
                self._map.madvise(mmap.MADV_NOHUGEPAGE, self._base + offset + body, tail)

    def advise(self, offset: int, nbytes: int, advice: int) -> None:
        """``madvise`` a range of the arena (huge pages on or off where the platform has them)."""
        if nbytes > 0:
            self._map.madvise(advice, self._base + offset, nbytes)

    def release(self, offset: int, nbytes: int) -> None:
        """Drop the pages of ``[offset, offset+nbytes)``: no write-back, zero-filled if touched."""
        if nbytes:
            self._map.madvise(mmap.MADV_DONTNEED, self._base + offset, align_up(nbytes))

    def close(self) -> None:
        self.array = None
        self._view.release()
        try:
            self._map.close()
        except BufferError:  # an onnxruntime value still views the arena; the GC unmaps it later
            pass


class WeightReader:
    """Reads aligned spans of the store's weight file into arena memory."""

    def __init__(self, path: str | os.PathLike, *, prefer_direct: bool = True,
                 opener: Callable[[str, int], int] = os.open) -> None:
        self.path = os.fspath(path)
        self._lock = threading.Lock()
        self._buffered_fd = opener(self.path, os.O_RDONLY)
        self._direct_fd: int | None = None
        direct_open_ok = direct_read_ok = False
        self.reason = "direct I/O not requested"
        if prefer_direct and hasattr(os, "O_DIRECT"):
            try:
                self._direct_fd = opener(self.path, os.O_RDONLY | os.O_DIRECT)
                direct_open_ok = True
                direct_read_ok = self._probe()
                self.reason = "ok" if direct_read_ok else "aligned probe read failed (EINVAL)"
            except OSError as exc:
                self.reason = f"open(O_DIRECT) failed: {exc.strerror}"
        self.mode = decide_io_mode(prefer_direct=prefer_direct, direct_open_ok=direct_open_ok,
                                   direct_read_ok=direct_read_ok)
        if self.mode is IoMode.BUFFERED and self._direct_fd is not None:
            os.close(self._direct_fd)
            self._direct_fd = None

    def _probe(self) -> bool:
        scratch = mmap.mmap(-1, ALIGN, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        try:
            os.preadv(self._direct_fd, [memoryview(scratch)], 0)
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
        if self.mode is IoMode.DIRECT:
            try:
                return self._read_all(self._direct_fd, view, offset)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                with self._lock:  # the filesystem changed its mind: fall back for good
                    self.mode, self.reason = IoMode.BUFFERED, f"pread(O_DIRECT) failed: {exc.strerror}"
        done = self._read_all(self._buffered_fd, view, offset)
        os.posix_fadvise(self._buffered_fd, offset, total, os.POSIX_FADV_DONTNEED)
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


# --------------------------------------------------------------------------------------- CUDA
@dataclass(frozen=True)
class CudaInfo:
    available: bool
    integrated: bool = False
    can_map_host: bool = False
    library: str | None = None
    reason: str = ""


class ArenaKind(str, Enum):
    HOST = "host"                  # CPU execution: private anonymous pages + O_DIRECT
    CUDA_MAPPED = "cuda-mapped"    # integrated GPU (Jetson): pinned, mapped; GPU reads in place
    CUDA_PINNED = "cuda-pinned"    # discrete GPU: pinned staging, one DMA copy to device memory


def decide_arena_kind(backend: str, cuda: CudaInfo) -> ArenaKind:
    """SwapNet's unified-addressing rule: only a GPU that shares host memory and can map pinned
    pages avoids the CPU->GPU copy; CPU execution never needs CUDA memory."""
    if backend not in ("tensorrt", "cuda") or not cuda.available:
        return ArenaKind.HOST
    if cuda.integrated and cuda.can_map_host:
        return ArenaKind.CUDA_MAPPED
    return ArenaKind.CUDA_PINNED


def probe_cuda() -> CudaInfo:
    """What the CUDA runtime says about device 0 (pycuda first, then cuda-python)."""
    try:
        import pycuda.driver as cuda  # type: ignore[import-not-found]

        cuda.init()
        device = cuda.Device(0)
        attrs = device.get_attributes()
        return CudaInfo(True, bool(attrs.get(cuda.device_attribute.INTEGRATED, 0)),
                        bool(attrs.get(cuda.device_attribute.CAN_MAP_HOST_MEMORY, 0)), "pycuda")
    except ImportError:
        pass
    except Exception as exc:  # driver present but no device, etc.
        return CudaInfo(False, reason=f"pycuda: {exc}")
    try:
        from cuda.bindings import runtime as cudart  # type: ignore[import-not-found]

        err, integrated = cudart.cudaDeviceGetAttribute(cudart.cudaDeviceAttr.cudaDevAttrIntegrated, 0)
        if int(err) != 0:
            return CudaInfo(False, library="cuda-python", reason=f"cudaDeviceGetAttribute error {int(err)}")
        _, can_map = cudart.cudaDeviceGetAttribute(cudart.cudaDeviceAttr.cudaDevAttrCanMapHostMemory, 0)
        return CudaInfo(True, bool(integrated), bool(can_map), "cuda-python")
    except ImportError:
        return CudaInfo(False, reason="neither pycuda nor cuda-python is importable")
    except Exception as exc:
        return CudaInfo(False, reason=f"cuda-python: {exc}")


class CudaMappedArena:
    """Pinned, device-mapped host buffers allocated per swap-in and freed at swap-out.

    Pinned pages cannot be given back piecemeal with madvise, so unlike HostArena this arena
    allocates a buffer per resident block; the GPU reads it through its device pointer.
    """

    kind = "cuda-mapped"

    def __init__(self) -> None:
        import pycuda.autoinit  # noqa: F401  (creates the context)
        import pycuda.driver as cuda

        self._cuda = cuda
        self._buffers: dict[int, np.ndarray] = {}

    def acquire(self, key: int, nbytes: int) -> tuple[np.ndarray, int]:
        """(host array, device pointer) of a fresh mapped buffer for ``key``."""
        flags = self._cuda.host_alloc_flags.DEVICEMAP
        host = self._cuda.pagelocked_empty(align_up(nbytes), np.uint8, mem_flags=flags)
        self._buffers[key] = host
        return host, int(host.base.get_device_pointer())

    def release(self, key: int) -> None:
        buffer = self._buffers.pop(key, None)
        if buffer is not None:
            buffer.base.free()

    def close(self) -> None:
        for key in list(self._buffers):
            self.release(key)
