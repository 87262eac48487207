"""Per-engine accounting: what a streamed engine holds besides its weights, measured once.

Why not the process's RSS growth: in a process that runs several engines, or allocates and frees
memory of its own, RSS growth since an engine was created says nothing about that engine — a
second engine sees the first one's freed heap reused, a foreign array looks like the engine's.
So an engine's footprint is counted from what it holds:

* its weights: the bytes resident in its own weight region (the window knows them exactly);
* everything else it caused — the activation arena, the segment sessions, onnxruntime's
  environment and kernel scratch, the weightless graph — measured ONCE, in a clean child
  process (``footprint_worker.py``), at the input shapes it will run, with the smallest window.

The measurement is cached as JSON under the swap cache directory, keyed by everything it depends
on: the weight file (model content, layout, split size), onnxruntime's version, the thread
count, the planner profile, huge-page availability and the shapes. Budget decisions use only
these numbers, so the same model at the same shapes gets the same minimum in every process.
The process's RSS stays the node-level check (nodes/budget_control, the benchmarks).
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import onnxruntime as ort

from dynnet_ros.bytesize import MB
from dynnet_ros.settings import settings
from dynnet_ros.swap.swapin import huge_pages_available
from dynnet_ros.swap.weight_file import WeightFile

#: bump when what the child measures changes (old entries are then measured again)
CALIBRATION_VERSION = 2
#: what one segment's onnxruntime temporaries may add between two samples (see docs/swap.md)
TRANSIENT_BYTES = 256 * 1024
#: share of the budget kept free of weights, for what the samples cannot see
MARGIN_FRACTION = 0.005
Shapes = Mapping[str, tuple[int, ...]]


@dataclass(frozen=True)
class Footprint:
    """One engine's footprint at one set of input shapes, measured in a clean process."""

    nonweight_bytes: int      # max over the frames' segments of (RSS growth − resident weights)
    arena_bytes: int          # the activation arena at these shapes (part of nonweight_bytes)
    min_stream_bytes: int     # weights live at the heaviest segment: the smallest window
    weight_span: int          # all weights as laid out in the region (the in-memory window)

    @property
    def footprint(self) -> int:
        """Non-weight bytes the budget reserves: the measurement plus one segment's temporaries."""
        return self.nonweight_bytes + TRANSIENT_BYTES

    def margin(self, budget: int | None) -> int:
        return int(MARGIN_FRACTION * (budget or 0))

    def allowance(self, budget: int) -> int:
        """Bytes of weights the window may hold under ``budget``."""
        return budget - self.footprint - self.margin(budget)

    def minimum_bytes(self) -> int:
        """The smallest budget accepted: footprint + the smallest window, with the margin.

        ``set_budget`` and ``min_budget_mb`` both use this one number, so the minimum is
        accepted and anything below it is refused."""
        return int((self.footprint + self.min_stream_bytes) / (1 - MARGIN_FRACTION)) + 1

    def inmemory_bytes(self) -> int:
        """The budget at which every weight is resident."""
        return int((self.footprint + self.weight_span) / (1 - MARGIN_FRACTION)) + 1


def shapes_key(shapes: Shapes) -> str:
    return ";".join(f"{name}={'x'.join(str(int(d)) for d in shape)}" for name, shape in sorted(shapes.items()))


def footprint_path(weights: WeightFile, threads: int | None, shapes: Shapes,
                  root: str | os.PathLike | None = None, values: Mapping[str, list] | None = None) -> Path:
    """Where the measurement of ``weights`` at ``shapes`` (and ``values``) is cached (one JSON file)."""
    profile = settings().planner.profile
    fed = f":{json.dumps(dict(values), sort_keys=True)}" if values else ""
    key = hashlib.sha256(
        f"{CALIBRATION_VERSION}:{weights.directory.name}:{ort.__version__}:{threads}:{profile}:"
        f"{huge_pages_available()}:{shapes_key(shapes)}{fed}".encode()).hexdigest()[:24]
    return Path(root or settings().cache.swap_dir) / "calibration" / f"{key}.json"


def load_or_measure(weights: WeightFile, threads: int | None, shapes: Shapes,
                    root: str | os.PathLike | None = None, timeout_s: float = 600,
                    values: Mapping[str, list] | None = None) -> Footprint:
    """The cached calibration of ``weights`` at ``shapes``, measured in a child process if missing.

    The child feeds zeros, except ``values``: the last values of the model's small integer
    inputs (a sample rate, a mode flag), which decide control flow where zeros would not run.
    ValueError when the model cannot run at these shapes (the child's reason)."""
    path = footprint_path(weights, threads, shapes, root, values)
    cached = _read(path)
    if cached is not None:
        return cached
    path.parent.mkdir(parents=True, exist_ok=True)
    # One measuring child at a time on this machine: several engines starting together (a
    # graph's first start) would otherwise run their children side by side on the same cores,
    # each taking as long as all of them. The cache is read again once the lock is held: the
    # process that held it may have measured this key.
    with open(path.parent / ".measure.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        cached = _read(path)
        if cached is not None:
            return cached
        return _measure(path, weights, threads, shapes, timeout_s, values)


def _read(path: Path) -> Footprint | None:
    try:
        return Footprint(**json.loads(path.read_text())["calibration"])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # missing or unreadable: measured again


def _measure(path: Path, weights: WeightFile, threads: int | None, shapes: Shapes, timeout_s: float,
             values: Mapping[str, list] | None) -> Footprint:
    """Run the measuring child for ``shapes`` and store its result at ``path``."""
    request = {"weights": str(weights.directory), "threads": threads,
               "shapes": {name: list(shape) for name, shape in shapes.items()}, "values": dict(values or {})}
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    try:
        proc = subprocess.run([sys.executable, "-m", "dynnet_ros.swap.footprint_worker", json.dumps(request),
                               str(tmp)], capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        tmp.unlink(missing_ok=True)
        raise ValueError(f"measuring the engine's footprint at {shapes_key(shapes)} took over {timeout_s:.0f} s") \
            from None
    if proc.returncode != 0 or not tmp.exists():
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        tmp.unlink(missing_ok=True)
        raise ValueError(f"measuring the engine's footprint at {shapes_key(shapes)} failed: {last}")
    result = json.loads(tmp.read_text())
    if "error" in result:
        tmp.unlink(missing_ok=True)
        raise ValueError(f"the model does not run at {shapes_key(shapes)}: {result['error']}")
    os.replace(tmp, path)  # atomic: concurrent engines measuring the same key both end up valid
    return Footprint(**result["calibration"])


def write_result(path: str | os.PathLike, calibration: Footprint, shapes: Shapes) -> None:
    """The child's answer (also the cache entry): the measurement and what it was taken at."""
    Path(path).write_text(json.dumps({"calibration": asdict(calibration), "shapes": shapes_key(shapes),
                                      "onnxruntime": ort.__version__,
                                      "nonweight_mb": calibration.nonweight_bytes / MB}, indent=1))
