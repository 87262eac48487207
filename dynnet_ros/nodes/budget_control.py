"""The budget manager's ROS side: profiles in, `memory_budget_mb` pushes out, report published.

All decisions live in dynnet_ros.budget.planner (no ROS). This class only wires it to a node:
parameters (declared with descriptors, validated on set), the profile subscription, one
AsyncParameterClient per model node (the real parameter service), the /dynnet/budgets topic and
a /diagnostics status. Everything runs on the node's executor thread, so no locks are needed.
"""
from __future__ import annotations

import functools
import math
import time
from typing import Any

from diagnostic_msgs.msg import DiagnosticStatus
from rcl_interfaces.msg import SetParametersResult
from rclpy.node import Node
from rclpy.parameter import Parameter
from rclpy.parameter_client import AsyncParameterClient
from std_msgs.msg import String

from dynnet_ros.budget.planner import BudgetPlanner, Evaluation, ManagerConfig, NodeConfig, fq_name
from dynnet_ros.budget.policy import Hysteresis, PoolConfig
from dynnet_ros.budget.protocol import (
    BUDGET_PARAM,
    BUDGETS_TOPIC,
    NODE_EVENTS_TOPIC,
    OWNER_PARAM,
    PROFILES_TOPIC,
    ModelProfile,
    NodeEvent,
)
from dynnet_ros.budget.sources import MemoryReading, MemorySource
from dynnet_ros.nodes import diagnostics as diag
from dynnet_ros.nodes.base import ParamSpec, declare, steady_timer
from dynnet_ros.settings import settings


def _positive_list(name: str):
    def check(values) -> str | None:
        bad = [v for v in values if not (math.isfinite(v) and v >= 0)]
        return f"{name} entries must be finite numbers >= 0, got {bad}" if bad else None
    return check


def unit_memory(entries: list[str]) -> dict[str, float]:
    """``unit_memory_mb`` entries (UNIT=MB; blank ones ignored) -> {unit: MB}; ValueError naming a bad one."""
    out: dict[str, float] = {}
    for entry in entries:
        if not entry.strip():
            continue
        unit, sep, value = entry.partition("=")
        try:
            mb = float(value) if sep and unit.strip() else math.nan
        except ValueError:
            mb = math.nan
        if not (math.isfinite(mb) and mb >= 0):
            raise ValueError(f"unit_memory_mb entry {entry!r}: expected UNIT=MB with MB a number >= 0")
        if unit.strip() in out:
            raise ValueError(f"unit_memory_mb names {unit.strip()!r} twice")
        out[unit.strip()] = mb
    return out


def _unit_error(entries: list[str]) -> str | None:
    try:
        unit_memory(entries)
    except ValueError as exc:
        return str(exc)
    return None


MANAGER_SPECS = [
    ParamSpec("allocate", True, "Split the pool and push memory_budget_mb to the model nodes; false = only "
              "report the allocation it would make (the model nodes keep their own budgets)."),
    ParamSpec("reserve_mb", 1024.0, "Memory kept free for non-DNN tasks (MiB); the DNN pool is available "
              "memory + what the model nodes hold - this.", low=0.0, high=1.0e7),
    ParamSpec("total_budget_mb", 0.0, "Fixed cap on the DNN pool (MiB); 0 = derive it from available memory "
              "only.", low=0.0, high=1.0e7),
    ParamSpec("rate_hz", 1.0, "Periodic re-evaluation rate.", low=0.01, high=50.0),
    ParamSpec("monitor_hz", 5.0, "How often memory is read to catch pressure between evaluations.",
              low=0.1, high=100.0),
    ParamSpec("pressure_drop_mb", 64.0, "An available-memory drop this large (MiB) since the last evaluation "
              "re-evaluates at once.", low=0.001, high=1.0e7),
    ParamSpec("hysteresis_mb", 8.0, "Budget changes smaller than max(this, hysteresis_frac x budget) wait.",
              low=0.0, high=1.0e6),
    ParamSpec("hysteresis_frac", 0.05, "Relative part of the hysteresis threshold.", low=0.0, high=10.0),
    ParamSpec("min_interval_s", 2.0, "A node's budget changes at most once per this many seconds (decreases "
              "needed to stay inside the pool are never held back).", low=0.0, high=3600.0),
    ParamSpec("profile_timeout_s", 5.0, "A model node silent on /dynnet/model_profiles this long gets no budget.",
              low=0.1, high=3600.0),
    ParamSpec("count_gpu_shared", True, "Jetson: count NvMapMemUsed (GPU memory) as held by the DNNs."),
    ParamSpec("memory_root", "/", "Directory whose proc/meminfo and cgroup files are read for available memory "
              "(a host's /proc mounted elsewhere, or a prepared tree); '/' = this machine, through psutil.",
              check=lambda v: None if v.startswith("/") else
              f"memory_root must be an absolute path, got {v!r}"),
    ParamSpec("node_names", ["lane_node", "pedestrian_node", "depth_node"], "Model nodes with configured "
              "priority/min/max; model nodes not listed that publish profiles get priority 1.",
              kind="string_array"),
    ParamSpec("node_priorities", [1.0, 1.0, 1.0], "Priority weight per entry of node_names (its latency "
              "counts this many times).", kind="double_array", check=_positive_list("node_priorities")),
    ParamSpec("node_min_mb", [0.0, 0.0, 0.0], "Minimum budget per entry of node_names (MiB).",
              kind="double_array", check=_positive_list("node_min_mb")),
    ParamSpec("node_max_mb", [0.0, 0.0, 0.0], "Maximum budget per entry of node_names (MiB; 0 = no maximum).",
              kind="double_array", check=_positive_list("node_max_mb")),
    ParamSpec("unit_memory_mb", [""], "Memory of compute units for mapped stages, as UNIT=MB entries (e.g. "
              "dla0=64); shared among the model nodes whose `mapping: auto` may use the unit, by priority, and "
              "published on dynnet/budgets ([''] = none).", kind="string_array",
              check=_unit_error),
]



