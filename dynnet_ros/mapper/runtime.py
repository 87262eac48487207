"""The stage runtime: stages run concurrently on their units and the first confident exit answers.

Why this shape: each unit has one worker thread (pinned to its cores for a CPU group) that runs
its stages in frame order. A frame hands every stage to its unit at once; a stage starts as soon
as the tensors it reads exist (the earlier stages' output arrays themselves, passed by
reference, never copied). When a stage finishes, its worker evaluates the stage's exit at once;
if the confidence reaches the stage's threshold (or the exit is the last), that exit answers the
frame and the stages still pending for it are cancelled: a running onnxruntime session is told to
stop (``RunOptions.terminate``), queued ones are skipped, a TensorRT stage's result is dropped.
The caller gets the answer without waiting for them, so the next frame does not block on work
nobody needs. With ``deadline_ms`` (anytime mode) the frame answers by the deadline with the
deepest exit finished by then (the first exit to finish when none has); an exit that only cuts
(``answer: none``) never answers.

The answer has the final exit's output names; an early exit's outputs stand in for them
position by position, or (``answer: empty``) they are empty along their first axis.
``last_result`` says which exit answered and whether it was early.
"""
from __future__ import annotations

import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnxruntime as ort

from dynnet_ros.engine.modelio.onnx_proto import tensor_dtype_to_np_dtype
from dynnet_ros.engine.runtime.base import ExecutorStats

from .exits import ExitSpec
from .hardware import Hardware
from .mapping import StageMapping, check_stage_count
from .stages import Part, Stage, StageSet, stage_parts
from .units import OrtStage, TensorRTStage, UnitPlan, open_stage, pin_current_thread, plan_unit, trt_reason


@dataclass
class FrameResult:
    """How one frame was answered."""

    exit_index: int                 # the stage whose exit answered
    early: bool                     # an exit before the last answered
    confidence: float               # that exit's confidence
    latency_ms: float               # from run() to the answer
    deadline_hit: bool = False      # the deadline chose the exit
    stage_ms: dict[int, float] = field(default_factory=dict)   # stages finished by the answer: run time
    skipped: tuple[int, ...] = ()   # stages cancelled or dropped for this frame
    #: stages finished by the answer: (first part's start, last part's end), ms after run() began
    spans: dict[int, tuple[float, float]] = field(default_factory=dict)
    #: stages finished by the answer: each part's (start, end), ms after run() began; a stage cut
    #: into parts waits between them for an earlier stage's tensors, which its span includes
    runs: dict[int, tuple[tuple[float, float], ...]] = field(default_factory=dict)

    @property
    def overlap(self) -> float:
        """The share of the stages' run time that ran beside another stage: 1 - (time any part
        ran) / (sum of the parts' run times); 0 when they ran one after the other. From the parts'
        runs, not the spans: a stage waiting between its parts runs nothing beside another."""
        intervals = sorted(interval for parts in self.runs.values() for interval in parts)
        total = sum(end - start for start, end in intervals)
        if total <= 0:
            return 0.0
        covered, reach = 0.0, float("-inf")
        for start, end in intervals:
            covered += max(0.0, end - max(start, reach))
            reach = max(reach, end)
        return max(0.0, 1.0 - covered / total)


class _Frame:
    """The tensors, exits and answer of one frame; shared by the caller and the unit workers."""

    def __init__(self, feeds: Mapping[str, np.ndarray], stages: int, started: float) -> None:
        self.cond = threading.Condition()
        self.values: dict[str, np.ndarray] = dict(feeds)
        self.done: dict[int, float] = {}             # stage -> its run ms
        self.confidence: dict[int, float] = {}
        self.order: list[int] = []                   # stages in the order they finished
        self.finished_at: dict[int, float] = {}      # stage -> clock when its exit was judged
        self.limit: float | None = None              # clock of the deadline (anytime mode)
        self.answer: int | None = None
        self.deadline_hit = False
        self.error: BaseException | None = None
        self.run_options: dict[int, ort.RunOptions] = {}
        self.part_ms: dict[int, float] = {}          # stage -> its parts' run ms so far
        self.spans: dict[int, tuple[float, float]] = {}   # stage -> (first part start, last part end)
        self.runs: dict[int, list[tuple[float, float]]] = {}   # stage -> each part's (start, end)
        self.stages = stages
        self.started = started                       # clock when run() began

    def cancel_rest(self) -> None:
        """Stop stages still running for this frame (call with ``cond`` held)."""
        for options in self.run_options.values():
            options.terminate = True


