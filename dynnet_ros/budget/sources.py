"""Where the DNN memory pool comes from: system, cgroup and Jetson readings, and the chooser.

Every reader is split in two: a pure parser over the text of a kernel file (unit-tested on
fixture files) and a thin function that reads the real file. The chooser takes the *most
restrictive* reading, because a container limit or the GPU's share on a Jetson can bind long
before the machine as a whole runs out.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

MIB = 1024 * 1024
# cgroup v1 reports "no limit" as LONG_MAX rounded down to a page; anything this large is no limit.
_UNLIMITED_BYTES = 1 << 60


@dataclass(frozen=True)
class MemoryReading:
    """One view of memory, in MiB. ``available_mb`` is what new allocations can still get."""

    source: str
    total_mb: float
    available_mb: float
    gpu_shared_mb: float = 0.0  # Jetson: NvMapMemUsed (GPU allocations, not in any process's RSS)
    details: dict = field(default_factory=dict)


# --------------------------------------------------------------------------- pure parsers

def parse_meminfo(text: str) -> dict[str, int]:
    """``/proc/meminfo`` → {key: bytes}. Values without a unit (HugePages_*) stay counts."""
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
    return MemoryReading(source, total / MIB, max(0, available) / MIB,
                         details={"mem_available_mb": available / MIB})


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
    available = min(base.available_mb * MIB, max(0, cuda_allocatable))
    return MemoryReading("jetson", total / MIB, available / MIB, gpu_shared_mb=nvmap / MIB,
                         details={"mem_available_mb": base.available_mb, "nvmap_used_mb": nvmap / MIB,
                                  "cuda_allocatable_mb": cuda_allocatable / MIB})


def is_jetson_meminfo(info: dict[str, int]) -> bool:
    return "NvMapMemUsed" in info


def parse_limit_bytes(text: str) -> int | None:
    """A cgroup limit file: ``max`` (v2) or a huge number (v1) → None (no limit)."""
    value = text.strip()
    if not value or value == "max":
        return None
    try:
        number = int(value)
    except ValueError as exc:
        raise ValueError(f"unparseable cgroup memory limit {value!r}") from exc
    return None if number >= _UNLIMITED_BYTES else number


def parse_memory_stat(text: str) -> dict[str, int]:
    """``memory.stat`` → {key: value} (both cgroup versions use 'key value' lines)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2:
            try:
                out[parts[0]] = int(parts[1])
            except ValueError:
                continue
    return out


def reading_from_cgroup(version: int, limit_text: str, usage_text: str,
                        stat_text: str = "") -> MemoryReading | None:
    """A cgroup's headroom: limit − usage + reclaimable file cache. None when no limit is set.

    ``usage`` counts the group's page cache, which the kernel reclaims before it OOM-kills,
    so the inactive file pages are added back (the same rule ``docker stats`` uses).
    """
    limit = parse_limit_bytes(limit_text)
    if limit is None:
        return None
    try:
        usage = int(usage_text.strip())
    except ValueError as exc:
        raise ValueError(f"unparseable cgroup memory usage {usage_text.strip()!r}") from exc
    stat = parse_memory_stat(stat_text)
    inactive = stat.get("inactive_file" if version == 2 else "total_inactive_file",
                        stat.get("inactive_file", 0))
    available = max(0, limit - usage + min(inactive, usage))
    return MemoryReading(f"cgroup-v{version}", limit / MIB, min(limit, available) / MIB,
                         details={"limit_mb": limit / MIB, "usage_mb": usage / MIB,
                                  "inactive_file_mb": inactive / MIB})


@dataclass(frozen=True)
class CgroupPaths:
    """Files of this process's memory cgroup (v2: memory.max; v1: memory.limit_in_bytes)."""

    version: int
    directory: Path

    @property
    def limit_file(self) -> Path:
        return self.directory / ("memory.max" if self.version == 2 else "memory.limit_in_bytes")

    @property
    def usage_file(self) -> Path:
        return self.directory / ("memory.current" if self.version == 2 else "memory.usage_in_bytes")

    @property
    def stat_file(self) -> Path:
        return self.directory / "memory.stat"