def config_from_params(p: dict[str, Any], namespace: str = "/") -> ManagerConfig:
    """ManagerConfig from parameter values; ValueError names what is inconsistent.

    Relative ``node_names`` resolve in the manager's own namespace, like ROS names do.
    """
    names = list(p["node_names"])
    nodes = []
    for key in ("node_priorities", "node_min_mb", "node_max_mb"):
        if len(p[key]) != len(names):
            raise ValueError(f"{key} has {len(p[key])} entries but node_names has {len(names)}")
    for i, name in enumerate(names):
        hi = p["node_max_mb"][i]
        nodes.append(NodeConfig(fq_name(name, namespace), priority=p["node_priorities"][i],
                                min_mb=p["node_min_mb"][i], max_mb=math.inf if hi == 0 else hi))
    return ManagerConfig(
        pool=PoolConfig(reserve_mb=p["reserve_mb"], total_budget_mb=p["total_budget_mb"],
                        count_gpu_shared=p["count_gpu_shared"]),
        hysteresis=Hysteresis(p["hysteresis_mb"], p["hysteresis_frac"], p["min_interval_s"]),
        nodes=tuple(nodes), rate_hz=p["rate_hz"], pressure_drop_mb=p["pressure_drop_mb"],
        profile_timeout_s=p["profile_timeout_s"], unit_memory_mb=unit_memory(list(p["unit_memory_mb"])))


