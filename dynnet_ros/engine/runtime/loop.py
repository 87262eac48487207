"""Control flow in the planned engine: a ``Loop`` body runs as its own plan, one per iteration shape.

Why not onnxruntime's ``Loop``: its body's intermediates, loop-carried values and scan outputs
all come from onnxruntime's allocator, one fresh set per iteration, outside our arena and plans.
Here the body is compiled once into a nested PlannedExecutor (its inputs: the iteration number,
the condition, the loop-carried values with symbolic dims, and the outer-scope tensors it reads)
and run iteration by iteration from Python. Each iteration looks its plan up by the body's input
shape signature, so a loop-carried tensor that grows (Concat per iteration) gets one plan per
shape, cached, and reused on the next run. Loop-carried values ping-pong between two buffers
(iteration ``i`` reads one, writes the other; no allocation per iteration while shapes hold) and
the last values are handed out in place, not copied; scan outputs are written straight into
their stacked result (ONNX semantics: a new axis 0, one entry per iteration that ran). The body's
intermediates live in the arena its plans share with the model's If branches.
"""
from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import onnxruntime as ort

from dynnet_ros.bytesize import MB
from dynnet_ros.engine.modelio.onnx_proto import (
    GraphProto,
    ModelProto,
    NodeProto,
    TensorProto,
    ValueInfoProto,
    make_tensor_value_info,
)
from dynnet_ros.engine.plan.arena import ALIGN, Arena, align
from dynnet_ros.engine.plan.graph import GraphIndex, node_inputs
from dynnet_ros.engine.plan.segmentation import Segment
from dynnet_ros.engine.runtime.control_flow import NestedExecutorFactory, branch_model
from dynnet_ros.engine.runtime.ort_executor import default_threads
from dynnet_ros.engine.runtime.segments import SegmentRunner

log = logging.getLogger(__name__)

# Loop bodies see a new shape signature per iteration when a carried tensor grows: keep more
# plans than a model's default cache so a whole run's plans survive to the next run.
BODY_PLAN_CACHE = 256
# A loop whose inputs are all at most this many bytes (default: PlannerOptions.small_bytes) runs
# through onnxruntime's own Loop: per iteration it costs ~2 us there against ~40 us of Python
# and session calls here, and tensors that small gain nothing from planning.
# Weights a Loop reads may be copied into that second session only up to this many bytes.
SMALL_LOOP_WEIGHT_BYTES = MB
# Scan outputs of a loop with a trip count are allocated for all of it up to this many bytes.
STACK_RESERVE_BYTES = 1 << 30
# Returned carry buffers kept for reuse once their results are dropped (bytes held like an arena).
SPARE_BUFFERS = 1


@dataclass
class LoopStats:
    """What a LoopRunner did (tests and reports read it)."""

    runs: int = 0                  # runs through the body's plans
    iterations: int = 0            # body iterations those runs took
    onnxruntime_runs: int = 0      # small loops handed to onnxruntime's Loop


def _declared_dims(value: ValueInfoProto) -> list | None:
    """Dims as declared (int, name or None), or None when the value has no shape."""
    tensor = value.type.tensor_type
    if not value.type.HasField("tensor_type") or not tensor.HasField("shape"):
        return None
    return [int(d.dim_value) if d.HasField("dim_value") else (d.dim_param or None) for d in tensor.shape.dim]


def _scalar_shape(value: ValueInfoProto) -> tuple[int, ...]:
    """Shape of the iteration number / condition fed to the body: () unless it declares rank 1
    (onnxruntime's Loop feeds them with the body input's rank the same way)."""
    dims = _declared_dims(value)
    return (1,) * len(dims) if dims else ()


