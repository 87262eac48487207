"""The executor protocol every backend implements."""
from __future__ import annotations

from typing import Mapping, Protocol

import numpy as np


class Executor(Protocol):
    name: str

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the model on validated feeds; outputs in graph order, keyed by name."""

    def close(self) -> None:
        """Release sessions and buffers."""
