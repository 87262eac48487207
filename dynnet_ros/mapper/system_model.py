"""The concurrent execution model of Map-and-Conquer: latency and energy of stages on several units.

Why a task graph: the paper's cumulative latency of sub-layer j of stage i,

    T_i^j = tau_i^j + max( T_i^(j-1),  max_{k<i, I_k^(j-1)=1} T_k^(j-1) + u_(k->i)^(j-1) ),

is the finish time of a task that starts once its own stage's previous sub-layer is done and the
reused features of earlier stages have arrived (``u``: the exchange cost of those features from
stage k's unit to stage i's). Stage i's latency is T_i at its exit. Written as a list schedule of
tasks (each with a unit, a duration, an energy, the bytes it produces and the tasks it reads), the
same recurrence also covers what the paper rules out but this package allows: two stages on one
unit (a depth-wise multi-exit model on two CPU groups) run one after the other there, earlier
stages first. With every stage on its own unit the schedule is exactly the recurrence.

Exits: a frame that leaves at stage i waited for the exits of stages 0..i (each declined before i
was taken), so its latency is max_{k<=i} T_{S_k}. Energy is each task's energy (power × time of
its unit and DVFS level) plus the units' idle power over the frame. Two accountings of the stages
after the exit: ``oracle`` (the paper: the number of stages a frame needs is known, later stages
never run) and ``speculative`` (the stage runtime: every stage starts at once, a later stage's
work done before the exit is spent, the rest is dropped). Expected latency and energy weight the
exits by their rates on a calibration set.

What a real runtime adds to tasks timed alone (``RuntimeCosts``): a dispatch cost per task, a
contention factor while two units that share memory bandwidth run at once, a slowdown of the
tasks' own times and a handoff cost when a task reads another unit's output; with them the
schedule becomes an event simulation (``_shared_schedule``) that equals the list schedule when
they are (0, 1, 1, 0). Energies stay the tasks' own.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from dynnet_ros.mapper.hardware import Hardware

ACCOUNTING: tuple[str, ...] = ("speculative", "oracle")


@dataclass(frozen=True)
class Task:
    """One sub-layer (or layer group, or exit head) of one stage, on one unit."""

    stage: int
    name: str
    unit: str
    latency_ms: float
    energy_mj: float
    out_bytes: int = 0                 # features it hands to the tasks that read it
    needs: tuple[int, ...] = ()        # indices of earlier tasks whose output it reads
    handoff_ms: float | None = None    # measured cost of handing its output to another unit


@dataclass(frozen=True)
class TaskGraph:
    """Tasks in priority order (stage-major, each after the tasks it needs) and each stage's exit."""

    tasks: tuple[Task, ...]
    exits: tuple[int, ...]    # per stage: the task whose finish is that stage's exit

    def __post_init__(self) -> None:
        for index, task in enumerate(self.tasks):
            if any(not 0 <= need < index for need in task.needs):
                raise ValueError(f"task {index} ({task.name}) needs a task that is not before it")
            if task.latency_ms < 0 or task.energy_mj < 0:
                raise ValueError(f"task {index} ({task.name}): negative latency or energy")
        if any(not 0 <= e < len(self.tasks) for e in self.exits):
            raise ValueError("an exit names no task")

    @property
    def units(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(t.unit for t in self.tasks))


@dataclass(frozen=True)
class Schedule:
    start: np.ndarray          # per task, ms from the frame's start
    finish: np.ndarray
    exit_ms: np.ndarray        # per stage: T_{S_i}, the finish of its exit task

    def exit_latency(self) -> np.ndarray:
        """Per stage: the latency of a frame that leaves there (max of the exits up to it)."""
        return np.maximum.accumulate(self.exit_ms)


def transfer_ms(hardware: Hardware, src: Task, dst_unit: str) -> float:
    """u_(src->dst): zero on the same unit, else the measured handoff or the hardware's exchange cost."""
    if src.unit == dst_unit:
        return 0.0
    if src.handoff_ms is not None:
        return src.handoff_ms
    return hardware.exchange_cost(src.unit, dst_unit).cost_ms(src.out_bytes)


@dataclass(frozen=True)
class RuntimeCosts:
    """What a runtime adds to the tasks' own run times (each measured alone on its unit).

    ``dispatch_ms``: paid by every task, on its unit — handing it to the unit's worker thread,
    waking that thread, and judging the stage's exit. ``contention`` (>= 1): the slow-down of a
    task while a task on another unit runs at the same time (units that share memory bandwidth,
    such as two CPU core groups): a task's work advances at rate 1/contention while another unit
    is busy, at rate 1 otherwise. ``slowdown`` (> 0): every task's own time is multiplied by it —
    the share of the cores other processes took while the runtime was measured, or the cache's
    state when the tasks were timed differently from how the runtime runs them. The defaults
    ``handoff_ms``: paid on top of the exchange cost whenever a task reads what another unit
    produced — waking the other unit's worker, which on a busy machine waits for its core. The
    defaults (0, 1, 1, 0) are the paper's model. All four are fitted from a few measured runs
    (``mapper.runtime_costs``)."""

    dispatch_ms: float = 0.0
    contention: float = 1.0
    slowdown: float = 1.0
    handoff_ms: float = 0.0

    def __post_init__(self) -> None:
        if not self.dispatch_ms >= 0 or not self.contention >= 1 or not self.slowdown > 0 \
                or not self.handoff_ms >= 0:
            raise ValueError(f"runtime costs need dispatch_ms >= 0, contention >= 1, slowdown > 0 and "
                             f"handoff_ms >= 0, got {self.dispatch_ms!r}, {self.contention!r}, {self.slowdown!r}, "
                             f"{self.handoff_ms!r}")

    @property
    def ideal(self) -> bool:
        return self.dispatch_ms == 0 and self.contention == 1 and self.slowdown == 1 and self.handoff_ms == 0


