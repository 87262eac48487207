"""Fast DDS shared-memory segments whose owner died: found and removed.

Why: a participant removes its shared-memory segment when it closes, but a process
killed (by the kernel's OOM killer, a crash, SIGKILL at a stop deadline) leaves them in
/dev/shm, where they hold memory until the machine restarts. The graph restarts crashed nodes,
and an image publisher's segment is 8 MiB (``graph_transport``), so each crash would leak that
much. The supervisor removes orphans when a node's process ends and when the graph stops.

Fast DDS holds an advisory lock (``flock``) on each segment's ``_el`` file for as long as the
owner lives: a lock this process can take means the owner is gone. This is the rule of Fast
DDS's own ``fastdds shm clean``. Ports (a few KiB each, shared by every participant of a
domain) are left to Fast DDS. Files younger than ``min_age_s`` are left
alone, so a participant between creating its files and locking them is never mistaken for an
orphan.
"""
from __future__ import annotations

import fcntl
import os
import re
import time
from collections.abc import Callable
from pathlib import Path

#: where Fast DDS keeps its shared memory on Linux
SHM_DIR = Path("/dev/shm")
#: a segment's lock file, ``fastdds_<16 hex digits>_el`` beside its segment ``fastdds_<same>``
_SEGMENT_LOCK = re.compile(r"^fastdds_[0-9a-f]{16}_el$")
#: how old a lock file must be before its unlocked state counts as its owner's death
MIN_AGE_S = 10.0


def owner_alive(lock_file: Path) -> bool:
    """Whether a process holds ``lock_file``'s lock (a file that cannot be opened counts as held:
    it is not ours to judge)."""
    try:
        fd = os.open(lock_file, os.O_RDONLY)
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def remove_orphans(directory: Path = SHM_DIR, min_age_s: float = MIN_AGE_S,
                   now: Callable[[], float] = time.time) -> list[tuple[Path, int]]:
    """Remove the Fast DDS segments in ``directory`` whose owner is gone; the files removed
    (each segment and its lock file) with their sizes in bytes. Files that vanish or cannot be
    removed meanwhile are skipped."""
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return []
    removed: list[tuple[Path, int]] = []
    for name in names:
        if not _SEGMENT_LOCK.match(name):
            continue
        lock_file = directory / name
        try:
            if now() - lock_file.stat().st_mtime < min_age_s:
                continue
        except OSError:
            continue
        if owner_alive(lock_file):
            continue
        for path in (directory / name[:-len("_el")], lock_file):
            try:
                size = path.stat().st_size
                path.unlink()
            except OSError:
                continue
            removed.append((path, size))
    return removed
