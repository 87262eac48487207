"""What `dynnet map profile|search` share: the model's stages, calibration frames, cached profiles."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from dynnet_ros.commands.map_inputs import scene_feeds
from dynnet_ros.engine.modelio.models import input_specs, load_model
from dynnet_ros.engine.modelio.onnx_proto import ModelProto
from dynnet_ros.mapper.hardware import Hardware
from dynnet_ros.mapper.profile_io import Profile, read_csv, to_csv
from dynnet_ros.mapper.profiler import cache_key, profile_stage_set
from dynnet_ros.mapper.stages import StageSet, depth_stages
from dynnet_ros.settings import settings
from dynnet_ros.zoo import resolve_model_spec


def model_stages(spec: str) -> tuple[str, ModelProto, StageSet]:
    """(path, model, depth-wise stages at the model's exits)."""
    path = resolve_model_spec(spec)
    model = load_model(path)
    return path, model, depth_stages(model)


def frames(model: ModelProto, size: tuple[int, int], count: int,
           npz: Path | None = None) -> list[dict[str, np.ndarray]]:
    """Calibration / measurement frames: an ``.npz`` (one array per model input, frames on the
    first axis), else ``count`` synthetic road scenes of mixed difficulty at ``size``."""
    if npz is not None:
        try:
            data = np.load(npz)
        except (OSError, ValueError) as exc:
            raise ValueError(f"calibration file {npz}: cannot read it ({exc})") from None
        names = [s.name for s in input_specs(model)]
        missing = [n for n in names if n not in data.files]
        if missing:
            raise ValueError(f"calibration file {npz}: no array for input(s) {', '.join(missing)}")
        total = min(len(data[n]) for n in names)
        return [{n: np.ascontiguousarray(data[n][i:i + 1]) for n in names} for i in range(total)]
    return list(scene_feeds(model, count, *size))


def cached_profile(path: str, stage_set: StageSet, hardware: Hardware, frames_per_size: Sequence[dict],
                   sizes: Sequence[str], repeats: int, layers: bool,
                   progress: Callable[[str], None] | None = None) -> tuple[Profile, Path, bool, list[str], list[str]]:
    """The profile from the cache (keyed by model digest + hardware + options) or measured now.

    Returns (profile, cache file, from cache?, skipped units' reasons, power notes)."""
    key = cache_key(Path(path).read_bytes(), hardware, sizes, layers, repeats)
    cache = settings().cache.map_dir / f"profile-{key}.csv"
    if cache.exists():
        try:
            return read_csv(cache, hardware), cache, True, [], []
        except ValueError:
            pass  # a damaged entry is measured again
    profile, skipped, notes = profile_stage_set(stage_set, hardware, frames_per_size, repeats=repeats,
                                                layers=layers, progress=progress)
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(to_csv(profile))
    return profile, cache, False, [f"{s.unit}: {s.reason}" for s in skipped], notes
