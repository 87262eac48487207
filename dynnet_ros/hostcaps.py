"""What this machine's CPU and kernel offer the planned engine and the weight streamer, read once.

Why a module of its own: three things the fast paths rely on exist on some machines only —
onnxruntime's blocked-layout (NCHWc) convolution kernels (MLAS has them on x86 with AVX or
AVX-512 only; ARM CPUs such as Jetson's have none), 2 MiB transparent huge pages (an arm64
kernel with 64 KiB base pages has 512 MiB ones, and some kernels have none) and the 4 KiB base
page that the weight arena's slots and ``madvise`` ranges assume (16/64 KiB on some arm64
kernels). Each is read from the running system here, never inferred from the architecture name,
and the code that needs one asks ``host_caps()``. ``override`` swaps in other values for a
``with`` block, so a test runs the non-x86 branches on this machine without touching the
environment of anything else.
"""
from __future__ import annotations

import os
import platform
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from dynnet_ros.bytesize import MB

THP_DIR = Path("/sys/kernel/mm/transparent_hugepage")
#: Huge pages above this are not used: every streamed tensor would fault in (and the budget
#: would be charged) a whole huge page, and its slot in the arena would be aligned to one.
MAX_HUGE_PAGE = 2 * MB


@dataclass(frozen=True)
class HostCaps:
    """The host facts the engine's platform-specific paths depend on."""

    machine: str             # platform.machine(): x86_64, aarch64, ...
    nchwc_block: int | None  # MLAS's NCHWc channel block (16 AVX-512F, 8 AVX/AVX2); None: no NCHWc kernels
    page_size: int           # base page: arena slots start on it, madvise ranges are whole ones
    huge_page: int | None    # transparent huge page size usable with madvise; None: off or too big

    @property
    def x86(self) -> bool:
        return self.machine.lower() in ("x86_64", "amd64", "i386", "i686")


def nchwc_block_size(machine: str, cpuinfo: str) -> int | None:
    """MLAS's NCHWc block for a CPU: it builds NCHWc kernels for x86 only, 16 floats wide with
    AVX-512F and 8 with AVX/AVX2; ``cpuinfo`` is /proc/cpuinfo's text."""
    if machine.lower() not in ("x86_64", "amd64", "i386", "i686"):
        return None
    flags = next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines() if line.startswith("flags")), [])
    if "avx512f" in flags:
        return 16
    if "avx" in flags or "avx2" in flags:
        return 8
    return None


def usable_huge_page(enabled: str, pmd_size: str | None) -> int | None:
    """The huge page size to align and advise for, from the kernel's THP ``enabled`` mode
    (``always [madvise] never``) and ``hpage_pmd_size``; None where madvise gets none or the
    size is above ``MAX_HUGE_PAGE``. Kernels without ``hpage_pmd_size`` (before 4.x) use 2 MiB."""
    if "[never]" in enabled or "[" not in enabled:
        return None
    try:
        size = int(pmd_size) if pmd_size is not None else 2 * MB
    except ValueError:
        return None
    return size if 0 < size <= MAX_HUGE_PAGE else None


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def detect() -> HostCaps:
    """Read the facts from the running system (no cache; ``host_caps`` keeps the result)."""
    machine = platform.machine()
    pmd = _read(THP_DIR / "hpage_pmd_size")
    return HostCaps(machine=machine,
                    nchwc_block=nchwc_block_size(machine, _read(Path("/proc/cpuinfo")) or ""),
                    page_size=int(os.sysconf("SC_PAGE_SIZE")),
                    huge_page=usable_huge_page(_read(THP_DIR / "enabled") or "", pmd.strip() if pmd else None))


_lock = threading.Lock()
_detected: HostCaps | None = None
_override: HostCaps | None = None


def host_caps() -> HostCaps:
    """This machine's capabilities (detected once per process), or the active ``override``."""
    global _detected
    if _override is not None:
        return _override
    with _lock:
        if _detected is None:
            _detected = detect()
        return _detected


@contextmanager
def override(**changes) -> Iterator[HostCaps]:
    """Within the block, ``host_caps()`` returns the detected values with ``changes`` applied,
    e.g. ``override(machine="aarch64", nchwc_block=None, page_size=65536, huge_page=None)``.
    Process-wide (a test's engine threads see it too); not for use while other threads
    build engines they expect to see the real host."""
    global _override
    previous = _override
    _override = replace(host_caps(), **changes)
    try:
        yield _override
    finally:
        _override = previous
