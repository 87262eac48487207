"""Memory monitors: system, cgroup v2 and per-process RSS — no ROS imports.

One call, one `MemorySnapshot`: what the budget manager publishes and (later) what the budget
policy divides between models. cgroup v2 readings matter in containers, where the limit binds
long before the machine's RAM does.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import psutil

CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class MemorySnapshot:
    """Bytes everywhere. cgroup fields are None outside a cgroup v2 hierarchy or without a limit."""

    timestamp: float
    total_bytes: int
    available_bytes: int
    used_bytes: int
    cgroup_limit_bytes: int | None = None
    cgroup_current_bytes: int | None = None
    rss_bytes: dict[int, int] = field(default_factory=dict)  # pid -> RSS; vanished pids are left out

    @property
    def effective_available_bytes(self) -> int:
        """What new allocations can still get: the tighter of the system and the cgroup."""
        if self.cgroup_limit_bytes is None or self.cgroup_current_bytes is None:
            return self.available_bytes
        return min(self.available_bytes, max(0, self.cgroup_limit_bytes - self.cgroup_current_bytes))


def _cgroup_dir(root: Path) -> Path | None:
    """This process's cgroup v2 directory (unified hierarchy: one '0::/path' line)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("0::"):
            candidate = root / line[3:].lstrip("/")
            if (candidate / "memory.current").exists():
                return candidate
            if (root / "memory.current").exists():  # namespaced container: our cgroup is the root
                return root
    return None


def read_cgroup_memory(root: Path = CGROUP_ROOT) -> tuple[int | None, int | None]:
    """(memory.max, memory.current) in bytes; memory.max 'max' (no limit) gives None."""
    directory = _cgroup_dir(root)
    if directory is None:
        return None, None
    try:
        raw_max = (directory / "memory.max").read_text().strip()
        current = int((directory / "memory.current").read_text().strip())
    except (OSError, ValueError):
        return None, None
    limit = None if raw_max == "max" else int(raw_max)
    return limit, current


def process_rss(pids: Iterable[int]) -> dict[int, int]:
    """RSS per pid; pids that exited or are not readable are skipped."""
    out: dict[int, int] = {}
    for pid in pids:
        try:
            out[int(pid)] = psutil.Process(int(pid)).memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, ValueError):
            continue
    return out


def snapshot(pids: Iterable[int] = (), cgroup_root: Path = CGROUP_ROOT) -> MemorySnapshot:
    vm = psutil.virtual_memory()
    limit, current = read_cgroup_memory(cgroup_root)
    return MemorySnapshot(timestamp=time.time(), total_bytes=int(vm.total), available_bytes=int(vm.available),
                          used_bytes=int(vm.total - vm.available), cgroup_limit_bytes=limit,
                          cgroup_current_bytes=current, rss_bytes=process_rss(pids))