def find_cgroup(proc_cgroup: str, mountinfo: str, root: Path = Path("/")) -> CgroupPaths | None:
    """Locate this process's memory cgroup from ``/proc/self/cgroup`` and ``/proc/self/mountinfo``.

    Prefers v2 (``0::/path`` on a cgroup2 mount with memory.max); falls back to a v1 ``memory``
    controller. Inside a container without a cgroup namespace the listed path may not exist
    below the mount; then the mount root is the container's own group.
    """
    v2_mount = v1_mount = None
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, rfields = left.split(), right.split()
        if len(fields) < 5 or not rfields:
            continue
        mount_point, fstype = fields[4], rfields[0]
        options = rfields[2].split(",") if len(rfields) > 2 else []
        if fstype == "cgroup2" and v2_mount is None:
            v2_mount = mount_point
        elif fstype == "cgroup" and "memory" in options and v1_mount is None:
            v1_mount = mount_point
    v2_path = v1_path = None
    for line in proc_cgroup.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        hier, controllers, path = parts
        if hier == "0" and controllers == "":
            v2_path = path
        elif "memory" in controllers.split(","):
            v1_path = path
    candidates: list[tuple[int, str, str]] = []
    if v2_mount and v2_path is not None:
        candidates.append((2, v2_mount, v2_path))
    if v1_mount and v1_path is not None:
        candidates.append((1, v1_mount, v1_path))
    for version, mount, path in candidates:
        mount_dir = root / mount.lstrip("/")
        for directory in (mount_dir / path.lstrip("/"), mount_dir):
            paths = CgroupPaths(version, directory)
            if paths.limit_file.is_file() and paths.usage_file.is_file():
                return paths
    return None


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
        self._cgroup: CgroupPaths | None | bool = False  # False = not looked up yet

    def _proc(self, name: str) -> Path:
        return self.root / "proc" / name

    def cgroup(self) -> CgroupPaths | None:
        if self._cgroup is False:
            try:
                self._cgroup = find_cgroup(_read(self._proc("self/cgroup")),
                                           _read(self._proc("self/mountinfo")), self.root)
            except OSError:
                self._cgroup = None
        return self._cgroup  # type: ignore[return-value]

    def readings(self) -> list[MemoryReading]:
        readings: list[MemoryReading] = []
        info: dict[str, int] = {}
        try:
            info = parse_meminfo(_read(self._proc("meminfo")))
        except OSError:
            pass
        if info and is_jetson_meminfo(info):
            readings.append(reading_from_jetson_meminfo(info))
        elif self.use_psutil:
            import psutil  # local: keeps the pure parsers importable without psutil

            vm = psutil.virtual_memory()
            readings.append(MemoryReading("psutil", vm.total / MIB, vm.available / MIB,
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


@dataclass(frozen=True)
class ProcessMemory:
    """A process's resident memory in MiB: all of it, and the anonymous part.

    Only the anonymous part (heap, arenas, anonymous mmaps, shmem) is missing from the system's
    ``MemAvailable``; resident file pages (mapped libraries, an mmap-ed model file) are page
    cache the kernel can reclaim, which ``MemAvailable`` already counts as available.
    """

    rss_mb: float
    anon_mb: float


def parse_proc_status(text: str) -> ProcessMemory:
    """``/proc/<pid>/status`` → ProcessMemory (RssAnon + RssShmem as the anonymous part)."""
    info = parse_meminfo(text)  # same "Key:   value kB" layout
    if "VmRSS" not in info:
        raise ValueError("process status has no VmRSS line")
    anon = info.get("RssAnon", info["VmRSS"]) + info.get("RssShmem", 0)
    return ProcessMemory(info["VmRSS"] / MIB, anon / MIB)


def process_memory(pid: int | None = None) -> ProcessMemory:
    """This process's (or ``pid``'s) memory; psutil's RSS where /proc is not available."""
    try:
        return parse_proc_status(Path(f"/proc/{pid or 'self'}/status").read_text())
    except (OSError, ValueError):
        import psutil

        rss = psutil.Process(pid if pid is not None else os.getpid()).memory_info().rss / MIB
        return ProcessMemory(rss, rss)
