"""Serialised TensorRT engines cached on disk under a key of everything that shaped them.

A plan file is only valid for the exact model, TensorRT version, GPU (name + compute
capability), precision flags, profile set, DLA core and workspace it was built with; loading a
stale one either fails or silently runs different kernels. So the key holds all of them, the
file name is a digest of the key, and a JSON sidecar repeats the key in clear text (checked on
load, and readable by people wondering why a rebuild happened).
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import onnx

#: bump when the build logic (tensorrt.py) changes in a way that alters the plan
BUILD_LOGIC_VERSION = 1


def model_sha256(model: onnx.ModelProto | bytes) -> str:
    data = model if isinstance(model, bytes) else model.SerializeToString(deterministic=True)
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class EngineKey:
    model_sha256: str
    tensorrt_version: str
    device_name: str
    compute_capability: tuple[int, int]
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

    def differences(self, other: "EngineKey") -> list[str]:
        """Field names that differ: the reason a cached engine is stale."""
        mine, theirs = json.loads(self.to_json()), json.loads(other.to_json())
        return sorted(k for k in mine if mine[k] != theirs.get(k))


class EngineCache:
    """``<dir>/<key.filename()>`` plus ``.json`` sidecar; atomic writes; bounded per model."""

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
                data = json.loads(sidecar.read_text())
                data["flags"] = tuple(data["flags"])
                data["compute_capability"] = tuple(data["compute_capability"])
                other = EngineKey(**data)
            except (OSError, ValueError, TypeError, KeyError):
                continue
            mtime = sidecar.stat().st_mtime
            if newest is None or mtime > newest[0]:
                newest = (mtime, other)
        if newest is None:
            return "no cached engine for this model"
        changed = key.differences(newest[1])
        return "cached engine is stale: " + ", ".join(changed) + " changed" if changed else "cached engine unreadable"

    def store(self, key: EngineKey, plan: bytes) -> Path:
        """Write plan then sidecar, each via a temp file + rename (readers never see halves)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.path(key)
        for target, data in ((path, plan), (path.with_suffix(".json"), key.to_json().encode())):
            fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=".tmp-")
            try:
                with os.fdopen(fd, "wb") as handle:
                    handle.write(data)
                os.replace(tmp, target)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        self._evict(key)
        return path

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
