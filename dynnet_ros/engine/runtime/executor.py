"""The planned executor: segments as onnxruntime sessions, boundary tensors in one planned arena.

Per model (once): run a ``Plan`` (``engine/plan/compile.py``: simplify → order → segments → cut
choice) as one session per segment, all sharing the same weight buffers. Per shape signature
(once, then cached): evaluate every boundary tensor's shape (RDP), give each an offset in the
arena (``plan_offsets`` over segment-step lifetimes), and pre-bind it through ``IOBinding`` to a
pointer into the arena. Per run: bind the user's feeds and fresh output arrays, run the segments
in our order. Nothing is copied between
segments; tensors whose shape only execution reveals (nac) are left to onnxruntime and passed
on as ``OrtValue``s.

Runs at once (``allow_concurrent_runs``): each run in flight has a lane of its own, an arena and
its own bindings of the shared plans, over the same sessions (onnxruntime runs a session from
several threads at once). A caller serving several batches thus keeps two cores busy with two
single-threaded runs where one run's threads would wait on each other. Runs through a segment
hook (streamed weights) or through If/Loop runners, which share one arena between branches,
take turns in the first lane.
"""
from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field, replace
from queue import PriorityQueue

import numpy as np
import onnxruntime as ort

from dynnet_ros.bytesize import MB
from dynnet_ros.engine.modelio.onnx_proto import ModelProto, NodeProto
from dynnet_ros.engine.plan.arena import Arena, align
from dynnet_ros.engine.plan.banded import BandedRunner
from dynnet_ros.engine.plan.cache import LruCache
from dynnet_ros.engine.plan.compile import SESSION_BYTES, compile_plan, names_read
from dynnet_ros.engine.plan.compile import Plan as CompiledPlan
from dynnet_ros.engine.plan.cost_model import (
    CutChoice,
)
from dynnet_ros.engine.plan.graph import node_inputs
from dynnet_ros.engine.plan.memory_plan import lower_bound, plan_offsets
from dynnet_ros.engine.plan.options import PlannerOptions
from dynnet_ros.engine.plan.segmentation import Segment
from dynnet_ros.engine.plan.shapes import ShapeSource
from dynnet_ros.engine.plan.versions import Version, VersionManager
from dynnet_ros.engine.rdp.ops.ort_contrib import nchwc_block_size
from dynnet_ros.engine.runtime.base import ExecutorStats
from dynnet_ros.engine.runtime.binding import BoundPlan, Signature, TensorSlot, bind_plan, plan_buffers
from dynnet_ros.engine.runtime.control_flow import IfRunner
from dynnet_ros.engine.runtime.hooks import BranchRunner, SegmentHook
from dynnet_ros.engine.runtime.loop import LoopRunner
from dynnet_ros.engine.runtime.run_loop import collect_outputs, run_segments
from dynnet_ros.engine.runtime.segments import (
    HEAVY_OPS,
    NoSession,
    SegmentRunner,
    build_nodes_model,
    has_fused_sum,
    segment_session_options,
)
from dynnet_ros.memtrim import pin_mmap_threshold, release_memory

log = logging.getLogger(__name__)

# Element-wise ops whose onnxruntime CPU kernels declare MayInplace (output over input 0) and
# compute each output element from the same-index input element (binary ops: also input 1).
_IN_PLACE_OPS = {"Relu", "LeakyRelu", "Sigmoid", "Tanh", "HardSigmoid", "Clip", "Abs", "Neg", "Exp", "Sqrt",
                 "Add", "Sub", "Mul", "Div"}


class NothingToSave(ValueError):
    """The cost model found no cut set that saves memory over one plain onnxruntime session.

    Raised before any session is built; the planned backend then runs one plain session and
    reports ``choice.reason`` (backends/cpu_planned.py). ``reference_inputs``: the input shapes
    the choice was weighed at."""

    def __init__(self, choice: CutChoice, reference_inputs: Mapping[str, tuple[int, ...]]) -> None:
        super().__init__(choice.reason)
        self.choice = choice
        self.reference_inputs = dict(reference_inputs)


