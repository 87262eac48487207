"""This process's memory cgroup (v2 or v1): where its files are, and what they say.

Why its own module: the memory pool (sources.py) and the budget manager's snapshot
(monitors.py) both bound memory by the container's limit, and must find and read the same group.
The parsers take file text (unit-tested on fixtures); ``locate_cgroup`` and ``CgroupPaths.read``
touch the real files.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# cgroup v1 reports "no limit" as LONG_MAX rounded down to a page; anything this large is no limit.
_UNLIMITED_BYTES = 1 << 60


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


def parse_usage_bytes(text: str) -> int:
    """A cgroup usage file (v2 ``memory.current``, v1 ``memory.usage_in_bytes``) → bytes."""
    try:
        return int(text.strip())
    except ValueError as exc:
        raise ValueError(f"unparseable cgroup memory usage {text.strip()!r}") from exc


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


@dataclass(frozen=True)
class CgroupUsage:
    """One read of a memory cgroup, in bytes; ``limit`` None means no limit is set."""

    limit: int | None
    usage: int
    stat_text: str


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

    def read(self) -> CgroupUsage:
        """Limit, usage and ``memory.stat`` now (OSError, or ValueError for unparseable files)."""
        stat = self.stat_file.read_text() if self.stat_file.is_file() else ""
        return CgroupUsage(parse_limit_bytes(self.limit_file.read_text()),
                           parse_usage_bytes(self.usage_file.read_text()), stat)


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


def locate_cgroup(root: Path = Path("/")) -> CgroupPaths | None:
    """This process's memory cgroup below ``root`` (a fixture tree in tests); None if there is none."""
    try:
        return find_cgroup((root / "proc/self/cgroup").read_text(), (root / "proc/self/mountinfo").read_text(), root)
    except OSError:
        return None
