"""Process memory counters (Linux ``/proc/<pid>/status``): the one place RSS is read.

Why one module: budgets, the budget manager, calibration and the benchmarks all measure the same
quantity — resident memory (``VmRSS``), its high-water mark (``VmHWM``) and its anonymous part —
and must read it alike. psutil stands in only where ``/proc`` is missing (non-Linux).
"""
from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import psutil

from dynnet_ros.bytesize import MB


def parse_kb_fields(text: str) -> dict[str, int]:
    """``Key:   value kB`` lines (``/proc/meminfo``, ``/proc/<pid>/status``) → {key: bytes}.

    Values without a unit (HugePages_*, Threads) stay counts; lines without a number are skipped.
    """
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, sep, rest = line.partition(":")
        if not sep:
            continue
        parts = rest.split()
        if not parts:
            continue
        try:
            value = int(parts[0])
        except ValueError:
            continue
        unit = parts[1].lower() if len(parts) > 1 else ""
        out[key.strip()] = value * 1024 if unit == "kb" else value
    return out


def _status_path(pid: int | None) -> Path:
    return Path(f"/proc/{'self' if pid is None else pid}/status")


def status_bytes(key: str, pid: int | None = None) -> int:
    """``VmRSS``, ``VmHWM``, ... of this process (or ``pid``) in bytes (KeyError if the kernel has
    no such line)."""
    return parse_kb_fields(_status_path(pid).read_text())[key]


def reset_peak_rss() -> bool:
    """Reset this process's ``VmHWM`` to its current RSS (Linux >= 4.0: ``/proc/self/clear_refs``
    = 5), so a peak measured next excludes what came before; False where not permitted."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
    except OSError:
        return False
    return True


@dataclass(frozen=True)
class ProcessMemory:
    """A process's resident memory in MB: all of it, and the anonymous part.

    Only the anonymous part (heap, arenas, anonymous mmaps, shmem) is missing from the system's
    ``MemAvailable``; resident file pages (mapped libraries, an mmap-ed model file) are page
    cache the kernel can reclaim, which ``MemAvailable`` already counts as available.
    """

    rss_mb: float
    anon_mb: float


def parse_proc_status(text: str) -> ProcessMemory:
    """``/proc/<pid>/status`` → ProcessMemory (RssAnon + RssShmem as the anonymous part)."""
    info = parse_kb_fields(text)
    if "VmRSS" not in info:
        raise ValueError("process status has no VmRSS line")
    anon = info.get("RssAnon", info["VmRSS"]) + info.get("RssShmem", 0)
    return ProcessMemory(info["VmRSS"] / MB, anon / MB)


def process_memory(pid: int | None = None) -> ProcessMemory:
    """This process's (or ``pid``'s) memory; psutil's RSS where /proc is not available."""
    try:
        return parse_proc_status(_status_path(pid).read_text())
    except (OSError, ValueError):
        rss = psutil.Process(pid if pid is not None else os.getpid()).memory_info().rss / MB
        return ProcessMemory(rss, rss)


def process_rss(pids: Iterable[int]) -> dict[int, int]:
    """RSS in bytes per pid; pids that exited or are not readable are left out."""
    out: dict[int, int] = {}
    for pid in pids:
        try:
            out[int(pid)] = int(process_memory(int(pid)).rss_mb * MB)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, ValueError):
            continue
    return out