def body_model(node: NodeProto, body: GraphProto, parent: GraphIndex, skeleton: ModelProto,
               weights: Mapping[str, np.ndarray], ranks: Mapping[str, int]) -> ModelProto:
    """A standalone model for a Loop body: its own inputs first, loop-carried ones with symbolic
    dims (their shape may change per iteration), then the outer-scope tensors it reads.

    Shapes the body declares for its intermediates and outputs are dropped: they describe one
    trace, not every iteration, and the plans are per concrete signature anyway."""
    if len(body.input) != len(node.input) or len(body.input) < 2:
        raise ValueError(f"Loop {node.name!r}: body has {len(body.input)} inputs for {len(node.input)} node inputs")
    iteration, condition = body.input[0], body.input[1]
    formal = [make_tensor_value_info(iteration.name, TensorProto.INT64, list(_scalar_shape(iteration))),
              make_tensor_value_info(condition.name, TensorProto.BOOL, list(_scalar_shape(condition)))]
    for k, (value, initial) in enumerate(zip(body.input[2:], node.input[2:])):
        elem = value.type.tensor_type.elem_type or parent.elem_types.get(initial)
        declared = _declared_dims(value)
        rank = len(declared) if declared is not None else ranks.get(initial)
        if parent.is_weight(initial):
            rank = len(parent.initializers[initial].dims)
        if not elem or rank is None:
            raise ValueError(f"loop-carried {value.name!r} has no known type/rank")
        formal.append(make_tensor_value_info(value.name, elem, [f"v{k}_{axis}" for axis in range(rank)]))
    stripped = GraphProto()
    stripped.CopyFrom(body)
    for value in list(stripped.value_info) + list(stripped.output):
        if value.type.HasField("tensor_type"):
            value.type.tensor_type.ClearField("shape")
    return branch_model(stripped, parent, skeleton, weights, ranks, formal)


class _CarryBuffer:
    """Loop-carried values of one iteration parity: a byte buffer that grows in place.

    Why not a fresh allocation per growth: ``ndarray.resize`` reallocates, which glibc does with
    ``mremap`` for big blocks — pages already touched move over, only the new tail faults in.
    A carried tensor that grows by a slice per iteration then costs page faults for the growth
    only, not for its whole size every iteration. Resizing is only done while the buffer's
    contents are dead (iteration i overwrites what i - 2 wrote)."""

    def __init__(self, raw: np.ndarray | None = None) -> None:
        self.raw = np.empty(0, np.uint8) if raw is None else raw
        self.base = 0

    def ensure(self, nbytes: int) -> None:
        if self.raw.size < nbytes + ALIGN:
            self.raw.resize(nbytes + ALIGN, refcheck=False)  # nothing reads the old bytes any more
        self.base = (-self.raw.ctypes.data) % ALIGN

    def holds(self, array: np.ndarray) -> bool:
        begin = self.raw.ctypes.data
        return self.raw.size > 0 and begin <= array.ctypes.data < begin + self.raw.size


class _Lease:
    """Hands a carry buffer's bytes out as results and takes them back when the last result dies.

    Why: the final loop-carried values are returned in place (no copy of a grown tensor), so the
    buffer leaves with them; without this the next run would fault all its pages in again
    (onnxruntime's arena recycles such chunks the same way). numpy keeps the object behind
    ``__array_interface__`` as the arrays' base, so ``__del__`` runs when the last one goes."""

    def __init__(self, raw: np.ndarray, spares: list) -> None:
        self.raw = raw
        self.spares = spares
        self.__array_interface__ = raw.__array_interface__

    def adopt(self, value: np.ndarray) -> np.ndarray:
        """``value`` (a view of ``raw``) as a view whose base is this lease."""
        whole = np.asarray(self)
        start = value.ctypes.data - self.raw.ctypes.data
        return whole[start:start + value.nbytes].view(value.dtype).reshape(value.shape)

    def __del__(self) -> None:
        self.spares.append(self.raw)
        del self.spares[:-SPARE_BUFFERS]  # bounded: the newest (largest shapes seen) stay


