#!/usr/bin/env python3
"""The real-model corpus (test/_corpus.py) against plain onnxruntime, in one process: outputs,
latency (median planned run / median onnxruntime run, interleaved over each model's feeds) and
which budget shares (100 / 50 / 25 % of the weights, as test/test_real_models.py defines them)
the engine accepts. A quick look, not the fresh-process benchmark (bench/engine_vs_ort.sh).

    nice -n 5 .venv/bin/python bench/corpus_check.py
"""
from __future__ import annotations

import logging
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "test"))
from _corpus import CorpusModel, available_models  # the corpus lives with the tests

from dynnet_ros.bytesize import MB
from dynnet_ros.engine import Engine
from dynnet_ros.engine.runtime.ort_executor import session_options

ROUNDS = 5


def outputs_and_latency(model: CorpusModel) -> str:
    feeds = model.feeds(np.random.default_rng(0))
    with Engine(str(model.path())) as engine:
        session = ort.InferenceSession(str(model.path()), session_options(), providers=["CPUExecutionProvider"])
        diff = max(float(np.max(np.abs(a - b))) for f in feeds
                   for a, b in zip(engine.run(f).values(), session.run(None, f)))
        ours, theirs = [], []
        for _ in range(ROUNDS):
            for f in feeds:
                start = time.perf_counter()
                engine.run(f)
                ours.append(time.perf_counter() - start)
                start = time.perf_counter()
                session.run(None, f)
                theirs.append(time.perf_counter() - start)
        executor = engine.stats()["executor"]
    return f"max |diff| {diff:.2g}, latency ours/ORT {np.median(ours) / np.median(theirs):.2f}, executor {executor}"


def budgets(model: CorpusModel) -> str:
    feeds = model.feeds(np.random.default_rng(0))[0]
    with Engine(str(model.path()), swappable=True, input_shapes={k: v.shape for k, v in feeds.items()}) as engine:
        engine.run(feeds)
        minimum = engine.min_budget_mb()
        inmemory = engine.latency_table()[-1][0]
        engine.set_memory_budget(inmemory)
        weights = engine.engine_stats().window.weight_span_bytes / MB
        shown = []
        for share in (1.0, 0.5, 0.25):
            budget = inmemory - (1.0 - share) * weights
            try:
                engine.set_memory_budget(budget)
                engine.run(feeds)
                shown.append(f"{share:.0%} {budget:.1f} MB accepted")
            except ValueError:
                shown.append(f"{share:.0%} {budget:.1f} MB refused")
    return f"weights {weights:.1f} MB, min {minimum:.1f} MB: " + ", ".join(shown)


def main() -> int:
    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)
    for model in available_models():
        print(f"{model.name}: {outputs_and_latency(model)}; {budgets(model)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
