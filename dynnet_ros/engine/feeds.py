"""Check user feeds against a model's inputs before any backend sees them.

Backends fail with long, backend-specific messages; this gives one ValueError that names the
input and the expected shape, and leaves the engine usable.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from dynnet_ros.engine.model_io import InputSpec


def validate_feeds(specs: list[InputSpec], feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    if not isinstance(feeds, Mapping):
        raise ValueError(f"feeds must be a dict of input name -> numpy array, got {type(feeds).__name__}")
    by_name = {spec.name: spec for spec in specs}
    unknown = sorted(set(feeds) - set(by_name))
    if unknown:
        expected = ", ".join(spec.describe() for spec in specs)
        raise ValueError(f"unknown input(s) {unknown}; the model takes {expected}")
    missing = [spec.name for spec in specs if spec.name not in feeds]
    if missing:
        expected = ", ".join(by_name[name].describe() for name in missing)
        raise ValueError(f"missing input(s): {expected}")
    checked: dict[str, np.ndarray] = {}
    for spec in specs:
        value = feeds[spec.name]
        if not isinstance(value, np.ndarray):
            raise ValueError(f"input '{spec.name}' must be a numpy array, got {type(value).__name__}")
        if value.dtype != spec.dtype:
            raise ValueError(f"input '{spec.name}' has dtype {value.dtype}, expected {spec.describe()}")
        if value.ndim != spec.rank:
            raise ValueError(f"input '{spec.name}' has rank {value.ndim} (shape {list(value.shape)}), "
                             f"expected {spec.describe()}")
        symbols: dict[str, int] = {}
        for axis, (size, want) in enumerate(zip(value.shape, spec.dims)):
            if isinstance(want, int) and size != want:
                raise ValueError(f"input '{spec.name}' axis {axis} is {size}, expected {spec.describe()}")
            if isinstance(want, str):
                if symbols.setdefault(want, size) != size:
                    raise ValueError(f"input '{spec.name}' axis {axis} is {size} but '{want}' is "
                                     f"{symbols[want]} on another axis; expected {spec.describe()}")
        if 0 in value.shape:
            raise ValueError(f"input '{spec.name}' is empty (shape {list(value.shape)})")
        checked[spec.name] = np.ascontiguousarray(value)
    # One symbol named on several inputs must agree across them too.
    seen: dict[str, tuple[str, int]] = {}
    for spec in specs:
        for axis, want in enumerate(spec.dims):
            if isinstance(want, str):
                size = checked[spec.name].shape[axis]
                other = seen.setdefault(want, (spec.name, size))
                if other[1] != size:
                    raise ValueError(f"dimension '{want}' is {other[1]} on input '{other[0]}' but {size} on "
                                     f"input '{spec.name}'")
    return checked


def shape_signature(feeds: Mapping[str, np.ndarray]) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """Hashable key of the concrete input shapes (plan caches and stats use it)."""
    return tuple(sorted((name, tuple(int(d) for d in value.shape)) for name, value in feeds.items()))
