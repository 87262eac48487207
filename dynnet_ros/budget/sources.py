"""Where the DNN memory pool comes from: system, cgroup and Jetson readings, and the chooser.

Every reader is split in two: a pure parser over the text of a kernel file (unit-tested on
fixture files) and a thin function that reads the real file. The chooser takes the *most
restrictive* reading, because a container limit or the GPU's share on a Jetson can bind long
before the machine as a whole runs out.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from dynnet_ros.budget.cgroup import CgroupPaths, locate_cgroup, parse_limit_bytes, parse_memory_stat, parse_usage_bytes
from dynnet_ros.bytesize import MB
from dynnet_ros.procmem import parse_kb_fields


@dataclass(frozen=True)
class MemoryReading:
    """One view of memory, in MiB. ``available_mb`` is what new allocations can still get."""
    source: str
    total_mb: float
    available_mb: float
    gpu_shared_mb: float = 0.0  # Jetson: NvMapMemUsed (GPU allocations, not in any process's RSS)
    details: dict = field(default_factory=dict)


# --------------------------------------------------------------------------- pure parsers

#: ``/proc/meminfo`` → {key: bytes}: the same "Key: value kB" layout as a process's status.
parse_meminfo = parse_kb_fields


def reading_from_meminfo(info: dict[str, int], source: str = "meminfo") -> MemoryReading:
    """System reading from parsed meminfo; kernels without MemAvailable (< 3.14) get an estimate."""
    if "MemTotal" not in info:
        raise ValueError("meminfo has no MemTotal line")
    total = info["MemTotal"]
    if "MemAvailable" in info:
        available = info["MemAvailable"]
    else:
        available = info.get("MemFree", 0) + info.get("Buffers", 0) + info.get("Cached", 0) \
            + info.get("SReclaimable", 0) - info.get("Shmem", 0)
    return MemoryReading(source, total / MB, max(0, available) / MB,
                         details={"mem_available_mb": available / MB})


def reading_from_jetson_meminfo(info: dict[str, int]) -> MemoryReading:
    """Jetson (unified memory): CPU and GPU share DRAM; GPU allocations show as ``NvMapMemUsed``.

    ``MemAvailable`` already excludes NvMap pages, so it stays the pool; what NvMap adds is the
    GPU memory the DNN processes hold, which their RSS does not show. We also apply NVIDIA's
    "CUDA for Tegra" allocatable-memory rule (used host memory beyond free swap cannot be given
    to the GPU) as a second bound, and keep the more restrictive.
    """
    base = reading_from_meminfo(info, source="jetson")
    nvmap = info.get("NvMapMemUsed", 0)
    total = info["MemTotal"]
    reclaimable = info.get("Buffers", 0) + info.get("Cached", 0) + info.get("SReclaimable", 0)
    host_used = max(0, total - info.get("MemFree", 0) - reclaimable - nvmap)
    swap_free = info.get("SwapFree", 0)
    cuda_allocatable = total - nvmap - max(0, host_used - swap_free)
    available = min(base.available_mb * MB, max(0, cuda_allocatable))
    return MemoryReading("jetson", total / MB, available / MB, gpu_shared_mb=nvmap / MB,
                         details={"mem_available_mb": base.available_mb, "nvmap_used_mb": nvmap / MB,
                                  "cuda_allocatable_mb": cuda_allocatable / MB})


def is_jetson_meminfo(info: dict[str, int]) -> bool:
    return "NvMapMemUsed" in info


def reading_from_cgroup(version: int, limit_text: str, usage_text: str,
                        stat_text: str = "") -> MemoryReading | None:
    """A cgroup's headroom: limit − usage + reclaimable file cache. None when no limit is set.

    ``usage`` counts the group's page cache, which the kernel reclaims before it OOM-kills,
    so the inactive file pages are added back (the same rule ``docker stats`` uses).
    """
    limit = parse_limit_bytes(limit_text)
    if limit is None:
        return None
    usage = parse_usage_bytes(usage_text)
    stat = parse_memory_stat(stat_text)
    inactive = stat.get("inactive_file" if version == 2 else "total_inactive_file",
                        stat.get("inactive_file", 0))
    available = max(0, limit - usage + min(inactive, usage))
    return MemoryReading(f"cgroup-v{version}", limit / MB, min(limit, available) / MB,
                         details={"limit_mb": limit / MB, "usage_mb": usage / MB,
                                  "inactive_file_mb": inactive / MB})


def choose(readings: list[MemoryReading]) -> MemoryReading:
    """The binding reading: least available memory wins; its source names the constraint."""
    if not readings:
        raise ValueError("no memory readings to choose from")
    best = min(readings, key=lambda r: r.available_mb)
    gpu = max(r.gpu_shared_mb for r in readings)
    details = dict(best.details)
    details["candidates"] = {r.source: round(r.available_mb, 1) for r in readings}
    return MemoryReading(best.source, best.total_mb, best.available_mb, gpu_shared_mb=gpu,
                         details=details)


# --------------------------------------------------------------------------- real files

def _read(path: Path) -> str:
    return path.read_text()


class MemorySource:
    """Reads the real machine. ``root`` lets tests point every path at a fixture tree."""
    def __init__(self, root: Path | str = "/", *, use_psutil: bool = True) -> None:
        self.root = Path(root)
        self.use_psutil = use_psutil and self.root == Path("/")
        self._cgroup: CgroupPaths | None = None
        self._cgroup_located = False

    def _proc(self, name: str) -> Path:
        return self.root / "proc" / name

    def cgroup(self) -> CgroupPaths | None:
        if not self._cgroup_located:
            self._cgroup = locate_cgroup(self.root)
            self._cgroup_located = True
        return self._cgroup

    def readings(self) -> list[MemoryReading]:
        readings: list[MemoryReading] = []
        info: dict[str, int] = {}
        with contextlib.suppress(OSError):
            info = parse_meminfo(_read(self._proc("meminfo")))
        if info and is_jetson_meminfo(info):
            readings.append(reading_from_jetson_meminfo(info))
        elif self.use_psutil:
            vm = psutil.virtual_memory()
            readings.append(MemoryReading("psutil", vm.total / MB, vm.available / MB,
                                          details={"percent": vm.percent}))
        elif info:
            readings.append(reading_from_meminfo(info))
        cg = self.cgroup()
        if cg is not None:
            try:
                stat = _read(cg.stat_file) if cg.stat_file.is_file() else ""
                reading = reading_from_cgroup(cg.version, _read(cg.limit_file), _read(cg.usage_file), stat)
            except (OSError, ValueError):
                reading = None
            if reading is not None:
                readings.append(reading)
        if not readings:
            raise OSError(f"no memory information under {self.root}")
        return readings

    def read(self) -> MemoryReading:
        return choose(self.readings())
