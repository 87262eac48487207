"""Child-process entry of swap/footprint.py: one engine's footprint besides weights, measured
in a clean process.

``python -m dynnet_ros.swap.footprint_worker REQUEST_JSON RESULT``. A fresh process because the
number must not depend on what the calling process holds (other engines, freed heap it would
reuse, foreign allocations). It takes the RSS baseline after its imports (onnxruntime's module
included) and before the engine is built, builds the streamed executor from the weight file,
runs ``FRAMES`` frames of zeros at the requested shapes through the smallest window, sampling
RSS growth minus the weights resident after every segment, then ``FRAMES`` frames with every
weight resident, where the peak (``VmHWM``, which also sees onnxruntime's temporaries inside a
segment) minus all weights bounds the rest. The larger figure is the engine's footprint besides
weights: arena, sessions, onnxruntime's environment and threads, first-run allocations, kernel
scratch, the weightless graph.
"""
from __future__ import annotations

import json
import os
import sys

import numpy as np

# onnx's library is model-independent state, like onnxruntime's module: loaded before the baseline, so
# a lazy import of it while the engine is built here is not counted as the engine's footprint
import onnx  # noqa: F401

from dynnet_ros.engine.modelio.onnx_proto import tensor_dtype_to_np_dtype
from dynnet_ros.memtrim import release_memory
from dynnet_ros.procmem import reset_peak_rss, status_bytes
from dynnet_ros.swap.footprint import Footprint, write_result
from dynnet_ros.swap.streamed import StreamedExecutor
from dynnet_ros.swap.weight_file import WeightFile

FRAMES = 3
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


class _Sampling(StreamedExecutor):
    """The streamed executor with an RSS sample after every segment."""

    def start_sampling(self, baseline: int) -> None:
        self._statm = os.open("/proc/self/statm", os.O_RDONLY)
        self._baseline = baseline
        self.max_nonweight = 0

    def after(self, k: int) -> None:
        rss = int(os.pread(self._statm, 128, 0).split()[1]) * PAGE_SIZE
        self.max_nonweight = max(self.max_nonweight, rss - self._baseline - self.window.resident_bytes)
        super().after(k)


def rss_now() -> int:
    with open("/proc/self/statm", "rb") as handle:
        return int(handle.read().split()[1]) * PAGE_SIZE


def measure(request: dict) -> Footprint:
    shapes = {name: tuple(int(d) for d in shape) for name, shape in request["shapes"].items()}
    release_memory()
    baseline = rss_now()
    executor = _Sampling(weights=WeightFile(request["weights"]), threads=request.get("threads"))
    executor.start_sampling(baseline)
    types = executor.planned.graph.elem_types
    values = request.get("values") or {}  # small integer inputs that steer control flow
    feeds = {name: np.zeros(shape, dtype=tensor_dtype_to_np_dtype(types[name]))
             for name, shape in shapes.items()}
    for name, value in values.items():
        if name in feeds and np.size(value) == feeds[name].size:
            feeds[name] = np.asarray(value, dtype=feeds[name].dtype).reshape(feeds[name].shape)
    window = executor.window
    window.set_allowance(window.min_stream_bytes)
    release_memory()  # the build's garbage (parsed graphs, planner temporaries) is not held by the engine
    # a caller holds one frame's outputs (the engine allocated them) while the next frame runs
    held = None
    for _ in range(FRAMES):
        held = executor.planned.run(feeds)
    window.set_allowance(window.total_span)
    held = executor.planned.run(feeds)  # reads every weight in; resident from here on
    peak = 0
    if reset_peak_rss():
        for _ in range(FRAMES):
            held = executor.planned.run(feeds)
        peak = status_bytes("VmHWM") - baseline - window.total_span
    del held
    return Footprint(nonweight_bytes=max(0, executor.max_nonweight, peak),
                       arena_bytes=int(executor.planned.arena_bytes_at(shapes) or 0),
                       min_stream_bytes=window.min_stream_bytes, weight_span=window.total_span)


def main(argv: list[str]) -> int:
    request = json.loads(argv[1])
    try:
        calibration = measure(request)
    except ValueError as exc:  # the model does not run at these shapes: the reason goes back
        with open(argv[2], "w") as handle:
            json.dump({"error": str(exc)}, handle)
        return 0
    write_result(argv[2], calibration, request["shapes"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
