"""ruff (pyflakes, pycodestyle, isort, bugbear) and mypy are clean, with the settings in ruff.toml
and setup.cfg. They run as tests so `make test` and CI hold every change to them."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.graph

REPO = Path(__file__).resolve().parents[1]
LINTED = ["dynnet_ros", "test", "bench", "launch", "setup.py"]


def _tool(name: str) -> str:
    path = Path(sys.executable).with_name(name)
    if path.is_file():
        return str(path)
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed (it is pinned in requirements-dev.txt)")
    return found


def test_ruff_is_clean():
    result = subprocess.run([_tool("ruff"), "check", "--no-cache", *LINTED], cwd=REPO,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_is_clean(tmp_path):
    result = subprocess.run([_tool("mypy"), "--cache-dir", str(tmp_path / "mypy-cache"), "dynnet_ros"],
                            cwd=REPO, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