def schedule(graph: TaskGraph, hardware: Hardware, runtime: RuntimeCosts | None = None) -> Schedule:
    """Start and finish of every task: after the tasks it needs (plus transfers) and after the
    previous task on its unit; with ``runtime``, each task also pays the dispatch cost and runs
    slower while another unit is busy."""
    if runtime is None or runtime.ideal:
        return _list_schedule(graph, hardware)
    return _shared_schedule(graph, hardware, runtime)


def _list_schedule(graph: TaskGraph, hardware: Hardware) -> Schedule:
    n = len(graph.tasks)
    start, finish = np.zeros(n), np.zeros(n)
    free: dict[str, float] = {}
    for index, task in enumerate(graph.tasks):
        ready = 0.0
        for need in task.needs:
            ready = max(ready, finish[need] + transfer_ms(hardware, graph.tasks[need], task.unit))
        start[index] = max(ready, free.get(task.unit, 0.0))
        finish[index] = start[index] + task.latency_ms
        free[task.unit] = finish[index]
    return Schedule(start, finish, finish[list(graph.exits)])


def _shared_schedule(graph: TaskGraph, hardware: Hardware, runtime: RuntimeCosts) -> Schedule:
    """An event simulation of the list schedule in which every running task advances at rate
    1/contention while a task on another unit runs; a task's work is its time × slowdown plus
    the dispatch; reading another unit's output costs the transfer plus the handoff."""
    n = len(graph.tasks)
    start, finish = np.full(n, np.nan), np.full(n, np.nan)
    queues: dict[str, list[int]] = {}
    for index, task in enumerate(graph.tasks):
        queues.setdefault(task.unit, []).append(index)
    left = {i: t.latency_ms * runtime.slowdown + runtime.dispatch_ms for i, t in enumerate(graph.tasks)}
    running: dict[str, int] = {}
    now, eps = 0.0, 1e-12

    def ready_at(index: int) -> float | None:
        """When the head task ``index`` may start (None: a task it needs has not finished)."""
        task = graph.tasks[index]
        if any(np.isnan(finish[need]) for need in task.needs):
            return None
        return max([finish[need] + transfer_ms(hardware, graph.tasks[need], task.unit)
                    + (runtime.handoff_ms if graph.tasks[need].unit != task.unit else 0.0) for need in task.needs],
                   default=0.0)

    while len(running) or any(queues.values()):
        waits = []
        for unit, queue in queues.items():
            if unit in running or not queue:
                continue
            ready = ready_at(queue[0])
            if ready is None:
                continue
            if ready <= now + eps:
                running[unit] = queue.pop(0)
                start[running[unit]] = now
            else:
                waits.append(ready - now)
        if not running:
            now += min(waits)     # nothing runs: jump to the first task that becomes ready
            continue
        rate = 1.0 / runtime.contention if len(running) > 1 else 1.0
        step = min([left[i] / rate for i in running.values()] + waits)
        now += step
        for unit, index in list(running.items()):
            left[index] -= step * rate
            if left[index] <= eps:
                finish[index] = now
                del running[unit]
    return Schedule(start, finish, finish[list(graph.exits)])


@dataclass(frozen=True)
class Outcome:
    """Per-exit and expected latency / energy of one mapping."""

    exit_latency_ms: tuple[float, ...]
    exit_energy_mj: tuple[float, ...]
    latency_ms: float          # expected over the exit rates
    energy_mj: float


def exit_energies(graph: TaskGraph, sched: Schedule, hardware: Hardware, accounting: str = "speculative"
                  ) -> np.ndarray:
    """Per stage: the energy of a frame that leaves there (mJ), tasks plus idle power of every unit
    the graph uses over the frame's latency."""
    if accounting not in ACCOUNTING:
        raise ValueError(f"accounting must be one of {', '.join(ACCOUNTING)}, got {accounting!r}")
    energy = np.array([t.energy_mj for t in graph.tasks])
    stages = np.array([t.stage for t in graph.tasks])
    duration = sched.finish - sched.start
    idle_w = sum(hardware.unit(u).idle_power_w for u in graph.units)
    out = []
    for stage, latency in enumerate(sched.exit_latency()):
        if accounting == "oracle":
            spent = energy[stages <= stage].sum()
        else:
            with np.errstate(divide="ignore", invalid="ignore"):
                done = np.where(duration > 0, (latency - sched.start) / duration, (sched.start <= latency) * 1.0)
            spent = float((energy * np.clip(done, 0.0, 1.0)).sum())
        out.append(spent + idle_w * latency)
    return np.array(out)


