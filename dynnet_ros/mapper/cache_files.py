"""JSON files of the mapper's cache (search results, fitted runtime costs).

A node may read a cache file while a search rewrites it, so files are replaced atomically; a file
that cannot be read or parsed is a ValueError naming it, while a missing one stays a
FileNotFoundError, which callers treat as "nothing cached yet"."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_json_atomic(path: Path, data: Any) -> None:
    """Write ``data`` as JSON to ``path`` through a sibling file and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(data, indent=1))
    partial.replace(path)


def read_json(path: Path, what: str) -> Any:
    """The parsed JSON of ``path``; ``what`` names the file in errors ("search cache", …)."""
    try:
        text = path.read_text()
    except OSError as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        raise ValueError(f"{what} {path}: cannot read it ({exc.strerror or exc})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{what} {path}: not JSON ({exc})") from None
