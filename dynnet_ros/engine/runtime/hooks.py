"""What the planned executor calls besides its own segment sessions.

Why protocols: the executor runs segments through objects built elsewhere (If/Loop/banded
runners in this package, a weight-streaming hook in swap/) and must not import the layers
above it; these protocols are the whole contract those objects meet.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import numpy as np


class SegmentHook(Protocol):
    """Called around every segment of a run (swap/streamed.py: weights in before, out after)."""

    def frame_start(self) -> None:
        """A run begins (before its first segment)."""

    def before(self, k: int, /) -> None:
        """Segment ``k`` is about to run."""

    def after(self, k: int, /) -> None:
        """Segment ``k`` has run."""

    def frame_end(self) -> None:
        """The run finished normally."""

    def abort(self) -> None:
        """The run raised; undo whatever the frame holds."""


class BranchRunner(Protocol):
    """Runs one segment by itself instead of a bound session: an If, a Loop or the banded stem."""

    def run(self, values: Mapping[str, np.ndarray], out: Mapping[str, np.ndarray | None], /) -> dict[str, np.ndarray]:
        """The segment's outputs from its input ``values``; ``out`` offers arena views to write into."""

    def close(self) -> None:
        """Release the sessions and buffers the runner holds."""
