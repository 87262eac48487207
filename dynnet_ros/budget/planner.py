"""The budget manager's brain, without ROS: profiles in, budget pushes and a report out.

The node (dynnet_ros.nodes.budget_manager) only moves messages: it feeds memory readings and
model profiles in here, sends the pushes this returns through each node's parameter service,
and reports the outcome back (accepted, or rejected with the node's reason).
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from dynnet_ros.budget.oom import OomAction, OomPolicy, oom_action
from dynnet_ros.budget.policy import (
    Allocation,
    Hysteresis,
    NodeSpec,
    PoolConfig,
    allocate,
    apply_hysteresis,
    dnn_pool_mb,
)
from dynnet_ros.budget.protocol import BudgetReport, ModelProfile, NodeBudgetReport, OomReport
from dynnet_ros.budget.sources import MemoryReading


def fq_name(name: str, namespace: str = "/") -> str:
    """Fully qualified node name: config may say ``lane_node``, profiles say ``/ns/lane_node``."""
    name = name.strip()
    if not name:
        raise ValueError("node name must not be empty")
    if name.startswith("/"):
        return name
    return namespace.rstrip("/") + "/" + name


@dataclass(frozen=True)
class NodeConfig:
    """A model node the manager budgets, as configured (priority weight, bounds in MB)."""

    name: str
    priority: float = 1.0
    min_mb: float = 0.0
    max_mb: float = math.inf

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", fq_name(self.name))
        NodeSpec(self.name, self.priority, self.min_mb, self.max_mb)  # same validation rules


@dataclass(frozen=True)
class ManagerConfig:
    pool: PoolConfig = field(default_factory=PoolConfig)
    hysteresis: Hysteresis = field(default_factory=Hysteresis)
    nodes: tuple[NodeConfig, ...] = ()
    rate_hz: float = 1.0               # periodic re-evaluation
    pressure_drop_mb: float = 64.0     # an available-memory drop this large re-evaluates at once
    profile_timeout_s: float = 5.0     # a node silent this long is left out of the split
    push_timeout_s: float = 5.0        # a parameter call unanswered this long may be retried
    retry_factor: float = 1.25         # after a rejection, the next offer is at least this × larger
    default_priority: float = 1.0      # for model nodes that publish profiles but are not configured
    oom: OomPolicy = field(default_factory=OomPolicy)  # the answer to an OOM kill of a model node
    #: memory of compute units (dla0, gpu, …) shared among the nodes whose mapped stages use them
    unit_memory_mb: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for unit, mb in self.unit_memory_mb.items():
            if not unit.strip() or not (math.isfinite(mb) and mb >= 0):
                raise ValueError(f"unit memory {unit!r}={mb!r}: expected a unit name and a finite number of MB >= 0")
        if not (math.isfinite(self.rate_hz) and self.rate_hz > 0):
            raise ValueError(f"rate_hz must be > 0, got {self.rate_hz!r}")
        for name in ("pressure_drop_mb", "profile_timeout_s", "push_timeout_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        if not (math.isfinite(self.retry_factor) and self.retry_factor > 1):
            raise ValueError(f"retry_factor must be > 1, got {self.retry_factor!r}")
        names = [n.name for n in self.nodes]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate node names in budget manager config: {names}")


@dataclass
class _NodeState:
    profile: ModelProfile | None = None
    seen_s: float = -math.inf
    applied_mb: float | None = None        # last budget the node acknowledged
    applied_s: float = -math.inf
    pending: tuple[float, float] | None = None  # (mb, sent_at) of an unanswered push
    floor_mb: float = 0.0                  # learned from rejections
    floor_for_min: float | None = None     # the profile min the floor was learned against
    last_error: str | None = None
    oom: OomAction | None = None           # the cap after the node's last OOM kill, while it holds
    oom_event: int | None = None           # the supervisor's number for that kill


@dataclass(frozen=True)
class Evaluation:
    report: BudgetReport
    allocation: Allocation
    pushes: dict[str, float]               # node → budget to send now


class BudgetPlanner:
    """Stateful planner: remembers profiles, budgets in force, pending pushes and learned floors.

    ``host`` is the machine whose memory the planner splits (``settings().host_id``): a profile
    from a node on another host (several computers in one ROS domain) is not this planner's to
    budget, so it is set aside in ``other_hosts``; "" splits among every node that reports, and a
    profile that names no host counts as local.
    """

    def __init__(self, config: ManagerConfig, host: str = "") -> None:
        self.config = config
        self.host = host
        self.other_hosts: dict[str, str] = {}   # node -> the host it reported from
        self._nodes: dict[str, _NodeState] = {}
        self._last_eval_s: float | None = None
        self._last_available: float | None = None
        self._dirty: str | None = "startup"

    # ------------------------------------------------------------------ inputs
    def set_config(self, config: ManagerConfig) -> None:
        self.config = config
        self._dirty = "configuration changed"

    def observe_profile(self, profile: ModelProfile, now_s: float) -> bool:
        """Take ``profile`` in; False (and nothing kept) when its node runs on another host."""
        if self.host and profile.host and profile.host != self.host:
            self.other_hosts[profile.node] = profile.host
            if self._nodes.pop(profile.node, None) is not None:
                self._dirty = f"{profile.node} runs on host {profile.host}"
            return False
        self.other_hosts.pop(profile.node, None)
        state = self._nodes.setdefault(profile.node, _NodeState())
        if state.profile is None:
            self._dirty = f"new model node {profile.node}"
        elif (_moved(state.profile.size_min_mb(), profile.size_min_mb())
              or _moved(state.profile.full_mb, profile.full_mb) or state.profile.measured != profile.measured
              or state.profile.units != profile.units):
            self._dirty = f"{profile.node} profile changed"
        if state.floor_for_min is not None and state.floor_for_min != profile.min_mb:
            state.floor_mb, state.floor_for_min = 0.0, None  # the model changed: forget old rejections
        # A node that restarted (or was set by someone else) reports a budget we did not give it.
        if (state.pending is None and now_s - state.applied_s > self.config.profile_timeout_s
                and not _same(profile.budget_mb, state.applied_mb)):
            state.applied_mb, state.applied_s = profile.budget_mb, now_s
            self._dirty = f"{profile.node} reports budget {profile.budget_mb}"
        state.profile, state.seen_s = profile, now_s
        return True

    def push_result(self, node: str, mb: float, accepted: bool, reason: str, now_s: float) -> None:
        """The node's parameter service answered a push (``reason`` is its rejection text)."""
        state = self._nodes.setdefault(node, _NodeState())
        state.pending = None
        if accepted:
            state.applied_mb, state.applied_s, state.last_error = mb, now_s, None
            return
        state.last_error = reason or "rejected without a reason"
        state.floor_mb = max(state.floor_mb, mb * self.config.retry_factor, mb + 1.0)
        state.floor_for_min = state.profile.min_mb if state.profile else None
        self._dirty = f"{node} rejected {mb:.1f} MB"

    def push_dropped(self, node: str) -> None:
        """A push could not be sent or got no answer: offer again at the next evaluation."""
        state = self._nodes.setdefault(node, _NodeState())
        state.pending = None

    def record_oom(self, node: str, now_s: float, evidence: str, event: int | None = None) -> OomAction:
        """``node`` was OOM-killed: cap its budget below what it had (OomPolicy) and re-plan now.

        Called before the node returns, so its first budget already fits under the cap.
        """
        state = self._nodes.setdefault(node, _NodeState())
        held = state.profile.held_mb if state.profile is not None else None
        configured = {n.name: n for n in self.config.nodes}.get(node)
        floor = max(configured.min_mb if configured else 0.0, state.floor_mb,
                    (state.profile.size_min_mb() or 0.0) if state.profile is not None else 0.0)
        # a second kill while capped cuts from the cap, not from the memory before the first
        budget = state.applied_mb if state.oom is None or state.oom.cap_mb is None \
            else min(state.applied_mb or math.inf, state.oom.cap_mb)
        action = oom_action(node, now_s, evidence, budget_mb=budget, held_mb=held, min_mb=floor,
                            policy=self.config.oom)
        if state.oom is not None and now_s < state.oom.until_s:  # reserve additions add up
            action = replace(action, reserve_add_mb=action.reserve_add_mb + state.oom.reserve_add_mb)
        state.oom, state.oom_event, state.pending = action, event, None
        if action.start_budget_mb is not None:
            state.applied_mb, state.applied_s = action.start_budget_mb, now_s
        self._dirty = f"OOM kill of {node}"
        return action

    def oom_reports(self, now_s: float) -> list[OomReport]:
        """The OOM caps in force (forgetting those whose hold has passed), by node name."""
        active = []
        for name, state in sorted(self._nodes.items()):
            if state.oom is not None and now_s >= state.oom.until_s:
                state.oom = None
                self._dirty = self._dirty or f"OOM cap of {name} lifted"
            if state.oom is not None:
                active.append(OomReport.from_action(state.oom, now_s, state.oom_event))
        return active

    def applied_mb(self, node: str) -> float | None:
        state = self._nodes.get(node)
        return state.applied_mb if state else None

    # ------------------------------------------------------------------ decisions
    def live_nodes(self, now_s: float) -> list[str]:
        return [name for name, _ in self._live_profiles(now_s)]

    def _live_profiles(self, now_s: float) -> list[tuple[str, ModelProfile]]:
        """(node, profile) of the nodes that reported a profile within the timeout, by name."""
        return [(n, s.profile) for n, s in sorted(self._nodes.items(), key=lambda item: item[0])
                if s.profile is not None and now_s - s.seen_s <= self.config.profile_timeout_s]

    def waiting(self, now_s: float) -> list[str]:
        """Live nodes whose engine ran no frame yet: their minimum is an estimate, so they get
        no budget (they run as configured) and what they hold is kept out of the split."""
        return [name for name, profile in self._live_profiles(now_s) if not profile.measured]

    def due(self, reading: MemoryReading, now_s: float) -> str | None:
        """Why an evaluation is due now (None = not yet)."""
        if self._dirty:
            return self._dirty
        if self._last_eval_s is None or now_s - self._last_eval_s >= 1.0 / self.config.rate_hz:
            return "periodic"
        if self._last_available is not None and \
                self._last_available - reading.available_mb >= self.config.pressure_drop_mb:
            return f"pressure: available memory fell {self._last_available - reading.available_mb:.0f} MB"
        return None

    def specs(self, now_s: float) -> list[NodeSpec]:
        configured = {n.name: n for n in self.config.nodes}
        specs = []
        for name, profile in self._live_profiles(now_s):
            if not profile.measured:
                continue
            state = self._nodes[name]
            cfg = configured.get(name) or NodeConfig(name, self.config.default_priority)
            # the minimum at every size class the node serves: a budget must fit the next
            # resolution switch before it arrives, not after the node measured it
            lo = max(cfg.min_mb, profile.size_min_mb() or 0.0, state.floor_mb)
            hi = cfg.max_mb
            if profile.full_mb is not None:
                hi = min(hi, profile.full_mb)
            if state.oom is not None and state.oom.cap_mb is not None:
                hi = min(hi, state.oom.cap_mb)
            specs.append(NodeSpec(name, cfg.priority, lo, max(lo, hi), profile.table))
        return specs

    def unit_budgets(self, now_s: float) -> dict[str, dict[str, float]]:
        """Each configured unit's memory split among the live nodes that ask for it
        (``ModelProfile.units``), in proportion to their priorities."""
        configured = {n.name: n for n in self.config.nodes}
        claims = {name: ((configured.get(name) or NodeConfig(name, self.config.default_priority)).priority,
                         profile.units)
                  for name, profile in self._live_profiles(now_s) if profile.units}
        return split_units(self.config.unit_memory_mb, claims)

    def held_mb(self, now_s: float, *, waiting_only: bool = False) -> float:
        """Memory the live model nodes hold that ``available`` lacks (their anonymous growth);
        ``waiting_only``: of the nodes not budgeted yet."""
        total = 0.0
        for _, profile in self._live_profiles(now_s):
            if waiting_only and profile.measured:
                continue
            held = profile.anon_held_mb if profile.anon_held_mb is not None else profile.held_mb
            total += held or 0.0
        return total

    def evaluate(self, reading: MemoryReading, now_s: float, reason: str = "periodic") -> Evaluation:
        ooms = self.oom_reports(now_s)
        specs = self.specs(now_s)
        held = self.held_mb(now_s)
        pool = self.config.pool
        if ooms:  # memory an OOM kill showed missing is kept out of the pool while the cap holds
            pool = replace(pool, reserve_mb=pool.reserve_mb + sum(o.reserve_add_mb for o in ooms))
        total = dnn_pool_mb(reading.available_mb, held, pool, reading.gpu_shared_mb)
        # nodes still waiting for their first frame keep what they hold: it is not the others' to split
        alloc = allocate(max(0.0, total - self.held_mb(now_s, waiting_only=True)), specs)
        bounds = {s.name: (s.min_mb, s.max_mb) for s in specs}
        current = {s.name: mb for s in specs if (mb := self._nodes[s.name].applied_mb) is not None}
        last = {s.name: self._nodes[s.name].applied_s for s in specs}
        decided = apply_hysteresis(current, alloc.budgets, alloc.total_mb, last, now_s,
                                   self.config.hysteresis, bounds)
        pushes: dict[str, float] = {}
        for name, mb in decided.items():
            state = self._nodes[name]
            if state.pending is not None and now_s - state.pending[1] < self.config.push_timeout_s:
                continue  # one call in flight per node
            if not _same(mb, state.applied_mb):
                pushes[name] = mb
                state.pending = (mb, now_s)
        self._last_eval_s, self._last_available, self._dirty = now_s, reading.available_mb, None
        nodes = {}
        for spec in specs:
            state = self._nodes[spec.name]
            nodes[spec.name] = NodeBudgetReport(
                budget_mb=state.applied_mb, target_mb=decided.get(spec.name, spec.min_mb),
                min_mb=spec.min_mb, max_mb=spec.max_mb if math.isfinite(spec.max_mb) else None,
                priority=spec.weight, predicted_ms=spec.predicted_ms(decided.get(spec.name, spec.min_mb)),
                held_mb=state.profile.held_mb if state.profile else None, last_error=state.last_error,
                starved=spec.name in alloc.starved)
        report = BudgetReport(stamp=now_s, source=reading.source, available_mb=reading.available_mb,
                              held_mb=held, reserve_mb=pool.reserve_mb, total_mb=alloc.total_mb,
                              pressure=alloc.pressure, infeasible=alloc.infeasible, reason=reason,
                              nodes=nodes, starved=list(alloc.starved), waiting=self.waiting(now_s),
                              oom_kills=ooms, unit_memory_mb=dict(self.config.unit_memory_mb),
                              unit_budgets=self.unit_budgets(now_s))
        return Evaluation(report, alloc, pushes)


