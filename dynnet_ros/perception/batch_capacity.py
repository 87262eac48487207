"""How many frames a model takes in one run, decided from its graph.

Why RDP and not the declared shapes alone: an export may name its batch axis yet fix it inside
(a Reshape to a leading 1, NMS that flattens every frame's boxes into one ``[N, 4]`` list), and
then a batch of frames would fail or, worse, run and mix the frames' results. RDP propagates the
image input's batch symbol through the graph; the model batches only when every output carries
that same symbol as its leading axis, so output row ``i`` is frame ``i``'s result.
"""
from __future__ import annotations

import logging
import warnings

from dynnet_ros.engine.rdp import Expr, RDPWarning, analyze
from dynnet_ros.perception.model_info import ModelInfo, TensorInfo

log = logging.getLogger(__name__)

#: what ``batch_capacity`` reports for a model whose batch axis is symbolic end to end: more
#: frames than a node forms in one batch (one per camera)
UNBOUNDED_BATCH = 64


def batch_capacity(info: ModelInfo, image: TensorInfo, layout: str) -> int:
    """``UNBOUNDED_BATCH`` when ``image``'s batch axis is symbolic and every output of the model
    leads with that symbol (RDP), else 1: a fixed batch, an unbatched (CHW) input, outputs
    without the batch axis, another input with the batch axis that is not an image-sized plane
    (the cores batch the image and its companion planes, like the zoo depth model's LiDAR, and
    feed every other input as for one frame), or a graph RDP cannot follow."""
    if layout == "CHW" or image.rank == 0 or isinstance(image.dims[0], int):
        return 1
    if any(out.rank == 0 or isinstance(out.dims[0], int) for out in info.outputs):
        return 1
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RDPWarning)  # an operator RDP does not know: the planner reports it
            result = analyze(info.path)
    except Exception as exc:  # noqa: BLE001 — any failure to follow the graph means one frame per run
        log.info("%s: batch size 1 (RDP could not follow the batch axis: %s)", info.path, exc)
        return 1
    declared = result.inputs.get(image.name)
    batch = declared[0] if declared else None
    if not isinstance(batch, Expr):  # an Expr is never a constant
        return 1
    for spec in info.inputs:
        dims = result.inputs.get(spec.name)
        if spec.name != image.name and dims and dims[0] == batch and spec.rank != 4:
            return 1
    for out in info.outputs:
        dims = result.tensor_dims(out.name) if out.name in result.tensors else None
        if not dims or not isinstance(dims[0], Expr) or dims[0] != batch:
            return 1
    return UNBOUNDED_BATCH
