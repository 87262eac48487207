"""onnxruntime on the CPU: the reference backend and the kernel library of the planned engine."""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnxruntime as ort

from dynnet_ros.engine.modelio.loader import source_path
from dynnet_ros.engine.modelio.onnx_proto import ModelProto
from dynnet_ros.engine.plan.options import default_threads
from dynnet_ros.engine.runtime.base import ExecutorStats
from dynnet_ros.memtrim import pin_mmap_threshold

#: glibc's mmap threshold a lean session pins (PlannerOptions.mmap_threshold's default): blocks of
#: onnxruntime's arena above it are mapped afresh instead of carved from heap pages glibc keeps
LEAN_MMAP_THRESHOLD = 128 * 1024


def session_options(threads: int | None = None, *, lean: bool = False) -> ort.SessionOptions:
    """onnxruntime's defaults at ``threads``; ``lean``: without memory patterns (see OrtExecutor)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or default_threads()
    options.inter_op_num_threads = 1
    options.log_severity_level = 3  # warnings from ORT go to our diagnostics, not stderr spam
    if lean:
        options.enable_mem_pattern = False
    return options


class OrtExecutor:
    """One onnxruntime InferenceSession over the whole model.

    A *lean* session is the planned backend's single session. With memory patterns on (the
    default), onnxruntime takes one block per input shape for all of a run's tensors, which its
    arena cannot reuse for another shape's block, and glibc keeps the freed heap pages of the
    model's load under the arena's blocks; over a sequence of shapes the arena then grows well
    past any one run's need. Lean, every tensor is a block of the arena reused as soon as it is
    freed, and blocks above ``LEAN_MMAP_THRESHOLD`` are fresh mappings (process-wide, as the
    planned executor pins it). The kernels are the same; the cost is an arena allocation per
    tensor, which the "auto" profile's verdict times (backends/cpu_planned.py).
    """

    name = "cpu"

    def __init__(self, model: ModelProto | str, *, threads: int | None = None,
                 options: ort.SessionOptions | None = None, plan: dict | None = None, lean: bool = False) -> None:
        """``model``: a ModelProto with its weights, a weightless skeleton of a model file
        (modelio/loader.py: onnxruntime reads the file it came from), or a model file's path.
        ``plan``: why the planned backend runs this plain session instead (its cost model's
        verdict), reported by ``executor_stats`` under "plan". ``lean``: see the class; ignored
        where ``options`` are given."""
        self._plan = plan
        self.lean = lean and options is None
        if self.lean:
            pin_mmap_threshold(LEAN_MMAP_THRESHOLD)
        if not isinstance(model, str):
            model = source_path(model) or model  # a skeleton's weights are in its file
        try:
            self._session = ort.InferenceSession(
                model if isinstance(model, str) else model.SerializeToString(),
                sess_options=options or session_options(threads, lean=self.lean),
                providers=["CPUExecutionProvider"])
        except Exception as exc:  # ORT raises its own Fail/InvalidGraph types
            message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ValueError(f"onnxruntime cannot load the model: {message}") from exc
        self._outputs = [o.name for o in self._session.get_outputs()]

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        values = self._session.run(self._outputs, dict(feeds))
        # unpacked pairs: zip reuses one tuple, where dict(zip(...)) leaves one per output to the
        # interpreter's tuple free list on every run
        return {name: value for name, value in zip(self._outputs, values)}

    def executor_stats(self) -> ExecutorStats:
        return ExecutorStats(details={} if self._plan is None else {"plan": {**self._plan, "lean": self.lean}})

    def arena_bytes_at(self, shapes: Mapping[str, tuple[int, ...]]) -> int | None:
        return None  # onnxruntime's own arena: not planned, not known ahead

    def close(self) -> None:
        self._session = None
