"""Whether a cut set runs within a latency limit of one plain onnxruntime session, timed on the
model itself; and which point of the cost model's curve to take when its pick does not.

Why: the cost model (plan/cost_model.py) predicts from a table measured on synthetic segments.
On a real export, costs it does not see (onnxruntime's set-up of every ``Run``, kernel scratch
buffers allocated per run) can make a few hundred segments far slower than predicted. With no
budget the planner promises no more time than onnxruntime, so the verdict's child process
(cut_verdict.py) runs the cost model's pick against one plain session at the reference shape;
where it is over the limit, it bisects the coarser points of the curve (each merge trades memory
for time) for the leanest one within it, or settles on one plain session where none is. The
verdict is cached, so a serving process never times anything.
"""
from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from dynnet_ros.engine.modelio.models import InputSpec
from dynnet_ros.engine.plan.cost_model import CutChoice, CutPoint
from dynnet_ros.engine.runtime.base import Executor

#: runs of each side before timing: past PlannerOptions.hot_after, so shape-specialised segment
#: sessions exist, and onnxruntime's arena has grown to the shape
WARM_RUNS = 10
#: alternating batches per side; the minimum of each side is kept (load only ever adds time)
ROUNDS = 4
#: a batch lasts about this long, so a sub-millisecond model is not timed by the clock's jitter
BATCH_S = 0.05
#: untimed runs before each batch: the first runs after the other side ran are slower (the plain
#: session's idle threads still spin on the cores; caches and pages hold the other side's data),
#: and a model served in its own process never pays for that
SETTLE_RUNS = 3
#: points timed at most while bisecting the curve (each one builds the plan's sessions)
MAX_PROBES = 6


@dataclass(frozen=True)
class Probe:
    """One timed point: its segments and its time over one plain session's (min over batches)."""

    segments: int
    ratio: float

    def describe(self) -> dict:
        return {"segments": self.segments, "ratio": round(self.ratio, 3)}


def candidates(choice: CutChoice, fallback_min_saving: float) -> list[CutPoint]:
    """The points timing may pick, leanest first: the cost model's pick, then every coarser point
    of the curve that still saves ``fallback_min_saving`` of the single session's activations."""
    curve = [p for p in choice.curve if not p.single_session]
    start = curve.index(choice.chosen) if choice.chosen in curve else 0
    ceiling = (1 - fallback_min_saving) * choice.session.activation_bytes
    return [p for k, p in enumerate(curve) if k >= start and (k == start or p.activation_bytes <= ceiling)]


def search(count: int, measure: Callable[[int], float], limit: float,
           max_probes: int = MAX_PROBES) -> tuple[int | None, list[tuple[int, float]]]:
    """The lowest index in ``range(count)`` whose ``measure`` is within ``limit``, or None.

    Indexes run leanest to fastest, so the measure is taken to fall along them: index 0 (the
    cost model's pick) first, then the last (the fastest: None where it is over the limit too),
    then bisection between them. At most ``max_probes`` measures; bisection stops at the leanest
    index known to be within. Returns the index and every (index, measure) taken."""
    if count < 1:
        return None, []
    probes = [(0, measure(0))]
    if probes[0][1] <= limit:
        return 0, probes
    if count == 1:
        return None, probes
    last = count - 1
    probes.append((last, measure(last)))
    if probes[-1][1] > limit:
        return None, probes
    over, within = 0, last
    while within - over > 1 and len(probes) < max_probes:
        middle = (over + within) // 2
        probes.append((middle, measure(middle)))
        if probes[-1][1] <= limit:
            within = middle
        else:
            over = middle
    return within, probes


def reference_feeds(specs: Sequence[InputSpec], shapes: Mapping[str, tuple[int, ...]],
                    seed: int = 0) -> dict[str, np.ndarray]:
    """Feeds at the reference shapes: noise for float inputs, zeros for the rest (indices, sizes,
    flags: zero is valid where noise is not). Inputs with a default or of another kind than a
    tensor are left out, as a caller may."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for spec in specs:
        if spec.kind != "tensor" or spec.has_default or spec.name not in shapes:
            continue
        shape = tuple(int(d) for d in shapes[spec.name])
        if np.issubdtype(spec.dtype, np.floating):
            feeds[spec.name] = rng.standard_normal(shape).astype(spec.dtype)
        else:
            feeds[spec.name] = np.zeros(shape, spec.dtype)
    return feeds


def load_per_core() -> float:
    """The 1-minute load average per core while timing, kept with the verdict: a plain session's
    spinning threads lose far more to other processes than segment sessions do, so a verdict
    timed on a busy machine can differ from one timed idle (docs/engine.md, "Timed cut choice")."""
    return round(os.getloadavg()[0] / (os.cpu_count() or 1), 2)


def time_ratio(candidate: Executor, baseline: Executor, feeds: Mapping[str, np.ndarray]) -> float:
    """``candidate``'s time per run over ``baseline``'s, each the fastest of ``ROUNDS`` batches,
    the two sides alternating so that load from other processes falls on both. Each batch starts
    after ``SETTLE_RUNS`` untimed runs."""
    for _ in range(WARM_RUNS):
        candidate.run(feeds)
        baseline.run(feeds)
    start = time.perf_counter()
    baseline.run(feeds)
    batch = max(1, math.ceil(BATCH_S / max(time.perf_counter() - start, 1e-6)))
    best = {"candidate": math.inf, "baseline": math.inf}
    for _ in range(ROUNDS):
        for side, executor in (("candidate", candidate), ("baseline", baseline)):
            for _ in range(SETTLE_RUNS):
                executor.run(feeds)
            start = time.perf_counter()
            for _ in range(batch):
                executor.run(feeds)
            best[side] = min(best[side], (time.perf_counter() - start) / batch)
    return best["candidate"] / best["baseline"]
