"""Memory monitors: system, memory cgroup and per-process RSS — no ROS imports.

One call, one `MemorySnapshot`: what the budget manager publishes and (later) what the budget
policy divides between models. cgroup readings matter in containers, where the limit binds
long before the machine's RAM does.
"""
from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import psutil

from dynnet_ros.budget.cgroup import CgroupPaths, locate_cgroup
from dynnet_ros.procmem import process_rss


@dataclass(frozen=True)
class MemorySnapshot:
    """Bytes everywhere. cgroup fields are None outside a memory cgroup; the limit also without a limit."""

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


def read_cgroup_memory(cgroup: CgroupPaths | None) -> tuple[int | None, int | None]:
    """(limit, usage) of the memory cgroup in bytes; limit None when none is set, both None when
    there is no cgroup or its files cannot be read."""
    if cgroup is None:
        return None, None
    try:
        reading = cgroup.read()
    except (OSError, ValueError):
        return None, None
    return reading.limit, reading.usage


def snapshot(pids: Iterable[int] = (), cgroup: CgroupPaths | None = None) -> MemorySnapshot:
    """System memory, this process's memory cgroup (``cgroup``, default: located now) and the RSS
    of ``pids``."""
    vm = psutil.virtual_memory()
    limit, current = read_cgroup_memory(locate_cgroup() if cgroup is None else cgroup)
    return MemorySnapshot(timestamp=time.time(), total_bytes=int(vm.total), available_bytes=int(vm.available),
                          used_bytes=int(vm.total - vm.available), cgroup_limit_bytes=limit,
                          cgroup_current_bytes=current, rss_bytes=process_rss(pids))