def evaluate(graph: TaskGraph, hardware: Hardware, exit_rates: Sequence[float],
             accounting: str = "speculative", runtime: RuntimeCosts | None = None) -> Outcome:
    """Expected latency and energy over ``exit_rates`` (one per stage, summing to 1); ``runtime``:
    the runtime's dispatch and contention costs (None: the paper's model)."""
    rates = np.asarray(exit_rates, dtype=float)
    if rates.shape != (len(graph.exits),):
        raise ValueError(f"{len(rates)} exit rates for {len(graph.exits)} stages")
    if (rates < 0).any() or not np.isclose(rates.sum(), 1.0):
        raise ValueError(f"exit rates must be >= 0 and sum to 1, got {rates.tolist()}")
    sched = schedule(graph, hardware, runtime)
    latency = sched.exit_latency()
    energy = exit_energies(graph, sched, hardware, accounting)
    return Outcome(tuple(float(v) for v in latency), tuple(float(v) for v in energy),
                   float(rates @ latency), float(rates @ energy))


#: cost(layer, unit, in_fraction, out_fraction) -> (latency_ms, energy_mj) of one sub-layer.
SublayerCost = Callable[[int, str, float, float], "tuple[float, float]"]


def width_graph(layer_names: Sequence[str], out_bytes: Sequence[int], partition: np.ndarray,
                reuse: np.ndarray, stage_units: Sequence[str], cost: SublayerCost,
                exit_cost: Callable[[int, str, float], tuple[float, float]] | None = None) -> TaskGraph:
    """The paper's stages: ``partition`` P (stages × layers, columns sum to 1) gives each stage's
    share of every layer's channels, ``reuse`` I (stages × layers, 0/1) whether stage k's features
    of layer j feed layer j+1 of the later stages; stage i runs on ``stage_units[i]``.

    Sub-layer (i, j) reads its own stage's layer j-1 and the reused j-1 features of earlier stages,
    so its input fraction is P_i^(j-1) + sum_{k<i} I_k^(j-1) P_k^(j-1) (1 at the first layer) and
    its output fraction P_i^j. ``exit_cost(stage, unit, fraction)`` prices the exit head at the
    stage's tail (None: the exit is the last sub-layer itself)."""
    partition = np.asarray(partition, dtype=float)
    reuse = np.asarray(reuse, dtype=int)
    stages, layers = partition.shape
    if reuse.shape != partition.shape or len(stage_units) != stages or len(layer_names) != layers:
        raise ValueError("partition, reuse, units and layers disagree in size")
    if (partition <= 0).any() or not np.allclose(partition.sum(axis=0), 1.0):
        raise ValueError("every stage needs a share > 0 of every layer and each layer's shares sum to 1")
    tasks: list[Task] = []
    exits: list[int] = []
    index: dict[tuple[int, int], int] = {}
    for i in range(stages):
        unit = stage_units[i]
        for j in range(layers):
            if j == 0:
                needs: tuple[int, ...] = ()
                fraction_in = 1.0
            else:
                sources = [k for k in range(i) if reuse[k, j - 1]]
                needs = tuple([index[(i, j - 1)]] + [index[(k, j - 1)] for k in sources])
                fraction_in = partition[i, j - 1] + sum(partition[k, j - 1] for k in sources)
            latency, energy = cost(j, unit, float(fraction_in), float(partition[i, j]))
            index[(i, j)] = len(tasks)
            tasks.append(Task(i, f"S{i}:{layer_names[j]}", unit, latency, energy,
                              int(round(out_bytes[j] * partition[i, j])), needs))
        if exit_cost is not None:
            latency, energy = exit_cost(i, unit, float(partition[i, -1]))
            tasks.append(Task(i, f"S{i}:exit", unit, latency, energy, 0, (index[(i, layers - 1)],)))
        exits.append(len(tasks) - 1)
    return TaskGraph(tuple(tasks), tuple(exits))


def chain_graph(costs: Sequence[tuple[str, str, float, float, int, float | None]],
                exits_after: Sequence[int] = ()) -> TaskGraph:
    """A depth-wise chain: ``costs`` per layer group (name, unit, latency_ms, energy_mj, out_bytes,
    handoff_ms) run one after the other; ``exits_after`` lists the groups after which an exit
    closes a stage (the last group always does)."""
    if not costs:
        raise ValueError("an empty chain")
    closing = sorted(set(exits_after) | {len(costs) - 1})
    if closing[0] < 0 or closing[-1] >= len(costs):
        raise ValueError(f"exits after groups {list(exits_after)} outside the chain of {len(costs)}")
    tasks: list[Task] = []
    stage = 0
    for j, (name, unit, latency, energy, out_bytes, handoff) in enumerate(costs):
        tasks.append(Task(stage, name, unit, latency, energy, out_bytes, (j - 1,) if j else (), handoff))
        if j in closing:
            stage += 1
    return TaskGraph(tuple(tasks), tuple(closing))