@dataclass
class _Lane:
    """Where one run in flight keeps its tensors: an arena, and (lanes after the first) its own
    bindings of the shared plans, by signature; the first lane uses the plans' own bindings."""

    arena: Arena
    lock: threading.Lock
    bound: dict[Signature, BoundPlan] = field(default_factory=dict)


class PlannedExecutor:
    """Executor (see runtime.base) running a model as planned segments over one arena per run in flight."""

    name = "cpu-planned"

    def __init__(self, plan: CompiledPlan, *, arena: Arena | None = None) -> None:
        """Run ``plan`` (``compile_plan``): one session per segment over one arena. ``arena``: share
        one arena between executors that never run at the same time (the branches of If nodes);
        by default the executor owns its arena. NothingToSave where the plan says one plain session."""
        if plan.one_session:
            assert plan.cut_choice is not None  # one_session says the cost model ran
            raise NothingToSave(plan.cut_choice, plan.reference_inputs)
        self.compiled = plan
        self.options = opts = plan.options
        if opts.mmap_threshold:
            pin_mmap_threshold(opts.mmap_threshold)
        weights = plan.take_weights()
        self.original_nodes = plan.original_nodes
        self.simplify_report = plan.simplify_report
        self.shape_source: ShapeSource = plan.shape_source
        self.graph = plan.graph
        self.skeleton = plan.skeleton
        self.reference_sizes = plan.reference_sizes
        self._input_sizes = plan.input_sizes
        self.order = list(plan.order)
        self.segments = list(plan.segments)
        self.granularity = plan.granularity
        self._stem = plan.stem
        self.cut_choice: CutChoice | None = plan.cut_choice
        self._lock = threading.Lock()
        # In-memory weights (file-backed ones stay in the file) go to the sessions as OrtValues.
        self._weight_arrays = weights
        self.weights = {n: ort.OrtValue.ortvalue_from_numpy(a) for n, a in weights.items()}
        self.branch_runners = self._build_branch_runners(weights)
        if self._stem is not None:
            self.branch_runners[self._stem] = self._build_banded_runner(self.segments[self._stem])
        in_memory = set(weights)
        self.runners = self._build_runners(weights)
        # onnxruntime copied the in-memory weights into its sessions; ours are dropped here
        # (weights that are graph outputs themselves are kept to return them).
        self._released_weights = set(in_memory)  # in-memory weights now only inside the generic sessions
        self._weight_arrays = {n: a for n, a in weights.items() if n in self.graph.outputs}
        self.graph.weights = self._weight_arrays
        self.weights = {}
        weights.clear()  # simplify's folded arrays too: only onnxruntime's copies remain
        self._producer_segment = {o: s.index for s in self.segments for n in s.nodes
                                  for o in self.graph.nodes[n].output if o}
        self._last_use = self._last_uses()
        self._owns_arena = arena is None
        self.arena = arena if arena is not None else Arena()
        self._planning = threading.Lock()   # the plan cache, asked from every lane
        self._lanes: list[_Lane] = [_Lane(self.arena, self._lock)]
        # the lowest free lane first: the first lane's arena serves every run that overlaps none
        self._free_lanes: PriorityQueue[int] = PriorityQueue()
        self._free_lanes.put(0)
        self.plans: LruCache[BoundPlan] = LruCache(opts.plan_cache_size)
        self.last_plan: BoundPlan | None = None
        self._segment_weight_bytes = [self._weight_bytes_of(s) for s in self.segments]
        #: called around every segment (swap/residency.py: weights in before, out after)
        self.segment_hook: SegmentHook | None = None
        # specialised runners by (segment, input shapes): signatures that differ only where a segment
        # does not look (e.g. after a global pooling) share its session; a runner lives while a version holds it
        self._specialised: weakref.WeakValueDictionary[tuple, SegmentRunner] = weakref.WeakValueDictionary()
        self.versions = VersionManager(self._build_version, hot_after=opts.hot_after,
                                       budget_bytes=int(opts.version_budget_mb * MB), enabled=opts.versions)
        self._warm_up()
        # building (RDP, inference, 20-50 session creations) leaves freed but still-mapped heap
        release_memory()

    @classmethod
    def from_model(cls, model: ModelProto, options: PlannerOptions | None = None, *,
                   arena: Arena | None = None) -> PlannedExecutor:
        """Compile ``model`` under ``options`` and run the plan (NothingToSave: one plain session)."""
        options = options or PlannerOptions()
        if options.mmap_threshold:  # pinned before planning, whose allocations it shapes too
            pin_mmap_threshold(options.mmap_threshold)
        return cls(compile_plan(model, options), arena=arena)

    # ------------------------------------------------------------------ build
    def _build_branch_runners(self, weights: Mapping[str, np.ndarray]) -> dict[int, BranchRunner]:
        """If/Loop segments whose branches/body can be planned on their own (else onnxruntime's
        If/Loop runs them); runtime/control_flow.py, runtime/loop.py."""
        kinds: dict[str, type[IfRunner] | type[LoopRunner]] = {"If": IfRunner, "Loop": LoopRunner}
        runners: dict[int, BranchRunner] = {}
        if not self.options.plan_branches:
            return runners
        branch_arena = None
        # a branch or body is planned as it is: its If/Loop segment already chose to be planned
        nested = replace(self.options, versions=False, cost_model=False)
        for seg in self.segments:
            node = self.graph.nodes[seg.nodes[0]]
            if seg.kind != "control" or len(seg.nodes) != 1 or node.op_type not in kinds:
                continue
            ranks = {}
            for name in seg.inputs:
                dims = self.shape_source.dims(name)
                if dims is not None:
                    ranks[name] = len(dims)
            branch_arena = branch_arena or Arena()
            try:
                runners[seg.index] = kinds[node.op_type](node, self.graph, self.skeleton, weights, ranks, nested,
                                                         branch_arena, PlannedExecutor.from_model)
            except ValueError as exc:
                log.info("%s %s stays with onnxruntime's %s: %s", node.op_type, node.name, node.op_type, exc)
        self._branch_arena = branch_arena
        return runners

    def segment_weight_names(self) -> list[list[str]]:
        """Per segment, the shared (by-reference) weights it reads, subgraphs included."""
        shared = self.options.shared_weights or {}
        result = []
        for seg in self.segments:
            names: list[str] = []
            for n in seg.nodes:
                for name in names_read(self.graph.nodes[n]):
                    if name in shared and name not in names:
                        names.append(name)
            result.append(names)
        return result

    def _build_banded_runner(self, segment: Segment):
        first, seconds = self.graph.nodes[segment.nodes[0]], [self.graph.nodes[n] for n in segment.nodes[1:]]
        options = lambda: self._session_options(segment)  # noqa: E731 - one fresh SessionOptions per session

        def make_session(node: NodeProto) -> ort.InferenceSession:
            inputs = [node.input[0]]
            single = Segment(segment.index, [], inputs=inputs, outputs=[node.output[0]])
            model = build_nodes_model([node], single, self.graph, self.skeleton)
            return SegmentRunner(single, self.graph, self.skeleton, self.weights, options(), model=model,
                                 shared=self.options.shared_weights).session

        mid_channels = int(self.graph.initializers[first.input[1]].dims[0])
        return BandedRunner(first, seconds, make_session, nchwc_block_size() or 1, mid_channels,
                            bands=self.compiled.stem_band_count(segment.nodes[0]),
                            workspace=f"__stem_workspace_{segment.index}")

    def _build_runners(self, weights: dict[str, np.ndarray]) -> list:
        """One session per segment; each in-memory weight is dropped as soon as the last session
        using it exists (onnxruntime copied it), so building never holds two copies of all
        weights at once (depth, whose BatchNorm-folded weights are all in memory: -45 MB peak)."""
        last_user: dict[str, int] = {}
        for seg in self.segments:
            for n in seg.nodes:
                for name in node_inputs(self.graph.nodes[n]):
                    if name in weights:
                        last_user[name] = seg.index
        keep = set(self.graph.outputs)
        opts = self.options
        runners: list = []
        for seg in self.segments:
            if seg.index in self.branch_runners:
                runners.append(NoSession(seg))
                continue
            runners.append(SegmentRunner(seg, self.graph, self.skeleton, self.weights, self._session_options(seg),
                                         shared=opts.shared_weights))
            for name in [w for w, last in last_user.items() if last == seg.index and w not in keep]:
                self.weights.pop(name, None)
                weights.pop(name, None)
                del last_user[name]
        return runners

    def _session_options(self, segment: Segment | None = None) -> ort.SessionOptions:
        opts = self.options
        light = segment is not None and not any(self.graph.nodes[n].op_type in HEAVY_OPS for n in segment.nodes)
        nchwc = bool(segment is not None and opts.nchwc_max_bytes
                     and self._segment_peak_tensor(segment) <= opts.nchwc_max_bytes)
        fused_sum = segment is not None and has_fused_sum([self.graph.nodes[n] for n in segment.nodes])
        return segment_session_options(opts, light=light, nchwc=nchwc, fused_sum=fused_sum)

    def _segment_peak_tensor(self, segment: Segment) -> int:
        """Largest tensor the segment reads or writes at the reference shape (unknown = huge)."""
        names = segment.inputs + [o for n in segment.nodes for o in self.graph.nodes[n].output if o]
        sizes = [self.reference_sizes.get(n, self._input_sizes.get(n)) for n in names]
        return max((1 << 62 if s is None else s) for s in sizes) if sizes else 0

    def _last_uses(self) -> dict[str, int]:
        last: dict[str, int] = {}
        for seg in self.segments:
            for name in seg.inputs:
                last[name] = max(last.get(name, -1), seg.index)
        return last

    def _warm_up(self) -> None:
        """Plan the reference signature once so lazy imports and first-call costs are paid at load,
        not by the first inference (keeps first-run latency near steady state)."""
        try:
            self.plan_for(self.compiled.reference_inputs)
        except ValueError:
            plan_offsets([(0, 1, 64), (0, 2, 64)])

    # ------------------------------------------------------------------ runs at once
    def allow_concurrent_runs(self, runs: int) -> None:
        """Let up to ``runs`` runs go at once, each in a lane (arena) of its own, where the plan
        allows it (no If/Loop runners: their branches share one arena; no segment hook). Lanes
        beyond the first hold an arena only once two runs overlap."""
        if runs < 1:
            raise ValueError(f"concurrent runs must be >= 1, got {runs}")
        if not self._owns_arena or any(not isinstance(r, BandedRunner) for r in self.branch_runners.values()):
            runs = 1
        while len(self._lanes) < runs:
            self._lanes.append(_Lane(Arena(), threading.Lock()))
            self._free_lanes.put(len(self._lanes) - 1)

    @property
    def lanes(self) -> int:
        """How many runs may go at once (1: they take turns)."""
        return len(self._lanes)

    def runs_concurrently(self) -> bool:
        """Whether ``run`` lets runs overlap now (several lanes and no segment hook)."""
        return len(self._lanes) > 1 and self.segment_hook is None

    def release_lanes(self) -> None:
        """Free the arenas of every lane but the first (a budget counts one run's activations)."""
        for lane in self._lanes[1:]:
            with lane.lock:
                lane.arena.release()
                lane.bound.clear()

    # ------------------------------------------------------------------ plan
    def plan_for(self, feeds_shapes: Mapping[str, tuple[int, ...]]) -> BoundPlan:
        """The cached plan for this signature, or a new one (ValueError if a constraint breaks)."""
        with self._planning:
            return self._plan_for(feeds_shapes)

    def _plan_for(self, feeds_shapes: Mapping[str, tuple[int, ...]]) -> BoundPlan:
        signature: Signature = tuple(sorted((k, tuple(v)) for k, v in feeds_shapes.items()))
        plan = self.plans.get(signature)
        if plan is not None:
            return plan
        start = time.perf_counter()
        boundary = [o for s in self.segments for o in s.outputs]
        shapes = self.shape_source.shapes(dict(feeds_shapes), boundary)
        slots: dict[str, TensorSlot] = {}
        for name in boundary:
            dtype = self.graph.dtypes.get(name, np.dtype(np.float32))
            slot = TensorSlot(name, dtype, shapes.get(name))
            first = self._producer_segment[name]
            slot.lifetime = (first, max(self._last_use.get(name, first), first) + 1)
            slots[name] = slot
        for index, runner in self._banded_runners():
            out_shapes: list[tuple[int, ...]] = []
            for name in runner.outputs:
                out = slots.get(name)
                if out is None or out.shape is None:
                    raise ValueError(f"the banded stem's outputs {runner.outputs} have no known shape")
                out_shapes.append(out.shape)
            size = runner.workspace_bytes(tuple(feeds_shapes[runner.image]), out_shapes)
            slot = TensorSlot(runner.workspace, np.dtype(np.uint8), (size,))
            slot.lifetime = (index, index + 1)
            slots[runner.workspace] = slot
            boundary = boundary + [runner.workspace]
        in_arena = {n for n, s in slots.items() if s.shape is not None and n not in self.graph.outputs}
        roots = self._alias_in_place(slots, in_arena) if self.options.in_place else {}
        # one buffer per root: an in-place chain x -> relu(x) -> add(.., y) shares x's bytes,
        # and that buffer lives from x's producer to the chain's last reader
        ends = {n: slots[n].lifetime[1] for n in in_arena if n not in roots}
        for name, root in roots.items():
            ends[root] = max(ends[root], slots[name].lifetime[1])
        planned = [slots[n] for n in boundary if n in in_arena and n not in roots]
        buffers = [(s.lifetime[0], ends[s.name],
                    max(align(int(np.prod(s.placed_shape(), dtype=np.int64)) * s.dtype.itemsize), 1)) for s in planned]
        offsets, height = plan_offsets(buffers) if buffers else ([], 0)
        for slot, offset in zip(planned, offsets):
            slot.offset = int(offset)
        for name, root in roots.items():
            slots[name].offset, slots[name].alias_of = slots[root].offset, root
        plan = BoundPlan(signature, slots, int(height), int(lower_bound(buffers)) if buffers else 0,
                    time.perf_counter() - start)
        self.plans.put(signature, plan)
        return plan

    def _banded_runners(self) -> list[tuple[int, BandedRunner]]:
        return [(i, r) for i, r in self.branch_runners.items() if isinstance(r, BandedRunner)]

    def _alias_in_place(self, slots: Mapping[str, TensorSlot], in_arena: set[str]) -> dict[str, str]:
        """Outputs written over an input's bytes: {output: root tensor whose buffer it shares}.

        Only one-node segments of element-wise ops whose onnxruntime CPU kernels allow in-place
        work (each output element depends only on the same input element), over an arena input of
        the same shape and dtype whose last reader is this segment — so nothing reads the
        input's old values afterwards. onnxruntime's own planner reuses buffers the same way.
        """
        roots: dict[str, str] = {}
        for seg in self.segments:
            if len(seg.nodes) != 1 or len(seg.outputs) != 1 or seg.kind != "ops":
                continue
            node = self.graph.nodes[seg.nodes[0]]
            out = seg.outputs[0]
            if node.op_type not in _IN_PLACE_OPS or out not in in_arena:
                continue
            target = slots[out]
            for name in node.input[:2]:
                src = slots.get(name)
                if (src is None or name not in in_arena or src.shape != target.shape or src.dtype != target.dtype
                        or src.lifetime[1] != seg.index + 1):
                    continue
                root = roots.get(name, name)
                roots[out] = root
                break
        return roots

    def _weight_bytes_of(self, segment: Segment) -> int:
        return sum(self.compiled.node_weight_bytes(n) for n in segment.nodes)

    def _build_version(self, signature: Hashable) -> Version | None:
        """Background thread: specialised runners for the segments whose input shapes this plan knows."""
        start = time.perf_counter()
        plan = self.plans.peek(signature)  # no LRU touch from the worker
        if plan is None:
            return None
        feeds = dict(plan.signature)  # the key the plan is cached under
        budget = self.versions.budget_bytes
        # cheapest first: segments without weights cost only their session
        order = sorted(range(len(self.segments)), key=lambda i: self._segment_weight_bytes[i])
        runners: dict[int, object] = {}
        cost = 0
        for i in order:
            seg = self.segments[i]
            if seg.kind != "ops" or any(name in self._released_weights for n in seg.nodes
                                        for name in node_inputs(self.graph.nodes[n])):
                continue  # control flow stays generic; released in-memory weights cannot be re-read
            shapes = {}
            for name in seg.inputs:
                slot = plan.slots.get(name)
                shape = feeds.get(name) if name in feeds else (slot.shape if slot is not None else None)
                if shape is None:
                    break
                shapes[name] = tuple(shape)
            else:
                key = (i, tuple(sorted(shapes.items())))
                shared = self._specialised.get(key)
                if shared is not None:  # another signature's version has this segment at these shapes
                    runners[i] = shared
                    continue
                extra = self._segment_weight_bytes[i] + SESSION_BYTES
                if cost + extra > budget:
                    continue
                options = self._session_options(seg)
                options.enable_mem_pattern = True  # static shapes: onnxruntime can pre-plan the segment
                runners[i] = self._specialised[key] = SegmentRunner(seg, self.graph, self.skeleton, self.weights,
                                                                    options, shapes,
                                                                    shared=self.options.shared_weights)
                cost += extra
        if not runners:
            return None
        return Version(signature, runners, cost, time.perf_counter() - start)

    # ------------------------------------------------------------------ run
    def run(self, feeds: Mapping[str, np.ndarray],
            out: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """Run on ``feeds``; ``out`` optionally gives arrays to write graph outputs into."""
        if self.runs_concurrently():
            return self.run_unhooked(feeds, out)
        with self._lock:
            return self._run(feeds, out or {}, self._lanes[0], self.segment_hook)

    def run_unhooked(self, feeds: Mapping[str, np.ndarray],
                     out: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """``run`` without the segment hook, in the first free lane (waits while every lane is
        busy): for a hook with nothing to do (every weight resident), so runs can overlap."""
        index = self._free_lanes.get()
        try:
            lane = self._lanes[index]
            with lane.lock:
                return self._run(feeds, out or {}, lane, None)
        finally:
            self._free_lanes.put(index)

    def _lane_plan(self, plan: BoundPlan, lane: _Lane) -> BoundPlan:
        """``plan`` as ``lane`` binds it: the plan itself in the first lane, else the lane's copy
        (the same slots, bindings of its own), kept while the plan cache keeps the plan."""
        if lane is self._lanes[0]:
            return plan
        bound = lane.bound.get(plan.signature)
        if bound is None:
            if len(lane.bound) >= self.plans.max_entries:
                for signature in [s for s in lane.bound if self.plans.peek(s) is None]:
                    del lane.bound[signature]
            bound = lane.bound[plan.signature] = replace(plan, bindings=[], runners=[], loose=[],
                                                         arena_generation=-1, bound_version=None)
        return bound

    def _run(self, feeds: Mapping[str, np.ndarray], out: Mapping[str, np.ndarray], lane: _Lane,
             hook: SegmentHook | None) -> dict[str, np.ndarray]:
        # raw pointers are bound below; np.require keeps 0-d feeds 0-d (a Loop body's iteration number)
        feeds = {k: np.require(v, requirements="C") for k, v in feeds.items()}
        shared = self.plan_for({k: v.shape for k, v in feeds.items()})
        plan = self._lane_plan(shared, lane)
        arena = lane.arena
        arena.ensure(plan.height)
        version = self.versions.get(plan.signature)
        if plan.arena_generation != arena.generation or plan.bound_version is not version:
            bind_plan(plan, self.runners, arena, version)
        shared.uses += 1
        self.last_plan = shared
        results: dict[str, np.ndarray] = {}
        dynamic: dict[str, ort.OrtValue] = {}
        graph_outputs = set(self.graph.outputs)
        if hook is None:
            run_segments(plan, arena, self.branch_runners, feeds, out, results, dynamic, graph_outputs)
        else:
            hook.frame_start()
            try:
                run_segments(plan, arena, self.branch_runners, feeds, out, results, dynamic, graph_outputs, hook)
            except BaseException:  # any exit, interrupts included: the hook's frame ends; re-raised
                hook.abort()
                raise
            hook.frame_end()
        return collect_outputs(plan, arena, self.graph, feeds, results, dynamic)

    #: The (start, end, nbytes) buffers a plan placed (for reports and planner comparisons).
    plan_buffers = staticmethod(plan_buffers)

    def arena_tensor(self, name: str) -> np.ndarray | None:
        """View of a boundary tensor in the arena for the last plan (tests check zero-copy with it)."""
        plan = self.last_plan
        slot = None if plan is None else plan.slots.get(name)
        if slot is None or slot.offset is None:
            return None
        return slot.view(self.arena)

    def fit_arena(self, shapes: Mapping[str, tuple[int, ...]]) -> bool:
        """Give back the arena when it is larger than the plan for ``shapes`` needs (the next run
        allocates that plan's height): the arena is grow-only, and an engine under a memory budget
        would otherwise hold a larger input size's activations while it runs a smaller one. True
        when the arena was released."""
        needed = self.arena_bytes_at(shapes)
        if needed is None or align(max(needed, 1)) >= self.arena.capacity or not self._owns_arena:
            return False
        self.arena.release()
        self.release_lanes()
        return True

    def arena_bytes_at(self, shapes: Mapping[str, tuple[int, ...]]) -> int | None:
        """The arena height of the plan for ``shapes`` (None where these shapes cannot be planned)."""
        try:
            return int(self.plan_for(shapes).height)
        except (ValueError, KeyError):
            return None

    def executor_stats(self) -> ExecutorStats:
        """What Engine.engine_stats() reports for the planned backend."""
        plan = self.last_plan
        return ExecutorStats(arena_bytes=sum(lane.arena.capacity for lane in self._lanes), details={
            "plan": {
                "height_bytes": None if plan is None else plan.height,
                "lower_bound_bytes": None if plan is None else plan.lower_bound,
                "planning_ms": None if plan is None else round(plan.seconds * 1e3, 3),
                "cache": {"entries": len(self.plans), "hits": self.plans.hits, "misses": self.plans.misses,
                          "evictions": self.plans.evictions, "max_entries": self.plans.max_entries},
                "segments": len(self.segments),
                "granularity": self.granularity,
                "nodes": {"model": self.original_nodes, "executed": len(self.graph.nodes)},
                "shape_source": self.shape_source.name,
                "layout": self.options.layout,
                "cuts": None if self.cut_choice is None else self.cut_choice.describe(),
            },
            "kernel_versions": self.versions.stats(),
            "loops": [vars(r.stats) for r in self.branch_runners.values() if hasattr(r, "stats")],
        })

    def close(self) -> None:
        self.versions.close()
        self.release_lanes()   # waits for the runs in the other lanes
        with self._lock:
            self.plans.clear()
            self.last_plan = None  # its bindings hold sessions
            self.runners = []
            for runner in self.branch_runners.values():
                runner.close()
            if self._owns_arena:
                self.arena.release()


