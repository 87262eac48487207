"""Per-call cost of ``Engine.run`` beside plain onnxruntime, for models that run in microseconds.

Why: on a model whose run takes tens of microseconds (a voice-activity detector) the Python
around the run decides the latency ratio. This prints, in one process and alternating so load
hits every line alike, the best per-call time of: onnxruntime's defaults, a lean session
(runtime/ort_executor.py), ``Engine.run``, the engine's executor alone, and the engine's per-call steps
(feed check, shape signature, control values) on their own.

Usage: .venv/bin/python bench/call_overhead.py MODEL [--threads N] [--calls N] [--repeats N]
MODEL: a corpus model name (test/_corpus.py), or a zoo name / ONNX path (image sides at 320).
"""
from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort

from dynnet_ros.commands.bench import make_feeds
from dynnet_ros.engine import Engine
from dynnet_ros.engine.modelio.feeds import shape_signature
from dynnet_ros.engine.modelio.models import input_specs, load_model
from dynnet_ros.engine.runtime.ort_executor import session_options
from dynnet_ros.zoo import resolve_model_spec

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "test"))
import _corpus  # test helper module, found through the path set just above


def model_and_feeds(name: str) -> tuple[str, dict[str, np.ndarray]]:
    """The model file and the first feed the benchmark's feeds would give it."""
    try:
        model = _corpus.by_name(name)
    except KeyError:
        path = resolve_model_spec(name)
        specs = input_specs(load_model(path, check=False, external_data=False))
        return path, make_feeds(specs, 320, 320, np.random.default_rng(0))
    path = model.path()
    if path is None:
        raise SystemExit(model.skip_reason)
    return str(path), model.feeds(np.random.default_rng(0))[0]


def mean_us(call: Callable[[], object], calls: int) -> float:
    """Mean time of ``calls`` calls in a row, in microseconds."""
    start = time.perf_counter()
    for _ in range(calls):
        call()
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    path, feeds = model_and_feeds(args.model)
    engine = Engine(path, threads=args.threads)
    executor = engine._executor
    assert executor is not None
    plain = ort.InferenceSession(path, sess_options=session_options(args.threads), providers=["CPUExecutionProvider"])
    lean = ort.InferenceSession(path, sess_options=session_options(args.threads, lean=True),
                                providers=["CPUExecutionProvider"])
    checked = engine._check_feeds(feeds)
    lines: dict[str, Callable[[], object]] = {
        "onnxruntime, defaults": lambda: plain.run(None, feeds),
        "onnxruntime, lean session": lambda: lean.run(None, feeds),
        f"Engine.run ({executor.name}{', lean' if getattr(executor, 'lean', False) else ''})":
            lambda: engine.run(feeds),
        "the engine's executor alone": lambda: executor.run(checked),
        "feed check": lambda: engine._check_feeds(feeds),
        "shape signature": lambda: shape_signature(checked),
        "control values": lambda: engine._record_control_values(checked),
    }
    for call in lines.values():  # warm up: first runs at this shape
        call()
    best = {label: float("inf") for label in lines}
    for _ in range(args.repeats):  # alternating rounds; the best of each line (load only adds time)
        for label, call in lines.items():
            best[label] = min(best[label], mean_us(call, args.calls))
    print(f"{args.model}: best of {args.repeats} x {args.calls} calls, {args.threads} threads")
    for label, us in best.items():
        print(f"  {label:34s} {us:8.2f} us")
    gap = best[next(k for k in lines if k.startswith("Engine.run"))] - best["onnxruntime, defaults"]
    print(f"  Engine.run - onnxruntime's defaults  {gap:8.2f} us")
    engine.close()


if __name__ == "__main__":
    main()
