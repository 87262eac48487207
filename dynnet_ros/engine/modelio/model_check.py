"""onnx's checker for model files, run once per file content and outside the serving process.

Why: the checker is the only thing in the engine's load path that runs onnx's C++ library, and
running it leaves ~6 MB of that library's code and heap resident in the process for good
(measured on the zoo models: -8 MB of peak RSS with it and onnx shape inference kept out). So a
file's verdict is cached by its content digest, and a file not seen before is checked in a
child process. Invalid models still raise ValueError with the checker's first line.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import os
import subprocess
import sys
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

from dynnet_ros.bytesize import MB
from dynnet_ros.settings import settings

#: exit status of the checking child for an invalid model (any other failure: check in process)
INVALID_MODEL_EXIT = 3


def file_digest(path: str | os.PathLike) -> str:
    """SHA-256 of the file's bytes (memoised per path, size and mtime: hashing 50 MB takes ~50 ms)."""
    stat = os.stat(path)
    return _digest(os.path.abspath(path), stat.st_size, stat.st_mtime_ns)


@lru_cache(maxsize=64)
def _digest(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(MB), b""):
            digest.update(chunk)
    return digest.hexdigest()


@lru_cache(maxsize=1)
def onnx_version() -> str:
    """The installed onnx's version (its checker decides a verdict), read without importing onnx."""
    return importlib.metadata.version("onnx")


def verdict_dir() -> Path:
    """Verdicts live beside the layout cache (``$DYNNET_LAYOUT_DIR/checked``)."""
    return settings().cache.layout_dir / "checked"


def check_model_file(path: str | os.PathLike, check_in_process: Callable[[], None], child_module: str) -> None:
    """Raise ValueError if ``path`` fails onnx's checker.

    ``python -m child_module PATH`` checks in a child process and exits with
    ``INVALID_MODEL_EXIT`` (reason on stderr) for an invalid model; ``check_in_process()`` performs
    the check here when no child can run."""
    marker = verdict_dir() / f"{file_digest(path)[:32]}-onnx{onnx_version()}"
    if marker.is_file():
        return
    try:
        proc = subprocess.run([sys.executable, "-m", child_module, os.fspath(path)],
                              capture_output=True, text=True, timeout=600, check=False)
    except (OSError, subprocess.SubprocessError):
        proc = None
    if proc is not None and proc.returncode == INVALID_MODEL_EXIT:
        raise ValueError((proc.stderr.strip().splitlines() or ["the ONNX checker rejected the model"])[-1])
    if proc is None or proc.returncode != 0:
        check_in_process()  # the child could not run (no interpreter, killed): check here instead
    try:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
    except OSError:
        pass  # a read-only cache only costs the check next time