class _Stack:
    """One scan output: per-iteration tensors stacked along a new axis 0, written in place.

    Given the parent's slot (its shape known), iterations write straight into it; otherwise a
    buffer sized for the trip count (pages are only touched as iterations write them), doubling
    when the count is unknown or huge (a ``while`` exported with M = INT64_MAX), trimmed at the
    end."""

    def __init__(self, name: str, given: np.ndarray | None, trips: int | None) -> None:
        self.name = name
        self.given = given
        self.buffer = given
        self.trips = trips
        self.item_shape: tuple[int, ...] | None = None

    def slot(self, i: int, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """Where iteration ``i`` writes its ``shape`` tensor (grows the buffer if needed)."""
        shape = tuple(shape)
        if self.item_shape is None:
            self.item_shape = shape
        elif shape != self.item_shape:
            raise ValueError(f"scan output {self.name!r} changes shape across iterations: "
                             f"{self.item_shape} then {shape}")
        if self.buffer is None:
            item = max(math.prod(shape) * np.dtype(dtype).itemsize, 1)
            rows = self.trips if self.trips is not None and self.trips * item <= STACK_RESERVE_BYTES else 16
            self.buffer = np.empty((max(rows, i + 1),) + shape, dtype)
        elif self.buffer.shape[1:] != shape or self.buffer.dtype != dtype:
            raise ValueError(f"scan output {self.name!r}: iteration shape {shape} does not fit "
                             f"{self.buffer.shape} {self.buffer.dtype}")
        if i >= self.buffer.shape[0]:
            if self.buffer is self.given:
                raise ValueError(f"scan output {self.name!r} has more iterations than its planned "
                                 f"{self.buffer.shape[0]}")
            grown = np.empty((2 * self.buffer.shape[0],) + shape, dtype)
            grown[:i] = self.buffer[:i]
            self.buffer = grown
        return self.buffer[i, ...]  # a view, also 0-d for scalar scan outputs

    def put(self, i: int, value: np.ndarray) -> None:
        target = self.slot(i, value.shape, value.dtype)
        if target.ctypes.data != value.ctypes.data:
            target[...] = value

    def result(self, count: int, empty_shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        if self.buffer is None:  # no iteration ran: onnxruntime's shape for that case
            if self.given is not None:
                return self.given
            return np.empty(empty_shape, dtype)
        if count == self.buffer.shape[0]:
            return self.buffer
        if self.buffer is self.given:
            raise ValueError(f"scan output {self.name!r} ran {count} iterations, planned {self.buffer.shape[0]}")
        return self.buffer[:count].copy()  # trimmed: the oversized buffer goes back


class LoopRunner:
    """Runs one ``Loop`` node: its body's plan per iteration input shapes, carried values ping-ponging."""

    def __init__(self, node: NodeProto, parent: GraphIndex, skeleton: ModelProto,
                 weights: Mapping[str, np.ndarray], ranks: Mapping[str, int], options: Any, arena: Arena,
                 make_executor: NestedExecutorFactory) -> None:
        self.node = node
        body = next((a.g for a in node.attribute if a.name == "body"), None)
        if body is None:
            raise ValueError(f"Loop node {node.name!r} has no body")
        self.carried = len(node.input) - 2
        self.scans = len(body.output) - 1 - self.carried
        if self.scans < 0:
            raise ValueError(f"Loop {node.name!r}: body has too few outputs")
        model = body_model(node, body, parent, skeleton, weights, ranks)
        body_options = replace(options, plan_cache_size=max(options.plan_cache_size, BODY_PLAN_CACHE))
        self.executor = make_executor(model, body_options, arena=arena)
        self.inputs = [v.name for v in body.input]
        self.outputs = [v.name for v in body.output]
        self.scalar_shapes = (_scalar_shape(body.input[0]), _scalar_shape(body.input[1]))
        self.outer = [n for n in self.executor.graph.inputs if n not in self.inputs]
        self.fed = set(self.executor.graph.inputs)  # body inputs the simplified body still reads
        self._layouts: dict = {}
        # Node inputs that are the parent's initializers (trip count, a constant initial value):
        # the parent passes only activations, and its in-memory weights are freed after building.
        self.constants: dict[str, np.ndarray] = {}
        for name in node.input:
            if name and parent.is_weight(name):
                try:
                    self.constants[name] = np.array(parent.initializer_array(name), copy=True)
                except Exception as exc:  # a file-backed placeholder: onnxruntime's Loop reads it
                    raise ValueError(f"Loop input {name!r} is a weight stored outside the model") from exc
        dtypes = self.executor.graph.dtypes
        self.scan_dtypes = [dtypes.get(n, np.dtype(np.float32)) for n in self.outputs[1 + self.carried:]]
        self.empty_scan_shapes = []  # onnxruntime's shape for a scan output when no iteration runs
        for value in body.output[1 + self.carried:]:
            dims = _declared_dims(value)
            self.empty_scan_shapes.append((0,) + tuple(d if isinstance(d, int) else 0 for d in dims or ()))
        self.small_bytes = options.small_bytes
        self.small_loop = self._small_loop_session(node, parent, skeleton, weights, options)
        self.buffers = [_CarryBuffer(), _CarryBuffer()]  # loop-carried values: iteration i writes buffers[i % 2]
        self.spares: list[np.ndarray] = []  # buffers handed out with results and given back since
        self.stats = LoopStats()

    @staticmethod
    def _small_loop_session(node: NodeProto, parent: GraphIndex, skeleton: ModelProto,
                            weights: Mapping[str, np.ndarray], options):
        """onnxruntime's Loop for this node alone, for loops over small tensors (None: its weights
        would cost more than a copy is worth, or it cannot be built)."""
        names = node_inputs(node)
        used = [n for n in names if parent.is_weight(n) and n in weights]
        outputs = [o for o in node.output if o]
        if not outputs or sum(weights[n].nbytes for n in used) > SMALL_LOOP_WEIGHT_BYTES:
            return None
        segment = Segment(-1, [parent.producer[outputs[0]]], [n for n in names if not parent.is_weight(n)],
                          outputs, kind="control")
        so = ort.SessionOptions()
        so.log_severity_level = 3
        so.intra_op_num_threads = options.light_segment_threads or options.threads or default_threads()
        so.inter_op_num_threads = 1
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        if options.shared_weights is not None:  # bound by reference: no prepacked copy
            so.add_session_config_entry("session.disable_prepacking", "1")
        try:
            return SegmentRunner(segment, parent, skeleton, {n: ort.OrtValue.ortvalue_from_numpy(weights[n])
                                                             for n in used}, so,
                                 shared=options.shared_weights).session
        except ValueError as exc:
            log.info("Loop %s: no onnxruntime session for small loops: %s", node.name, exc)
            return None

    def _run_small(self, values: Mapping[str, np.ndarray], out: Mapping[str, np.ndarray | None]) -> dict:
        names = [i.name for i in self.small_loop.get_inputs()]
        outputs = [o.name for o in self.small_loop.get_outputs()]
        produced = dict(zip(outputs, self.small_loop.run(outputs, {n: values[n] for n in names})))
        results = {}
        for name in out:
            target, value = out[name], produced[name]
            if target is not None:
                if target.shape != value.shape:
                    raise ValueError(f"Loop output {name!r} has shape {value.shape}, planned {target.shape}")
                np.copyto(target, value)
                value = target
            results[name] = value
        self.stats.onnxruntime_runs += 1
        return results

    # ------------------------------------------------------------------ run
    def _input(self, name: str, values: Mapping[str, np.ndarray]) -> np.ndarray | None:
        if not name:
            return None
        if name in self.constants:
            return self.constants[name]
        return np.asarray(values[name])

    def _layout(self, plan) -> tuple[list, int, list]:
        """Per body signature (cached): where each carried output goes in the ping-pong buffer
        (name, Loop output, offset, dtype, shape, bytes), the buffer's height, and the scan
        outputs whose shape the plan knows (stack index, name, shape, dtype)."""
        layout = self._layouts.get(plan.signature)
        if layout is not None:
            return layout
        carried, height = [], 0
        for name, result in zip(self.outputs[1:1 + self.carried], self.node.output[:self.carried]):
            slot = plan.slots.get(name)
            if slot is None or slot.shape is None or slot.offset is not None:
                continue  # pass-through, nac or (never for outputs) arena: the body allocates
            nbytes = math.prod(slot.shape) * slot.dtype.itemsize
            carried.append((name, result, height, slot.dtype, slot.shape, nbytes))
            height += align(max(nbytes, 1))
        scans = []
        for k, name in enumerate(self.outputs[1 + self.carried:]):
            slot = plan.slots.get(name)
            if slot is not None and slot.shape is not None and slot.offset is None:
                scans.append((k, name, slot.shape, slot.dtype))
        if len(self._layouts) >= BODY_PLAN_CACHE:
            self._layouts.clear()
        layout = self._layouts[plan.signature] = (carried, height, scans)
        return layout

    def _targets(self, plan, i: int, final: bool, out: Mapping[str, np.ndarray | None], stacks: list) -> dict:
        """Arrays the body writes into this iteration: carried outputs in this iteration's ping-pong
        buffer (the parent's slots on a known last iteration), scan outputs in their stacks."""
        carried, height, scans = self._layout(plan)
        buffer = self.buffers[i % 2]
        buffer.ensure(height)
        raw, base = buffer.raw, buffer.base
        targets = {}
        for name, result, offset, dtype, shape, nbytes in carried:
            target = out.get(result) if final else None
            if target is None or target.shape != shape or target.dtype != dtype:
                target = raw[base + offset:base + offset + nbytes].view(dtype).reshape(shape)
            targets[name] = target
        for k, name, shape, dtype in scans:
            if name not in targets:
                targets[name] = stacks[k].slot(i, shape, dtype)
        return targets

    def run(self, values: Mapping[str, np.ndarray], out: Mapping[str, np.ndarray | None]) -> dict[str, np.ndarray]:
        """ONNX Loop: ``for i < M while cond`` over the body; returns the node outputs in ``out``."""
        node = self.node
        if self.small_loop is not None and all(np.asarray(values[n]).nbytes <= self.small_bytes for n in values):
            return self._run_small(values, out)
        trip = self._input(node.input[0], values)
        cond = self._input(node.input[1], values) if len(node.input) > 1 else None
        trips = None if trip is None else max(int(trip.reshape(-1)[0]), 0)
        keep = True if cond is None else bool(cond.reshape(-1)[0])
        initial: list[np.ndarray] = []
        for name in node.input[2:]:
            value = self._input(name, values)
            if value is None:
                raise ValueError(f"Loop {node.name!r}: a loop-carried input is empty")
            initial.append(value)
        carried = list(initial)
        for k, buffer in enumerate(self.buffers):  # a buffer whose results were dropped since the last run
            if self.spares and buffer.raw.size < self.spares[-1].size:
                self.buffers[k] = _CarryBuffer(self.spares.pop())
        scan_names = self.outputs[1 + self.carried:]
        stacks = [_Stack(name, out.get(result), trips) for name, result in zip(scan_names, node.output[self.carried:])]
        executor = self.executor
        # the body reads these during its run only (its outputs never alias feeds): reused per iteration
        number, flag = np.zeros(self.scalar_shapes[0], np.int64), np.ones(self.scalar_shapes[1], np.bool_)
        feeds = {name: values[name] for name in self.outer}
        feeds.update({self.inputs[0]: number, self.inputs[1]: flag})
        unused = [name for name in self.inputs if name not in self.fed]
        i = 0
        while keep and (trips is None or i < trips):
            number[...] = i
            flag[...] = keep
            feeds.update(zip(self.inputs[2:], carried))
            for name in unused:
                feeds.pop(name, None)
            plan = executor.plan_for({k: v.shape for k, v in feeds.items()})
            targets = self._targets(plan, i, trips is not None and i == trips - 1, out, stacks)
            produced = executor.run(feeds, out=targets)
            keep = bool(np.asarray(produced[self.outputs[0]]).reshape(-1)[0])
            carried = [produced[name] for name in self.outputs[1:1 + self.carried]]
            for stack, name in zip(stacks, scan_names):
                stack.put(i, produced[name])
            i += 1
        self.stats.runs += 1
        self.stats.iterations += i
        results: dict[str, np.ndarray] = {}
        for name, value, first in zip(node.output[:self.carried], carried, initial):
            if name not in out:
                continue
            target = out.get(name)
            if target is not None:
                if target.shape != value.shape:
                    raise ValueError(f"Loop output {name!r} has shape {value.shape}, planned {target.shape}")
                if target.ctypes.data != value.ctypes.data:
                    np.copyto(target, value)
                results[name] = target
            elif value is first:
                results[name] = np.array(value, copy=True)  # the parent's (or our) array, not a result
            else:
                results[name] = value
        # A buffer holding results goes with them: its values are handed out as they are (no copy
        # of a grown tensor) and come back as a spare when the caller drops them (_Lease). The
        # other, dead now, is kept so the next run reuses its pages.
        for k, buffer in enumerate(self.buffers):
            held = [name for name, value in results.items() if buffer.holds(value)]
            if held:
                lease = _Lease(buffer.raw, self.spares)
                results.update({name: lease.adopt(results[name]) for name in held})
                self.buffers[k] = _CarryBuffer()  # its results still live: a spare comes next run
        for stack, name, dtype, empty in zip(stacks, node.output[self.carried:], self.scan_dtypes,
                                             self.empty_scan_shapes):
            if name in out:
                results[name] = stack.result(i, empty, dtype)
        return results

    def close(self) -> None:
        self.executor.close()
        self.buffers = [_CarryBuffer(), _CarryBuffer()]
        self.spares.clear()
