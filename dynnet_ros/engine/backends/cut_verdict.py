"""Whether the planned backend cuts a model file or runs it as one plain session: decided once per
file, outside the serving process, then cached.

Why: the decision needs the whole analysis (weightless load, blocked-layout rewrite, RDP,
simplification, order, partition, cost model), and that work leaves its heap in the process that
ran it. Where the answer is "one plain onnxruntime session" (nothing to save), that heap would be
all the engine holds beyond onnxruntime's own session: more memory than plain onnxruntime for no
gain. So a file not seen before is decided in a child process, and the verdict is cached under
``$DYNNET_LAYOUT_DIR/verdicts/`` keyed by the file's bytes, onnxruntime's version, the CPU's
vector extensions, the thread count, the layout, the planner options and the versions of the cost
table and the layout rewrite: the serving process of a
single-session model then never plans. A model that is cut is planned in the serving process as
before (the plan's sessions live there).
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import onnxruntime as ort

from dynnet_ros.engine.modelio.model_check import file_digest
from dynnet_ros.engine.plan.cost_table import COST_VERSION
from dynnet_ros.engine.plan.layout import LAYOUT_VERSION, cpu_block_size
from dynnet_ros.settings import settings

log = logging.getLogger(__name__)

VERDICT_VERSION = 4
LOCK_NAME = ".deciding.lock"
#: the child's module: ``python -m CHILD_MODULE PATH THREADS LAYOUT OPTIONS_JSON`` prints the verdict
CHILD_MODULE = "dynnet_ros.engine.backends.cpu_planned"


def verdict_dir() -> Path:
    return settings().cache.layout_dir / "verdicts"


def _key(path: str, threads: int | None, layout: str, options: Mapping[str, Any]) -> str:
    text = (f"{file_digest(path)}|ort={ort.__version__}|block={cpu_block_size()}|threads={threads}"
            f"|layout={layout}|options={json.dumps(dict(options), sort_keys=True)}|v={VERDICT_VERSION}"
            f"|cost={COST_VERSION}|rewrite={LAYOUT_VERSION}")
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def cut_verdict(path: str, threads: int | None, layout: str, options: Mapping[str, Any],
                *, timeout_s: float = 600) -> dict | None:
    """The cached verdict for the model file ``path``: ``{"fallback": True, "reason": …, "cuts": …}``
    where the planner runs one plain session, ``{"fallback": False}`` where it cuts; decided in a
    child process on a miss. None where no verdict can be had (options that are not plain data,
    a child that fails): the caller decides in its own process."""
    try:
        target = verdict_dir() / f"{_key(path, threads, layout, options)}.json"
    except (OSError, TypeError, ValueError):  # unreadable file, options that are not JSON data
        return None
    cached = _read(target)
    if cached is not None:
        return cached
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target.parent / LOCK_NAME, "a") as lock:
            # one verdict decided at a time per cache: timed verdicts of nodes starting together
            # would otherwise time each other's load; a verdict written meanwhile is taken as it is
            fcntl.flock(lock, fcntl.LOCK_EX)
            cached = _read(target)
            return cached if cached is not None else _decide(path, threads, layout, options, target, timeout_s)
    except OSError as exc:  # a cache folder that cannot be written: decide unlocked, uncached
        log.info("cut verdict cache unavailable (%s)", exc)
        return _decide(path, threads, layout, options, None, timeout_s)


def _read(target: Path) -> dict | None:
    try:
        return dict(json.loads(target.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def _decide(path: str, threads: int | None, layout: str, options: Mapping[str, Any], target: Path | None,
            timeout_s: float) -> dict | None:
    """The verdict from a child process, written to ``target`` (None: not cached)."""
    try:
        proc = subprocess.run([sys.executable, "-m", CHILD_MODULE, path, str(threads or 0), layout,
                               json.dumps(dict(options))], capture_output=True, text=True, timeout=timeout_s,
                              check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        log.info("cut choice not decided in a child process (%s); deciding here", exc)
        return None
    if proc.returncode != 0:
        log.info("cut choice not decided in a child process (%s); deciding here",
                 (proc.stderr.strip().splitlines() or ["no output"])[-1])
        return None
    try:
        verdict = dict(json.loads(proc.stdout.strip().splitlines()[-1]))
    except (IndexError, ValueError, TypeError):
        return None
    if target is None:
        return verdict
    try:
        tmp = target.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(verdict))
        os.replace(tmp, target)  # atomic: a concurrent writer's verdict is the same
    except OSError as exc:
        log.info("cut verdict not cached (%s)", exc)
    return verdict
