"""The planner's CPU cost table: measured once per machine and thread count, then cached.

Why measured: what a segment ``Run``, a page fault or a multiply-accumulate costs differs between
CPUs, kernels (onnxruntime version, vector extensions) and thread counts by several times, and
the cut choice (cost_model.py) is only as good as these four figures. Measuring takes about half
a second in a child process (its allocations never touch the serving process's heap, and its
peak memory is its own); the table is cached under ``$DYNNET_LAYOUT_DIR/cost/`` keyed by all of
that, so only a machine's first engine pays for it. Each time is the minimum over a few batches:
load from other processes only ever adds time, and the minimum is the closest to the machine's
own cost.
"""
from __future__ import annotations

import hashlib
import json
import logging
import mmap
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import onnxruntime as ort

from dynnet_ros.engine.modelio.onnx_proto import (
    GraphProto,
    TensorProto,
    make_graph,
    make_model,
    make_node,
    make_opsetid,
    make_tensor,
    make_tensor_value_info,
)
from dynnet_ros.engine.plan.cost_model import CostTable
from dynnet_ros.engine.plan.layout import cpu_block_size
from dynnet_ros.memtrim import pin_mmap_threshold
from dynnet_ros.procmem import reset_peak_rss, status_bytes
from dynnet_ros.settings import settings

log = logging.getLogger(__name__)

COST_VERSION = 5
_BATCHES = 3


def cost_table(threads: int, mmap_threshold: int | None = 128 * 1024) -> CostTable:
    """This machine's table for ``threads`` (cached; measured on the first call)."""
    path = cache_dir() / f"{_key(threads, mmap_threshold)}.json"
    try:
        return replace(CostTable(**json.loads(path.read_text())), source="cached")
    except (OSError, ValueError, TypeError):
        pass
    table = _measure_in_child(threads, mmap_threshold)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({**asdict(table), "source": "measured"}))
        os.replace(tmp, path)  # atomic: a concurrent writer's table is as good as ours
    except OSError as exc:
        log.info("cost table not cached (%s)", exc)
    return table


def _key(threads: int, mmap_threshold: int | None) -> str:
    text = (f"ort={ort.__version__}|block={cpu_block_size()}|cpu={platform.processor() or platform.machine()}"
            f"|threads={threads}|mmap={mmap_threshold}|v={COST_VERSION}")
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def _measure_in_child(threads: int, mmap_threshold: int | None, timeout_s: float = 300) -> CostTable:
    proc = subprocess.run([sys.executable, "-m", "dynnet_ros.engine.plan.cost_table", str(threads),
                           str(mmap_threshold or 0)], capture_output=True, text=True, timeout=timeout_s, check=False)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise ValueError(f"measuring the planner's cost table failed: {last}")
    return CostTable(**json.loads(proc.stdout.strip().splitlines()[-1]))


def measure(threads: int, mmap_threshold: int | None = 128 * 1024) -> CostTable:
    """Measure a CostTable in this process now (about a second; the child process runs this).

    The arena factor comes first, while this process's heap holds nothing else."""
    arena_factor = _ort_arena_factor(threads)
    # kernels first, while glibc still serves their scratch buffers from its heap: page faults
    # are the fault figure's part, not the kernels'
    mac_s, byte_s = _mac_seconds(threads), _byte_seconds(threads)
    if mmap_threshold:
        pin_mmap_threshold(mmap_threshold)  # what the planned engine's segments run under
    lean_factor = _ort_arena_factor(threads, lean=True)  # as a lean session runs: after the pin
    return CostTable(run_overhead_s=_run_overhead(threads), fault_s_per_mb=_fault_per_mb(), mac_s=mac_s,
                     byte_s=byte_s, ort_arena_factor=arena_factor, lean_arena_factor=lean_factor, threads=threads,
                     source="measured")


def _best(work: Callable[[], None], repeats: int) -> float:
    """Seconds per call of ``work``: the fastest of a few batches of ``repeats`` calls."""
    work()
    best = float("inf")
    for _ in range(_BATCHES):
        start = time.perf_counter()
        for _ in range(repeats):
            work()
        best = min(best, (time.perf_counter() - start) / repeats)
    return best


