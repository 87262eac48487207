"""One run of a bound plan: the segments in order, loose tensors bound per run, outputs collected.

Arena tensors were bound once (binding.py); what is bound here per run is only what the plan
could not place: the user's feeds, graph outputs (into the caller's arrays where given) and
tensors whose shape only execution reveals (nac), handed on as ``OrtValue``s.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import onnxruntime as ort

from dynnet_ros.engine.plan.arena import Arena
from dynnet_ros.engine.plan.graph import GraphIndex
from dynnet_ros.engine.runtime.binding import BoundPlan
from dynnet_ros.engine.runtime.hooks import BranchRunner, SegmentHook


def _value(name: str, plan: BoundPlan, arena: Arena, feeds: Mapping[str, np.ndarray],
           results: Mapping[str, np.ndarray], dynamic: Mapping[str, ort.OrtValue]) -> np.ndarray:
    slot = plan.slots.get(name)
    if slot is not None and slot.offset is not None:
        return slot.view(arena)
    if name in feeds:
        return feeds[name]
    if name in results:
        return results[name]
    if name in dynamic:
        return dynamic[name].numpy()
    raise RuntimeError(f"input {name!r} was not produced")


def run_segment(runner: Any, io: ort.IOBinding, plan: BoundPlan) -> None:
    """Run one bound segment; onnxruntime's error becomes a ValueError naming the segment and shapes."""
    try:
        runner.session.run_with_iobinding(io)
    except Exception as exc:  # onnxruntime raises its own types: one ValueError naming the segment
        raise ValueError(f"segment {runner.segment.index} failed at input shapes "
                         f"{dict(plan.signature)}: {str(exc).strip().splitlines()[0]}") from exc


def run_segments(plan: BoundPlan, arena: Arena, branch_runners: Mapping[int, BranchRunner],
                 feeds: Mapping[str, np.ndarray], out: Mapping[str, np.ndarray], results: dict[str, np.ndarray],
                 dynamic: dict[str, ort.OrtValue], graph_outputs: set[str], hook: SegmentHook | None = None) -> None:
    """Run every segment of ``plan``; ``results``/``dynamic`` collect tensors outside the arena.

    ``branch_runners``: segments run by their own runner (If, Loop, banded stem); ``hook``: called
    around every segment (weights in before, out after)."""
    previous = None
    for runner, io, (loose_inputs, loose_outputs) in zip(plan.runners, plan.bindings, plan.loose):
        seg = runner.segment
        if hook is not None:
            if previous is not None:
                hook.after(previous)
            hook.before(seg.index)
            previous = seg.index
        if io is not None and not loose_inputs and not loose_outputs:  # all in the arena, bound once
            run_segment(runner, io, plan)
            continue
        if io is None:  # If: only the taken branch runs, as its own plan
            values = {name: _value(name, plan, arena, feeds, results, dynamic) for name in seg.inputs}
            views: dict[str, np.ndarray | None] = {
                name: plan.slots[name].view(arena) if plan.slots[name].offset is not None else None
                for name in seg.outputs}
            for name in seg.outputs:
                if views[name] is None and name in out and plan.slots[name].shape == out[name].shape:
                    views[name] = out[name]
            special = branch_runners[seg.index]
            workspace = getattr(special, "workspace", None)
            if workspace is not None:  # a banded stem's band buffers
                views[workspace] = plan.slots[workspace].view(arena)
            produced = special.run(values, views)
            for name, array in produced.items():
                produced_slot = plan.slots.get(name)  # None: an output of the If/Loop nobody reads
                if produced_slot is not None and produced_slot.offset is None:
                    results[name] = array
            continue
        for name in loose_inputs:
            if name in feeds:
                value = feeds[name]
            elif name in results:
                value = results[name]
            elif name in dynamic:
                io.bind_ortvalue_input(name, dynamic[name])
                continue
            else:
                raise RuntimeError(f"segment {seg.index} input {name!r} was not produced")
            io.bind_input(name, "cpu", 0, value.dtype, value.shape, value.ctypes.data)
        fresh: list[str] = []
        for name in loose_outputs:
            slot = plan.slots[name]
            if slot.shape is not None and name in graph_outputs:
                given = out.get(name)
                array = given if given is not None and given.shape == slot.shape and \
                    given.dtype == slot.dtype and given.flags.c_contiguous else np.empty(slot.shape, slot.dtype)
                results[name] = array
                io.bind_output(name, "cpu", 0, slot.dtype, slot.shape, array.ctypes.data)
            else:
                io.bind_output(name, "cpu")  # reset: onnxruntime allocates at the real size
                fresh.append(name)
        run_segment(runner, io, plan)
        if fresh:
            outputs = io.get_outputs()
            for k, name in enumerate(seg.outputs):
                if name in fresh:
                    dynamic[name] = outputs[k]
    if hook is not None and previous is not None:
        hook.after(previous)


def collect_outputs(plan: BoundPlan, arena: Arena, graph: GraphIndex, feeds: Mapping[str, np.ndarray],
                    results: Mapping[str, np.ndarray], dynamic: Mapping[str, ort.OrtValue]) -> dict[str, np.ndarray]:
    """The graph's outputs after a run; arena tensors are copied out (the arena is reused)."""
    outputs: dict[str, np.ndarray] = {}
    for name in graph.outputs:
        if name in results:
            outputs[name] = results[name]
        elif name in dynamic:
            outputs[name] = dynamic[name].numpy()
        elif name in feeds:
            outputs[name] = np.array(feeds[name], copy=True)
        elif graph.is_weight(name):
            outputs[name] = graph.initializer_array(name)
        else:
            outputs[name] = plan.slots[name].view(arena).copy()
    return outputs