@dataclass
class _Task:
    frame: _Frame
    stage: Stage
    part: Part
    runner: OrtStage | TensorRTStage
    last_part: bool
    threshold: float | None
    final: bool


class _UnitWorker:
    """One thread per unit: runs its tasks in order, pinned to the unit's cores."""

    def __init__(self, plan: UnitPlan, on_task: Callable[[_Task], None]) -> None:
        self.plan = plan
        self.busy_s = 0.0
        self._tasks: queue.SimpleQueue[_Task | None] = queue.SimpleQueue()
        self._on_task = on_task
        self._thread = threading.Thread(target=self._loop, name=f"mapper-{plan.unit}", daemon=True)
        self._thread.start()

    def submit(self, task: _Task) -> None:
        self._tasks.put(task)

    def stop(self) -> None:
        self._tasks.put(None)
        self._thread.join(timeout=30)

    def _loop(self) -> None:
        pin_current_thread(self.plan.cores)
        while True:
            task = self._tasks.get()
            if task is None:
                return
            self._on_task(task)


class StageExecutor:
    """Executor protocol over a StageSet mapped onto a Hardware's units (see the module docstring).

    ``mapping``: one StageAssignment per stage (unit, DVFS level, exit threshold); ``criterion``
    overrides every early exit's own; ``deadline_ms`` turns on anytime mode; ``budget_bytes``:
    the model's memory budget, which the stages' weights must fit (ValueError otherwise);
    ``clock``: monotonic seconds, read for the deadline, the latencies and the stages' run times,
    so that a caller (a test) can decide when each stage finishes against the deadline instead of
    leaving it to how fast the machine runs."""

    name = "mapped"

    def __init__(self, stage_set: StageSet, mapping: StageMapping, *, budget_bytes: int | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        check_stage_count(mapping, len(stage_set.stages))
        self._clock = clock
        self.stage_set = stage_set
        self.mapping = mapping
        self.hardware: Hardware = mapping.hardware
        self._lock = threading.Lock()
        self._exits = [self._exit_of(stage, mapping.criterion) for stage in stage_set.stages]
        self._thresholds = list(mapping.thresholds)
        self.deadline_ms = mapping.deadline_ms
        weights = sum(stage.weight_bytes for stage in stage_set.stages)
        if budget_bytes is not None and weights > budget_bytes:
            raise ValueError(f"the stages' weights ({weights / 2**20:.1f} MB) exceed the model's budget "
                             f"({budget_bytes / 2**20:.1f} MB)")
        self._final_types = self._final_value_types(stage_set)
        dla_units = [u.name for u in self.hardware.units if u.kind == "dla"]
        reason = trt_reason() if any(self.hardware.unit(a.unit).kind != "cpu" for a in mapping.stages) else None
        self.plans: dict[str, UnitPlan] = {}
        self._runners: list[list[tuple[Part, OrtStage | TensorRTStage]]] = []
        self._workers: dict[str, _UnitWorker] = {}
        try:
            for stage, assignment in zip(stage_set.stages, mapping.stages):
                unit = self.hardware.unit(assignment.unit)
                plan = self.plans.get(unit.name) or plan_unit(unit, dla_units=dla_units, trt_reason=reason)
                self.plans[unit.name] = plan
                self._runners.append([(part, open_stage(part.model, plan))
                                      for part in stage_parts(stage, stage_set.kind)])
            for unit_name, plan in self.plans.items():
                self._workers[unit_name] = _UnitWorker(plan, self._run_task)
        except BaseException:  # any exit, interrupts included: workers and sessions close; re-raised
            self.close()
            raise
        self._started = self._clock()
        self.histogram: Counter[int] = Counter()
        self.frames = 0
        self._latency_sum_ms = 0.0
        self.last_result: FrameResult | None = None
        self._stage_ms: dict[int, float] = {}

    # ------------------------------------------------------------------ configuration
    @staticmethod
    def _exit_of(stage: Stage, criterion: str | None) -> ExitSpec:
        """The stage's exit, judged by ``criterion`` where the mapping overrides it."""
        spec = stage.exit
        return spec if criterion is None else ExitSpec(spec.outputs, criterion, spec.answer, spec.confidence_tensor)

    def set_thresholds(self, thresholds: Sequence[float | None]) -> None:
        """Exit thresholds per stage (the last one None); applies from the next frame."""
        if len(thresholds) != len(self._exits) or thresholds[-1] is not None:
            raise ValueError(f"give {len(self._exits)} thresholds, the last one None (its exit always answers)")
        with self._lock:
            self._thresholds = list(thresholds)

    def set_deadline(self, deadline_ms: float | None) -> None:
        """Anytime mode from the next frame (None: off)."""
        if deadline_ms is not None and not deadline_ms > 0:
            raise ValueError(f"deadline_ms must be positive or None, got {deadline_ms!r}")
        self.deadline_ms = deadline_ms

    @property
    def thresholds(self) -> tuple[float | None, ...]:
        return tuple(self._thresholds)

    # ------------------------------------------------------------------ one frame
    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Answer one frame (outputs: the final exit's names)."""
        stages = self.stage_set.stages
        frame = _Frame(feeds, len(stages), self._clock())
        with self._lock:
            thresholds = list(self._thresholds)
        deadline = self.deadline_ms
        frame.limit = None if deadline is None else frame.started + deadline / 1000.0
        for stage, parts, threshold in zip(stages, self._runners, thresholds):
            unit = self.mapping.stages[stage.index].unit
            for j, (part, runner) in enumerate(parts):
                self._workers[unit].submit(_Task(frame, stage, part, runner, j == len(parts) - 1, threshold,
                                                 stage.index == len(stages) - 1))
        with frame.cond:
            while frame.answer is None and frame.error is None:
                remaining = None if frame.limit is None else frame.limit - self._clock()
                if remaining is not None and remaining <= 0:
                    if self._past_deadline(frame):
                        break
                    remaining = None   # nothing finished yet: the first exit to finish answers
                frame.cond.wait(remaining)
            if frame.answer is None and frame.error is not None:
                frame.cancel_rest()
                raise frame.error
            answer = frame.answer
            assert answer is not None
            stage_ms = dict(frame.done)
            since = frame.started
            spans = {k: ((a - since) * 1000.0, (b - since) * 1000.0)
                     for k, (a, b) in frame.spans.items() if k in stage_ms}
            runs = {k: tuple(((a - since) * 1000.0, (b - since) * 1000.0) for a, b in parts)
                    for k, parts in frame.runs.items() if k in stage_ms}
            confidence = frame.confidence.get(answer, float("nan"))
            values = {name: frame.values[name] for name in self._exits[answer].outputs}
        latency = (self._clock() - frame.started) * 1000.0
        result = FrameResult(answer, answer < len(stages) - 1, confidence, latency, frame.deadline_hit, stage_ms,
                             tuple(s.index for s in stages if s.index not in stage_ms), spans, runs)
        with self._lock:
            self.frames += 1
            self._latency_sum_ms += latency
            self.histogram[answer] += 1
            self.last_result = result
            for index, ms in stage_ms.items():
                self._stage_ms[index] = ms
        return self._answer(answer, values)

    def _past_deadline(self, frame: _Frame) -> bool:
        """Past the deadline (``frame.cond`` held): the deepest exit that finished by then answers,
        else the first to finish after it; False while none has finished."""
        limit = frame.limit
        assert limit is not None
        answers = [k for k in frame.order if self._exits[k].answer != "none"]
        if not answers:
            return False
        in_time = [k for k in answers if frame.finished_at[k] <= limit]
        self._decide(frame, max(in_time) if in_time else answers[0], deadline_hit=True)
        return True

    def _decide(self, frame: _Frame, index: int, deadline_hit: bool = False) -> None:
        """Exit ``index`` answers ``frame`` (``frame.cond`` held): cancel what still runs."""
        frame.answer = index
        frame.deadline_hit = frame.deadline_hit or deadline_hit
        frame.cancel_rest()
        frame.cond.notify_all()

    def _run_task(self, task: _Task) -> None:
        """On a unit's worker: wait for the part's inputs, run it, judge the stage's exit after its
        last part."""
        frame, stage = task.frame, task.stage
        options = ort.RunOptions()
        with frame.cond:
            while True:
                if frame.answer is not None or frame.error is not None:
                    return
                if all(name in frame.values for name in task.part.inputs):
                    break
                frame.cond.wait()
            feeds = {name: frame.values[name] for name in task.part.inputs}
            frame.run_options[stage.index] = options
        worker = self._workers[self.mapping.stages[stage.index].unit]
        start = self._clock()
        try:
            outputs = task.runner.run(feeds, options)
        except Exception as exc:  # noqa: BLE001 - a terminated run, or a real failure to report
            with frame.cond:
                frame.run_options.pop(stage.index, None)
                if frame.answer is None and not options.terminate:
                    frame.error = exc
                    frame.cond.notify_all()
            return
        finally:
            ended = self._clock()
            worker.busy_s += ended - start
        ms = (ended - start) * 1000.0
        spec = self._exits[stage.index]
        confidence = spec.confidence(outputs) if task.last_part else 0.0
        with frame.cond:
            frame.run_options.pop(stage.index, None)
            if frame.answer is not None:
                return   # answered meanwhile: the result is dropped
            frame.values.update(outputs)
            frame.part_ms[stage.index] = frame.part_ms.get(stage.index, 0.0) + ms
            began = frame.spans.get(stage.index, (start, start))[0]
            frame.spans[stage.index] = (began, ended)
            frame.runs.setdefault(stage.index, []).append((start, ended))
            if not task.last_part:
                frame.cond.notify_all()
                return
            frame.done[stage.index] = frame.part_ms[stage.index]
            frame.confidence[stage.index] = confidence
            frame.order.append(stage.index)
            frame.finished_at[stage.index] = self._clock()
            if task.threshold is not None and spec.answer != "none" and confidence >= task.threshold:
                self._decide(frame, stage.index)
            elif frame.limit is not None and frame.finished_at[stage.index] >= frame.limit \
                    and self._past_deadline(frame):
                pass   # judged here: the caller may not have woken up yet
            elif task.final:
                self._decide(frame, stage.index)
            else:
                frame.cond.notify_all()

    def _answer(self, index: int, values: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        spec = self._exits[index]
        final = self.stage_set.final_outputs
        if index == len(self._exits) - 1:
            return {name: values[name] for name in final}
        if spec.answer == "empty":
            return {name: np.zeros((0, *shape[1:]), dtype) for name, (dtype, shape) in self._final_types.items()}
        return {name: values[source] for name, source in zip(final, spec.outputs)}

    @staticmethod
    def _final_value_types(stage_set: StageSet) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
        """dtype and static trailing dims of the final outputs (for the "empty" answer)."""
        last = stage_set.stages[-1].model.graph.output
        out = {}
        for value in last:
            if value.name in stage_set.final_outputs:
                tensor = value.type.tensor_type
                dims = tuple(d.dim_value if d.HasField("dim_value") else 0 for d in tensor.shape.dim)
                out[value.name] = (np.dtype(tensor_dtype_to_np_dtype(tensor.elem_type)), dims)
        return out

    # ------------------------------------------------------------------ Executor protocol
    def busy_fractions(self) -> dict[str, float]:
        """Per unit: the share of wall time since start its stages ran."""
        wall = max(self._clock() - self._started, 1e-9)
        return {name: min(1.0, worker.busy_s / wall) for name, worker in self._workers.items()}

    def reset_counters(self) -> None:
        """Start the busy fractions and the exit histogram afresh."""
        with self._lock:
            self._started = self._clock()
            for worker in self._workers.values():
                worker.busy_s = 0.0
            self.histogram.clear()
            self.frames = 0
            self._latency_sum_ms = 0.0

    def details(self) -> dict[str, Any]:
        with self._lock:
            last = self.last_result
            return {"stages": len(self._exits), "units": {u: p.reason for u, p in self.plans.items()},
                    "mapping": [a.unit for a in self.mapping.stages], "thresholds": list(self._thresholds),
                    "deadline_ms": self.deadline_ms, "frames": self.frames,
                    "mean_latency_ms": round(self._latency_sum_ms / self.frames, 3) if self.frames else None,
                    "predicted_latency_ms": self.mapping.predicted_latency_ms,
                    "exit_histogram": {str(k): v for k, v in sorted(self.histogram.items())},
                    "busy_fraction": {k: round(v, 3) for k, v in self.busy_fractions().items()},
                    "stage_ms": {str(k): round(v, 3) for k, v in sorted(self._stage_ms.items())},
                    "last_exit": None if last is None else last.exit_index,
                    "last_early": None if last is None else last.early,
                    "last_deadline_hit": None if last is None else last.deadline_hit}

    def executor_stats(self) -> ExecutorStats:
        weights = sum(stage.weight_bytes for stage in self.stage_set.stages)
        return ExecutorStats(blocks=len(self._exits), resident_weight_bytes=weights, details=self.details())

    def arena_bytes_at(self, shapes: Mapping[str, tuple[int, ...]]) -> int | None:
        return None   # each stage's onnxruntime arena: not planned here

    def close(self) -> None:
        for worker in self._workers.values():
            worker.stop()
        self._workers = {}
        for parts in self._runners:
            for _part, runner in parts:
                runner.close()
        self._runners = []