def _session(graph: GraphProto, threads: int) -> ort.InferenceSession:
    """A session set up like a planned segment's (own pool, no spinning, no arena)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.enable_cpu_mem_arena = False
    options.enable_mem_pattern = False
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    model = make_model(graph, opset_imports=[make_opsetid("", 17)])
    model.ir_version = 8
    return ort.InferenceSession(model.SerializeToString(), sess_options=options, providers=["CPUExecutionProvider"])


def _bound(session: ort.InferenceSession, feeds: dict[str, np.ndarray], outputs: dict[str, np.ndarray]):
    """A call running ``session`` over ``feeds`` into ``outputs`` (bound by pointer, like a segment)."""
    io = session.io_binding()
    arrays = {**feeds, **outputs}  # the closure keeps them alive: onnxruntime holds raw pointers
    for name, array in arrays.items():
        bind = io.bind_input if name in feeds else io.bind_output
        bind(name, "cpu", 0, array.dtype, array.shape, array.ctypes.data)
    return lambda: session.run_with_iobinding(io) if arrays else None


def _run_overhead(threads: int) -> float:
    """One ``Run`` of a segment whose kernel does (almost) nothing: binding, dispatch, executor setup."""
    x = make_tensor_value_info("x", TensorProto.FLOAT, [16])
    y = make_tensor_value_info("y", TensorProto.FLOAT, [16])
    session = _session(make_graph([make_node("Relu", ["x"], ["y"])], "overhead", [x], [y]), threads)
    return _best(_bound(session, {"x": np.ones(16, np.float32)}, {"y": np.empty(16, np.float32)}), 200)


def _fault_per_mb() -> float:
    """A fresh anonymous mapping's MiB written once (what an mmap-backed malloc block costs on
    every run), minus writing a MiB that is already resident."""
    size = 4 << 20

    def fresh() -> None:
        with mmap.mmap(-1, size) as region:  # like glibc's mmap-backed blocks: no huge-page advice
            np.frombuffer(region, np.uint8).fill(1)

    resident = np.ones(size, np.uint8)
    return max(0.0, _best(fresh, 2) - _best(lambda: resident.fill(1), 2)) * (1 << 20) / size


def _mac_seconds(threads: int) -> float:
    """A 3x3 convolution, 32 -> 32 channels at 56x56, per multiply-accumulate."""
    c, side = 32, 56
    x = make_tensor_value_info("x", TensorProto.FLOAT, [1, c, side, side])
    y = make_tensor_value_info("y", TensorProto.FLOAT, [1, c, side, side])
    w = make_tensor("w", TensorProto.FLOAT, [c, c, 3, 3], np.full(c * c * 9, 0.01, np.float32))
    node = make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])
    session = _session(make_graph([node], "conv", [x], [y], [w]), threads)
    run = _bound(session, {"x": np.ones((1, c, side, side), np.float32)},
                 {"y": np.empty((1, c, side, side), np.float32)})
    return _best(run, 10) / (c * c * 9 * side * side)


def _byte_seconds(threads: int) -> float:
    """An element-wise Add over 1 Mi floats, per byte read or written."""
    n = 1 << 20
    x, y = (make_tensor_value_info(name, TensorProto.FLOAT, [n]) for name in ("x", "y"))
    session = _session(make_graph([make_node("Add", ["x", "x"], ["y"])], "add", [x], [y]), threads)
    run = _bound(session, {"x": np.ones(n, np.float32)}, {"y": np.empty(n, np.float32)})
    return _best(run, 10) / (3 * 4 * n)


#: (H, W) sequence the arena factor is measured over: sizes a camera model meets, largest last but one
_ARENA_SIDES = ((224, 320), (480, 640), (320, 320), (640, 480), (640, 640), (256, 448))


def _ort_arena_factor(threads: int, *, lean: bool = False) -> float:
    """Peak memory of a plain onnxruntime session (default options, as users run it; ``lean``: no
    memory patterns, as runtime/ort_executor.py's lean session) over a shape sequence, per byte live at
    once at the largest shape, on a small encoder-decoder."""
    x = make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "H", "W"])
    y = make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, "H", "W"])
    rng = np.random.default_rng(0)
    shapes = {"w1": (16, 3, 3, 3), "w2": (32, 16, 3, 3), "w3": (32, 32, 3, 3), "w4": (1, 32, 3, 3)}
    weights = [make_tensor(n, TensorProto.FLOAT, s, rng.standard_normal(s).astype(np.float32).ravel() * 0.1)
               for n, s in shapes.items()]
    scales = make_tensor("scales", TensorProto.FLOAT, [4], [1.0, 1.0, 4.0, 4.0])
    nodes = [make_node("Conv", ["x", "w1"], ["t1"], pads=[1, 1, 1, 1], strides=[2, 2]),
             make_node("Relu", ["t1"], ["r1"]),
             make_node("Conv", ["r1", "w2"], ["t2"], pads=[1, 1, 1, 1], strides=[2, 2]),
             make_node("Conv", ["t2", "w3"], ["t3"], pads=[1, 1, 1, 1]),
             make_node("Resize", ["t3", "", "scales"], ["t4"], mode="nearest"),
             make_node("Conv", ["t4", "w4"], ["y"], pads=[1, 1, 1, 1])]
    model = make_model(make_graph(nodes, "arena", [x], [y], weights + [scales]),
                              opset_imports=[make_opsetid("", 17)])
    model.ir_version = 8
    feeds = [np.ones((1, 3, h, w), np.float32) for h, w in _ARENA_SIDES]
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    options.enable_mem_pattern = not lean
    reset_peak_rss()
    base = status_bytes("VmRSS")
    session = ort.InferenceSession(model.SerializeToString(), sess_options=options, providers=["CPUExecutionProvider"])
    for feed in feeds:
        session.run(None, {"x": feed})
    held = status_bytes("VmHWM") - base
    h, w = max(_ARENA_SIDES, key=lambda s: s[0] * s[1])
    # live at once, worst step (float32): the fused Conv+Relu's output, then t2+t3, t3+t4, t4+y
    quarter = 32 * (h // 4) * (w // 4)
    live = 4 * max(16 * (h // 2) * (w // 2) + 32 * (h // 4) * (w // 4), 2 * quarter,
                   quarter + 32 * h * w, 33 * h * w)
    return max(1.0, held / live)


def cache_dir() -> Path:
    """Where the tables live (documented in docs/engine.md)."""
    return settings().cache.layout_dir / "cost"


if __name__ == "__main__":  # the child process of _measure_in_child: the table as one JSON line
    print(json.dumps(asdict(measure(int(sys.argv[1]), int(sys.argv[2]) or None))))
