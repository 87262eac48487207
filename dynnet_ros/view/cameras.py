"""Which camera matrix a frame's boxes were drawn with, from the camera messages seen so far.

Why: the pedestrian markers are boxes back-projected onto the z = 1 plane with the K the node
used for that frame (an exact CameraInfo for the frame's size, else the latest one rescaled, else
a default pinhole), and they carry no image size. Turning them back into pixels needs the size of
the camera frame with the same stamp and the same choice of K.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence

import numpy as np

#: camera stamps remembered with their frame size (an output arrives an inference after its frame)
RECENT_FRAMES = 64

Size = tuple[int, int]


class CameraModels:
    """Frame sizes by stamp and intrinsics by size; thread-safe (callbacks may run in parallel)."""

    def __init__(self, default_k: Callable[[int, int], np.ndarray]) -> None:
        self._default_k = default_k
        self._sizes: OrderedDict[int, Size] = OrderedDict()  # stamp ns -> (width, height)
        self._intrinsics: OrderedDict[Size, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    def frame(self, stamp_ns: int, width: int, height: int) -> None:
        with self._lock:
            self._sizes[stamp_ns] = (width, height)
            self._sizes.move_to_end(stamp_ns)
            while len(self._sizes) > RECENT_FRAMES:
                self._sizes.popitem(last=False)

    def intrinsics(self, width: int, height: int, k: Sequence[float]) -> None:
        """Keep a CameraInfo's K (9 values, row-major) for its size; ValueError when it is unusable."""
        matrix = np.asarray(k, dtype=np.float64)
        if matrix.size != 9 or not np.all(np.isfinite(matrix)):
            raise ValueError(f"camera matrix needs 9 finite values, got {list(matrix.ravel())}")
        matrix = matrix.reshape(3, 3)
        if matrix[0, 0] <= 0 or matrix[1, 1] <= 0:
            raise ValueError(f"camera matrix focal lengths must be positive, got fx={matrix[0, 0]}, fy={matrix[1, 1]}")
        with self._lock:
            self._intrinsics[(width, height)] = matrix
            self._intrinsics.move_to_end((width, height))

    def size_at(self, stamp_ns: int) -> Size | None:
        """The size of the frame with this stamp, else of the latest frame, else None."""
        with self._lock:
            if stamp_ns in self._sizes:
                return self._sizes[stamp_ns]
            return next(reversed(self._sizes.values()), None)

    def k_for(self, width: int, height: int) -> np.ndarray:
        """The model nodes' rule: a CameraInfo of this size, else the latest rescaled, else the default."""
        with self._lock:
            if (width, height) in self._intrinsics:
                return self._intrinsics[(width, height)]
            latest = next(reversed(self._intrinsics.items()), None)
        if latest is None:
            return self._default_k(width, height)
        (w0, h0), k0 = latest
        k = k0.copy()
        k[0] *= width / w0
        k[1] *= height / h0
        return k
