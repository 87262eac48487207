"""One entry point from a model and a partition to its stages (depth-wise or width-wise)."""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import numpy as np

from dynnet_ros.engine.modelio.loader import hoist_weight_constants
from dynnet_ros.engine.modelio.models import ModelLike, load_model
from dynnet_ros.engine.rdp import analyze

from .partition import Partition
from .stages import StageSet, depth_stages
from .width import width_stages


def build_stages(model: ModelLike, partition: Partition,
                 calibration: Iterable[Mapping[str, np.ndarray]] | None = None,
                 progress: Callable[[str], None] | None = None) -> StageSet:
    """The stages ``partition`` asks for; ``calibration`` frames fit the width split's probe exits
    and measure its agreement with the full model (depth-wise stages need none: they are exact)."""
    proto = hoist_weight_constants(load_model(model))
    if progress:
        progress("RDP analysis")
    rdp = analyze(proto)
    if partition.width is None:
        if progress:
            progress("cutting depth-wise at the exits")
        return depth_stages(proto, partition.exits, rdp=rdp)
    if progress:
        progress(f"splitting the width into {partition.width.stages} stage(s)")
    return width_stages(proto, partition.width, calibration, rdp=rdp, progress=progress)
