"""A plan per shape signature and its IOBindings: where every boundary tensor lives in the arena.

Why bind ahead: binding a tensor to a pointer into the arena is per segment and per signature,
not per run; a plan's bindings are made once and redone only when the arena moves or a
shape-specialised version of the segments lands.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dynnet_ros.engine.plan.arena import Arena, align

Signature = tuple[tuple[str, tuple[int, ...]], ...]


@dataclass
class TensorSlot:
    """Where one boundary tensor lives for a given signature."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...] | None      # None: nac, onnxruntime allocates it
    offset: int | None = None          # byte offset in the arena (None: not in the arena)
    lifetime: tuple[int, int] = (0, 0)  # [first segment, last segment + 1)
    alias_of: str | None = None        # written in place over this (dying) input's bytes

    def placed_shape(self) -> tuple[int, ...]:
        """The shape of a tensor the plan gave a size (a placed one always has one)."""
        if self.shape is None:
            raise RuntimeError(f"tensor {self.name!r} has no planned shape")
        return self.shape

    def view(self, arena: Arena) -> np.ndarray:
        """The tensor's bytes in ``arena``, as an array (only for a tensor placed there)."""
        if self.offset is None:
            raise RuntimeError(f"tensor {self.name!r} is not placed in the arena")
        return arena.view(self.offset, self.dtype, self.placed_shape())


@dataclass
class BoundPlan:
    """Everything that depends only on the input shape signature."""

    signature: Signature
    slots: dict[str, TensorSlot]
    height: int
    lower_bound: int
    seconds: float
    arena_generation: int = -1
    bindings: list = field(default_factory=list)
    runners: list = field(default_factory=list)    # the runner each binding belongs to
    loose: list = field(default_factory=list)      # per segment: (inputs, outputs) not in the arena, bound per run
    bound_version: object = None                   # the Version the bindings were made for
    uses: int = 0


def bind_plan(plan: BoundPlan, runners: Sequence[Any], arena: Arena, version: Any = None) -> None:
    """Pre-bind every arena tensor of ``plan`` to ``runners`` (a Version's runners replace the
    generic ones it specialises)."""
    plan.bindings = []
    plan.runners = []
    plan.loose = []
    for k, generic in enumerate(runners):
        runner = version.runners.get(k, generic) if version is not None else generic
        plan.runners.append(runner)
        seg = runner.segment
        plan.loose.append(([n for n in seg.inputs if plan.slots.get(n) is None or plan.slots[n].offset is None],
                           [n for n in seg.outputs if plan.slots[n].offset is None]))
        if runner.session is None:  # an If planned by its branches: nothing to bind
            plan.bindings.append(None)
            continue
        io = runner.session.io_binding()
        for name in seg.inputs:
            slot = plan.slots.get(name)
            if slot is not None and slot.offset is not None:
                io.bind_input(name, "cpu", 0, slot.dtype, slot.shape, arena.address(slot.offset))
        for name in seg.outputs:
            slot = plan.slots[name]
            if slot.offset is not None:
                io.bind_output(name, "cpu", 0, slot.dtype, slot.shape, arena.address(slot.offset))
            else:
                io.bind_output(name, "cpu")
        plan.bindings.append(io)
    plan.arena_generation = arena.generation
    plan.bound_version = version


def plan_buffers(plan: BoundPlan) -> list[tuple[int, int, int]]:
    """The (start, end, nbytes) buffers the plan placed (for reports and planner comparisons)."""
    ends = {n: s.lifetime[1] for n, s in plan.slots.items() if s.offset is not None and s.alias_of is None}
    for slot in plan.slots.values():
        if slot.alias_of is not None:
            ends[slot.alias_of] = max(ends[slot.alias_of], slot.lifetime[1])
    return [(slot.lifetime[0], ends[slot.name], max(align(int(np.prod(slot.placed_shape(), dtype=np.int64))
                                                          * slot.dtype.itemsize), 1))
            for slot in plan.slots.values() if slot.offset is not None and slot.alias_of is None]
