"""The camera intrinsics a serving core knows, per image size.

Why: a camera that switches resolution publishes one CameraInfo per size, and a frame may arrive
before its own size's CameraInfo; the core then uses the latest one rescaled, which is exact for
a driver that scales its sensor image.
"""
from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np

from dynnet_ros.perception.projection import validate_intrinsics


class Intrinsics:
    """K matrices keyed by (width, height), in the order their sizes were first seen."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_size: dict[tuple[int, int], np.ndarray] = {}
        # the last CameraInfo taken, as given: a driver repeats the same one with every frame,
        # and checking it again would cost the callback thread (and the interpreter) each time
        self._last: tuple[int, int, tuple[float, ...]] | None = None

    def update(self, width: int, height: int, k: Sequence[float] | np.ndarray) -> None:
        """Record ``k`` (9 values or 3x3) for ``width x height`` images; ValueError when it is no
        camera matrix."""
        given = (width, height, tuple(np.ravel(k).tolist()) if isinstance(k, np.ndarray) else tuple(k))
        if given == self._last:
            return
        matrix = validate_intrinsics(k)
        with self._lock:
            self._by_size[(width, height)] = matrix
            self._last = given

    def for_size(self, width: int, height: int) -> np.ndarray | None:
        """K for this image size: an exact match, else the latest one rescaled (None: none known)."""
        with self._lock:
            if (width, height) in self._by_size:
                return self._by_size[(width, height)]
            if not self._by_size:
                return None
            (w0, h0), k0 = next(reversed(self._by_size.items()))
        k = k0.copy()
        k[0] *= width / w0
        k[1] *= height / h0
        return k