class BudgetController:
    """Attach the allocating budget manager to ``node`` (see module docstring)."""

    def __init__(self, node: Node, source: MemorySource | None = None) -> None:
        self.node = node
        self._specs = {s.name: s for s in MANAGER_SPECS}
        self.params = declare(node, MANAGER_SPECS)
        # bad startup values raise here (run_node prints the reason and exits 1)
        self.planner = BudgetPlanner(config_from_params(self.params, node.get_namespace()), settings().host_id)
        self.source = source or MemorySource(self.params["memory_root"])
        self._clients: dict[str, AsyncParameterClient] = {}
        self._ownerless: set[str] = set()  # nodes that declare no OWNER_PARAM: their budget alone is pushed
        self._logged_push: dict[str, tuple[float | None, float]] = {}  # last change logged at INFO
        self._logged_starved: tuple[str, ...] = ()
        self.last: Evaluation | None = None
        self.last_reading: MemoryReading | None = None
        self.bad_profiles = 0
        self._last_profile_error: str | None = None
        self._t0 = time.monotonic()
        self.pub = node.create_publisher(String, BUDGETS_TOPIC, 10)
        node.create_subscription(String, PROFILES_TOPIC, self._on_profile, 10)
        node.create_subscription(String, NODE_EVENTS_TOPIC, self._on_node_event, 10)
        node.add_on_set_parameters_callback(self._on_set_parameters)
        self._timer = steady_timer(node, 1.0 / self.params["monitor_hz"], self.tick)

    # ------------------------------------------------------------------ inputs
    def _now(self) -> float:
        return time.monotonic() - self._t0

    def _on_set_parameters(self, parameters) -> SetParametersResult:
        updates = {}
        for param in parameters:
            spec = self._specs.get(param.name)
            if spec is None:
                continue  # someone else's parameter (the monitoring part of the node)
            value = list(param.value) if spec.type_key in ("double_array", "string_array") else param.value
            reason = spec.validate(value)
            if reason:
                return SetParametersResult(successful=False, reason=reason)
            updates[param.name] = value
        if not updates:
            return SetParametersResult(successful=True)
        merged = {**self.params, **updates}
        try:
            config = config_from_params(merged, self.node.get_namespace())
        except ValueError as exc:
            return SetParametersResult(successful=False, reason=str(exc))
        self.params = merged
        self.planner.set_config(config)
        if "memory_root" in updates:
            self.source = MemorySource(merged["memory_root"])
        if "monitor_hz" in updates:
            self._timer.timer_period_ns = int(1e9 / merged["monitor_hz"])
        return SetParametersResult(successful=True)

    def _on_profile(self, msg: String) -> None:
        try:
            profile = ModelProfile.from_json(msg.data)
        except ValueError as exc:
            self.bad_profiles += 1
            self._last_profile_error = str(exc)
            self.node.get_logger().warn(f"ignoring model profile: {exc}", throttle_duration_sec=10.0)
            return
        if not self.planner.observe_profile(profile, self._now()):
            self.node.get_logger().info(
                f"not budgeting {profile.node}: it runs on host {profile.host!r}, this manager splits "
                f"{self.planner.host!r}'s memory", throttle_duration_sec=60.0)

    def _on_node_event(self, msg: String) -> None:
        """A supervisor reports a node's death; an OOM kill caps that node before it returns."""
        try:
            event = NodeEvent.from_json(msg.data)
        except ValueError as exc:
            self.node.get_logger().warn(f"ignoring node event: {exc}", throttle_duration_sec=10.0)
            return
        if event.kind != "oom_kill":
            return
        action = self.planner.record_oom(event.node, self._now(), event.evidence, event.event)
        cap = "no figure for it known" if action.cap_mb is None else f"budget capped at {action.cap_mb:.1f} MB"
        self.node.get_logger().warn(f"{event.node} was OOM-killed ({event.evidence}): {cap}, reserve "
                                    f"+{action.reserve_add_mb:.1f} MB for {self.planner.config.oom.hold_s:g} s")
        self.tick()  # re-plan and publish now: the supervisor waits for this answer to restart the node

    # ------------------------------------------------------------------ the loop
    def tick(self) -> None:
        now = self._now()
        try:
            reading = self.source.read()
        except OSError as exc:
            self.node.get_logger().error(f"cannot read memory: {exc}", throttle_duration_sec=10.0)
            return
        self.last_reading = reading
        reason = self.planner.due(reading, now)
        if reason is None:
            return
        evaluation = self.planner.evaluate(reading, now, reason)
        self.last = evaluation
        self._log_starved(evaluation)
        for name, mb in evaluation.pushes.items():
            if self.params["allocate"]:
                self._push(name, mb, now)
            else:
                self.planner.push_dropped(name)
        self.pub.publish(String(data=evaluation.report.to_json()))

    def _log_starved(self, evaluation: Evaluation) -> None:
        """ERROR once per change of the starved set: a node the pool cannot cover runs at its
        minimum on memory the pool does not have, which nobody should learn from a budget alone."""
        starved = evaluation.allocation.starved
        if starved and starved != self._logged_starved:
            r = evaluation.report
            need = sum(nb.min_mb for nb in r.nodes.values())
            names = ", ".join(f"{n} (priority {r.nodes[n].priority:g}, min {r.nodes[n].min_mb:.1f} MB)"
                              for n in starved)
            self.node.get_logger().error(f"DNN pool {r.total_mb:.1f} MB < sum of minimums {need:.1f} MB: "
                                         f"starved {names}; they run at their minimum, over the pool")
        self._logged_starved = starved

    def _push(self, name: str, mb: float, now: float) -> None:
        client = self._clients.get(name)
        if client is None:
            client = self._clients[name] = AsyncParameterClient(self.node, name)
        if not client.services_are_ready():
            self.planner.push_dropped(name)
            self.node.get_logger().warn(f"parameter services of {name} not ready; budget push deferred",
                                        throttle_duration_sec=10.0)
            return
        old = self.planner.applied_mb(name)
        text = f"budget {name}: {'-' if old is None else f'{old:.1f}'} -> {mb:.1f} MB"
        if self._logged_push.get(name) == (old, mb):  # a retry of the same change: DEBUG
            self.node.get_logger().debug(text)
        else:
            self.node.get_logger().info(text)
            self._logged_push[name] = (old, mb)
        # the budget with this manager's name as its owner, in one atomic call: the node then
        # refuses a hand-set budget while this manager runs (nodes/model_node.py)
        push: list[Parameter] = [Parameter(BUDGET_PARAM, Parameter.Type.DOUBLE, float(mb))]
        if name not in self._ownerless:
            push.append(Parameter(OWNER_PARAM, Parameter.Type.STRING, self.node.get_fully_qualified_name()))
        future = client.set_parameters_atomically(push)
        future.add_done_callback(functools.partial(self._on_push_done, name, mb))

    def _on_push_done(self, name: str, mb: float, future) -> None:
        now = self._now()
        try:
            result = future.result().result
        except Exception as exc:  # noqa: BLE001 — service vanished mid-call: retry next evaluation
            self.planner.push_dropped(name)
            self.node.get_logger().warn(f"budget push to {name} failed: {exc}")
            return
        if not result.successful and "undeclared parameter" in result.reason and name not in self._ownerless:
            # a node of its own kind without OWNER_PARAM (rclpy's reason does not name it): the
            # budget alone from now on
            self._ownerless.add(name)
            self.planner.push_dropped(name)
            return
        if not result.successful:
            self.node.get_logger().warn(f"{name} rejected memory_budget_mb={mb:.1f}: {result.reason}; "
                                        "will offer more")
        self.planner.push_result(name, mb, result.successful, result.reason, now)

    # ------------------------------------------------------------------ reporting
    def diagnostic_status(self) -> DiagnosticStatus:
        """One DiagnosticStatus for /diagnostics: the allocation and why it looks the way it does."""
        name = f"{self.node.get_name()}: allocation"
        hw = self.node.get_fully_qualified_name()
        if self.last is None:
            return diag.make_status(name, hw, diag.WARN, "no evaluation yet", {})
        r = self.last.report
        values: dict[str, Any] = {
            "memory_source": r.source, "available_mb": r.available_mb, "held_mb": r.held_mb,
            "reserve_mb": r.reserve_mb, "dnn_total_mb": r.total_mb, "pressure": r.pressure,
            "infeasible": r.infeasible, "last_reason": r.reason, "model_nodes": len(r.nodes),
            "bad_profiles": self.bad_profiles, "last_bad_profile": self._last_profile_error or "",
            "allocate": self.params["allocate"],
            "starved": ",".join(r.starved), "waiting_for_first_frame": ",".join(r.waiting),
            "oom_killed": ",".join(o.node for o in r.oom_kills),
            "host": self.planner.host,
            "other_host_nodes": ",".join(f"{n}@{h}" for n, h in sorted(self.planner.other_hosts.items())),
        }
        for oom in r.oom_kills:
            key = oom.node.lstrip("/")
            values[f"{key}.oom_cap_mb"] = oom.cap_mb
            values[f"{key}.oom_reserve_add_mb"] = oom.reserve_add_mb
            values[f"{key}.oom_evidence"] = oom.evidence
            values[f"{key}.oom_remaining_s"] = oom.remaining_s
        if self.last_reading is not None:
            values["memory_candidates"] = self.last_reading.details.get("candidates", {})
            values["gpu_shared_mb"] = self.last_reading.gpu_shared_mb
        for node_name, nb in r.nodes.items():
            key = node_name.lstrip("/")
            values[f"{key}.budget_mb"] = nb.budget_mb
            values[f"{key}.target_mb"] = nb.target_mb
            values[f"{key}.min_mb"] = nb.min_mb
            values[f"{key}.predicted_ms"] = nb.predicted_ms
            if nb.last_error:
                values[f"{key}.last_error"] = nb.last_error
        for unit, mb in r.unit_memory_mb.items():
            values[f"unit_memory_mb.{unit}"] = mb
        for node_name, units in r.unit_budgets.items():
            for unit, mb in units.items():
                values[f"{node_name.lstrip('/')}.unit_mb.{unit}"] = mb
        if r.infeasible:
            need = sum(nb.min_mb for nb in r.nodes.values())
            level, message = diag.ERROR, (f"DNN pool {r.total_mb:.0f} MB < sum of minimums {need:.0f} MB; "
                                          f"starved: {', '.join(r.starved)}")
        elif r.oom_kills:
            capped = ", ".join(f"{o.node} (OOM-killed: {'no cap' if o.cap_mb is None else f'cap {o.cap_mb:.1f} MB'}, "
                               f"reserve +{o.reserve_add_mb:.1f} MB)" for o in r.oom_kills)
            level, message = diag.WARN, f"{r.total_mb:.0f} MB shared; taken from the DNNs after OOM kills: {capped}"
        elif r.pressure:
            level, message = diag.WARN, f"memory pressure: {r.total_mb:.0f} MB shared, some models swap"
        elif not r.nodes:
            level, message = diag.OK, f"{r.total_mb:.0f} MB available to DNNs; no model node profiles yet"
        else:
            level, message = diag.OK, f"{r.total_mb:.0f} MB shared by {len(r.nodes)} model nodes"
        return diag.make_status(name, hw, level, message, values)
