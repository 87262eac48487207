"""Serialised TensorRT engines cached on disk under a key of everything that shaped them.

A plan file is only valid for the exact model, TensorRT version, GPU (name + compute
capability + SM count: every Jetson Orin module reports "Orin" 8.7 with 4 to 16 SMs), precision
flags, profile set, DLA core and workspace it was built with; loading a stale one either fails or
silently runs different kernels. So the key holds all of them, the file name is a digest of the
key, and a JSON sidecar repeats the key in clear text (checked on load, and readable by people
wondering why a rebuild happened).

Two processes (two model nodes) starting on the same model must not both spend minutes building
the same engine: ``lock(key)`` takes an ``fcntl.flock`` on a lock file next to the entry, and the
builder looks the entry up again once it holds the lock. The TensorRT timing cache (the measured
speed of every tactic) is kept next to the engines, one file per TensorRT version and GPU, so a
rebuild for new shapes does not time every tactic again.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from dynnet_ros.engine.modelio.onnx_proto import ModelProto

#: bump when the build logic (tensorrt.py) changes in a way that alters the plan
BUILD_LOGIC_VERSION = 2


def model_sha256(model: ModelProto | bytes) -> str:
    data = model if isinstance(model, bytes) else model.SerializeToString(deterministic=True)
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class EngineKey:
    model_sha256: str
    tensorrt_version: str
    device_name: str
    compute_capability: tuple[int, int]
    sm_count: int               # multiprocessors: tells Orin AGX / NX / Nano apart
    precision: str
    flags: tuple[str, ...]      # builder flags set, sorted
    profiles: str               # ProfileSet.to_json()
    dla_core: int | None
    gpu_fallback: bool
    workspace_bytes: int
    build_logic: int = BUILD_LOGIC_VERSION

    def to_json(self) -> str:
        data = asdict(self)
        data["flags"] = sorted(self.flags)
        data["compute_capability"] = list(self.compute_capability)
        return json.dumps(data, sort_keys=True, separators=(",", ":"))

    def digest(self) -> str:
        return hashlib.sha256(self.to_json().encode()).hexdigest()

    def filename(self) -> str:
        """Stable name: the model's hash prefix (to find a model's engines) + the key digest."""
        return f"{self.model_sha256[:16]}-{self.digest()[:24]}.engine"

    @classmethod
    def from_json(cls, text: str) -> EngineKey:
        """The key a sidecar holds (ValueError/TypeError/KeyError when it is not one)."""
        data = json.loads(text)
        data["flags"] = tuple(data["flags"])
        data["compute_capability"] = tuple(data["compute_capability"])
        return cls(**data)

    def timing_cache_name(self) -> str:
        """One timing cache per TensorRT version and GPU: tactic timings do not depend on the
        model, and a cache from another GPU or version is rejected by TensorRT anyway."""
        device = hashlib.sha256(json.dumps([self.device_name, list(self.compute_capability), self.sm_count])
                                .encode()).hexdigest()[:16]
        return f"timing-{re.sub(r'[^0-9A-Za-z.]', '_', self.tensorrt_version)}-{device}.cache"

    def differences(self, other: EngineKey) -> list[str]:
        """Field names that differ: the reason a cached engine is stale."""
        mine, theirs = json.loads(self.to_json()), json.loads(other.to_json())
        return sorted(k for k in mine if mine[k] != theirs.get(k))


class EngineCache:
    """``<dir>/<key.filename()>`` plus ``.json`` sidecar and ``.lock`` file; atomic writes; at most
    ``keep_per_model`` engines per model."""

    def __init__(self, directory: str | os.PathLike, keep_per_model: int = 3) -> None:
        self.dir = Path(directory)
        self.keep_per_model = keep_per_model

    def path(self, key: EngineKey) -> Path:
        return self.dir / key.filename()

    def load(self, key: EngineKey) -> bytes | None:
        """The plan bytes, or None when absent or its sidecar disagrees with ``key``."""
        path = self.path(key)
        sidecar = path.with_suffix(".json")
        try:
            stored = json.loads(sidecar.read_text())
            if json.dumps(stored, sort_keys=True, separators=(",", ":")) != key.to_json():
                return None
            return path.read_bytes()
        except (OSError, ValueError):
            return None

    def stale_reason(self, key: EngineKey) -> str:
        """Why ``key`` has no usable engine: no engine for this model yet, or which fields
        changed since the newest cached one."""
        newest: tuple[float, EngineKey] | None = None
        for sidecar in self.dir.glob(f"{key.model_sha256[:16]}-*.json"):
            try:
                other = EngineKey.from_json(sidecar.read_text())
            except (OSError, ValueError, TypeError, KeyError):
                continue
            mtime = sidecar.stat().st_mtime
            if newest is None or mtime > newest[0]:
                newest = (mtime, other)
        if newest is None:
            return "no cached engine for this model"
        changed = key.differences(newest[1])
        return "cached engine is stale: " + ", ".join(changed) + " changed" if changed else "cached engine unreadable"

    @contextlib.contextmanager
    def lock(self, key: EngineKey) -> Iterator[None]:
        """Hold an exclusive ``flock`` on ``<entry>.lock`` (blocks while another process holds
        it). The lock files stay: unlinking one another process has open would split the lock."""
        self.dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path(key).with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing the descriptor releases the flock

    def store(self, key: EngineKey, plan: bytes) -> Path:
        """Write plan then sidecar, each via a temp file + rename (readers never see halves)."""
        path = self.path(key)
        self._write(path, plan)
        self._write(path.with_suffix(".json"), key.to_json().encode())
        self._evict(key)
        return path

    def load_timing_cache(self, key: EngineKey) -> bytes:
        """The serialised timing cache for ``key``'s TensorRT version and GPU (b"" when none)."""
        try:
            return (self.dir / key.timing_cache_name()).read_bytes()
        except OSError:
            return b""

    def store_timing_cache(self, key: EngineKey, data: bytes) -> None:
        """Replace the timing cache atomically (concurrent builders: the last one's cache wins;
        each already holds what it loaded plus its own timings)."""
        self._write(self.dir / key.timing_cache_name(), data)

    def _write(self, target: Path, data: bytes) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            os.replace(tmp, target)
        except BaseException:  # any exit, interrupts included: no partial file stays; re-raised
            Path(tmp).unlink(missing_ok=True)
            raise

    def remove(self, key: EngineKey) -> None:
        path = self.path(key)
        path.unlink(missing_ok=True)
        path.with_suffix(".json").unlink(missing_ok=True)

    def _evict(self, key: EngineKey) -> None:
        engines = sorted(self.dir.glob(f"{key.model_sha256[:16]}-*.engine"), key=lambda p: p.stat().st_mtime,
                         reverse=True)
        for old in engines[self.keep_per_model:]:
            old.unlink(missing_ok=True)
            old.with_suffix(".json").unlink(missing_ok=True)