def split_units(unit_memory_mb: Mapping[str, float],
                claims: Mapping[str, tuple[float, tuple[str, ...]]]) -> dict[str, dict[str, float]]:
    """{node: {unit: MB}}: each unit of ``unit_memory_mb`` shared among the nodes that claim it
    (``claims``: node -> (priority, units)) in proportion to their priorities. Why priorities: a
    unit's memory decides which stages may run there, and the weight that buys a node latency in
    the pool's split is the one that should buy it room on a fast unit. Units nobody configured
    are left out (a node keeps the hardware file's limit there)."""
    out: dict[str, dict[str, float]] = {node: {} for node, (_, units) in claims.items()}
    for unit, mb in unit_memory_mb.items():
        takers = {node: priority for node, (priority, units) in claims.items() if unit in units}
        total = sum(takers.values())
        for node, priority in takers.items():
            out[node][unit] = mb * priority / total   # priorities are > 0 (NodeSpec)
    return {node: units for node, units in out.items() if units}


def _same(a: float | None, b: float | None, tol: float = 1e-6) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return abs(a - b) <= tol


def _moved(a: float | None, b: float | None, tol_mb: float = 1.0) -> bool:
    """A profile bound changed enough to re-plan (sub-MB RSS drift does not count)."""
    if a is None or b is None:
        return (a is None) != (b is None)
    return abs(a - b) >= tol_mb
