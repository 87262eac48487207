"""Where a bag may be written: the output path checked before anything is created.

Apart from the writer (which imports rosbags) so that a command that only takes a bag's name
(`dynnet up --record`) checks it without loading the bag library.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

#: the storages a bag is written in (rosbags' plugins, by the names rosbag2 gives them)
STORAGE_NAMES = ("mcap", "sqlite3")


def check_output(path: str | Path, storage: str = "mcap") -> Path:
    """The output path, checked: ValueError (one line) when it exists, its directory is missing or
    not writable, or the storage does not suit it; nothing is created."""
    out = Path(path)
    if storage not in STORAGE_NAMES:
        raise ValueError(f"unknown bag storage {storage!r}; choose one of {list(STORAGE_NAMES)}")
    if out.suffix == ".mcap" and storage != "mcap":
        raise ValueError(f"{out}: a .mcap output is an MCAP file; give a directory name for a {storage} bag")
    if out.suffix in (".db3", ".bag"):
        raise ValueError(f"{out}: write a {out.suffix} bag as a rosbag2 directory (a name without {out.suffix})")
    if out.exists() or out.is_symlink():
        raise ValueError(f"{out} exists already; not overwriting (choose a new name)")
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise ValueError(f"{out}: directory {parent} does not exist")
    try:  # a real probe: permission bits say nothing for root, nor about read-only or special file systems
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as exc:
        raise ValueError(f"{out}: directory {parent} is not writable ({exc.strerror or exc})") from None
    return out
