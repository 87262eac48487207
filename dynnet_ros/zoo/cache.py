"""The on-disk model cache: where models live, when they are rebuilt, how they are written.

Why a stamp file: reading a 50 MB model just to learn its version would cost more than the check
is worth, so each ``<name>.onnx`` has a ``<name>.stamp`` holding the builder version (a manual
number plus a digest of the zoo's source files, so any builder edit triggers a rebuild). Both files
are written to a temp file in the same directory and renamed into place, model first, so
concurrent processes never see a half-written model, and a stamp never vouches for an older model.
"""
from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

from dynnet_ros.engine.modelio.onnx_proto import ModelProto
from dynnet_ros.settings import settings

from . import depth, gated, lane, multiexit, pedestrian

log = logging.getLogger(__name__)
MODEL_NAMES: tuple[str, ...] = ("lane", "pedestrian", "depth", "gated", "multiexit")
_BUILDERS: dict[str, Callable[[], ModelProto]] = {
    "lane": lane.build, "pedestrian": pedestrian.build, "depth": depth.build,
    "gated": gated.build, "multiexit": multiexit.build,
}
_MANUAL_VERSION = "1"


@lru_cache(maxsize=1)
def _source_digest() -> str:
    h = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


BUILDER_VERSION = f"{_MANUAL_VERSION}+{_source_digest()}"


def zoo_dir() -> Path:
    """$DYNNET_ZOO_DIR if set, else ~/.cache/dynnet_ros/zoo (not created here)."""
    return settings().cache.zoo_dir


def _check_name(name: str) -> None:
    if name not in _BUILDERS:
        raise ValueError(f"unknown zoo model {name!r}; expected one of {', '.join(MODEL_NAMES)}")


def build_model(name: str) -> ModelProto:
    """Build model ``name`` in memory (deterministic: same bytes every time)."""
    _check_name(name)
    model = _BUILDERS[name]()
    entry = model.metadata_props.add()
    entry.key, entry.value = "dynnet_zoo_version", BUILDER_VERSION
    return model


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; cached models are meant to be shared
        os.replace(tmp, path)
    except BaseException:  # any exit, interrupts included: no partial file stays; re-raised
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _stamp_path(model_path: Path) -> Path:
    return model_path.with_suffix(".stamp")


def is_current(path: Path) -> bool:
    """True when ``path`` exists and its stamp names the current builder version."""
    stamp = _stamp_path(path)
    try:
        return path.is_file() and stamp.read_text().strip() == BUILDER_VERSION
    except OSError:
        return False


def ensure_model(name: str, out_dir: str | os.PathLike | None = None, force: bool = False) -> Path:
    """Path to ``<out_dir or zoo_dir()>/<name>.onnx``, building it if missing or out of date."""
    _check_name(name)
    directory = Path(out_dir).expanduser() if out_dir is not None else zoo_dir()
    path = directory / f"{name}.onnx"
    if not force and is_current(path):
        return path
    directory.mkdir(parents=True, exist_ok=True)
    log.info("building zoo model %s in %s (%s)", name, directory,
             "first start" if not path.exists() else "forced" if force else "its builder changed")
    _write_atomic(path, build_model(name).SerializeToString())
    _write_atomic(_stamp_path(path), (BUILDER_VERSION + "\n").encode())
    return path


def build_all(out_dir: str | os.PathLike | None = None, force: bool = False) -> dict[str, Path]:
    """ensure_model for every model; returns name -> path."""
    return {name: ensure_model(name, out_dir, force) for name in MODEL_NAMES}


def resolve_model_spec(spec: str) -> str:
    """``zoo:NAME`` -> the zoo model's path (built if needed); anything else must be a model file.

    The CLI commands that take a model accept both forms through this one function.
    """
    if spec.startswith("zoo:"):
        name = spec[4:]
        if name not in MODEL_NAMES:
            raise ValueError(f"unknown zoo model {name!r}; choose one of {list(MODEL_NAMES)}")
        return str(ensure_model(name))
    if not os.path.isfile(spec):
        raise ValueError(f"model file not found: {spec}")
    return spec
