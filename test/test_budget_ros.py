"""Budget manager end to end: real processes, real rclpy, real parameter services.

`dynnet up` starts the vehicle graph (simulator, lane / pedestrian / depth nodes, budget
manager) from a test config with fast re-evaluation. The manager reads available memory from a
meminfo file the test writes (`memory_root`), not from this machine: the test moves the pool
(available + held − reserve) where it wants it, whatever else runs here and however much memory
is free. As on a real machine, what the model nodes hold is missing from "available": the test
rewrites the file from each budget report (available = the pool it aims at − what the nodes
hold), so budgets that shrink do not shrink the pool. The model nodes' `memory_budget_mb` must
follow through their parameter services and the nodes must keep publishing; when the pool
comes back the budgets rise again.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import rclpy
import yaml
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.parameter import Parameter
from rclpy.parameter_client import AsyncParameterClient
from sensor_msgs.msg import Image
from std_msgs.msg import String
from visualization_msgs.msg import MarkerArray

from dynnet_ros.budget.protocol import BUDGETS_TOPIC, PROFILES_TOPIC
from dynnet_ros.graph_config import default_config_path
from dynnet_ros.supervisor.runner import stop_process_group

REPO = Path(__file__).resolve().parents[1]
# Own namespace as well as own ROS_DOMAIN_ID: another graph on this machine that happens to share
# the domain (a concurrent test run) can neither answer our calls nor feed our subscribers.
NS = f"/budgettest_{os.getpid()}"
MODEL_NODES = tuple(f"{NS}/{n}" for n in ("lane_node", "pedestrian_node", "depth_node"))
DEPTH, PEDESTRIAN, MANAGER = f"{NS}/depth_node", f"{NS}/pedestrian_node", f"{NS}/budget_manager"
OUTPUTS = {"/lane/mask": Image, "/pedestrian/markers": MarkerArray, "/depth/image": Image}
HYST_MB = 2.5      # the test config's hysteresis (2 MB / 2 %) plus rounding
ROOMY_POOL_MB = 4000.0  # a pool far above what the three models need

# Every wait below is a deadline for a condition, not a speed requirement: on a machine loaded
# many times over (a full suite next to other jobs) the graph starts, calibrates and answers far
# slower than alone, and a passing run only takes as long as the conditions take.
STARTUP_S = 240.0  # the graph up and every model node profiled (first calibrations included)
STEP_S = 120.0     # a pool step acknowledged, or a node's diagnostics showing its new budget
pytestmark = [pytest.mark.timeout(1200), pytest.mark.graph]

class FakeMemory:
    """The meminfo file the manager reads: available = the pool the test aims at − what the
    model nodes hold (their memory is missing from "available", as on a real machine)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "proc").mkdir(parents=True, exist_ok=True)
        self.pool_mb = ROOMY_POOL_MB
        self.write(held_mb=0.0)

    def write(self, held_mb: float) -> None:
        available_kb = int(max(0.0, self.pool_mb - held_mb) * 1024)
        text = f"MemTotal: {64 * 1024 * 1024} kB\nMemFree: {available_kb} kB\nMemAvailable: {available_kb} kB\n"
        tmp = self.root / "proc" / "meminfo.tmp"
        tmp.write_text(text)
        os.replace(tmp, self.root / "proc" / "meminfo")  # the manager never reads half a file


def _graph_config(tmp_path: Path, memory_root: Path) -> Path:
    data = yaml.safe_load(default_config_path().read_text())
    for node in data["nodes"]:
        p = node.setdefault("parameters", {})
        if node["name"] == "sensor_sim":
            p.update(rate_hz=3.0, resolutions=["320x240"])  # one size: stable budget tables
        elif node["name"] == "budget_manager":
            # the pool is what FakeMemory says: available + held − 0
            p.update(memory_root=str(memory_root), reserve_mb=0.0, total_budget_mb=0.0, rate_hz=4.0,
                     monitor_hz=10.0, pressure_drop_mb=32.0, hysteresis_mb=2.0, hysteresis_frac=0.02,
                     min_interval_s=0.5, profile_timeout_s=6.0)
        elif node["name"] in ("lane_node", "pedestrian_node", "depth_node"):
            p.update(threads=1, memory_budget_mb=0.0, camera_sizes=["320x240"])  # the one size the camera sends
    path = tmp_path / "vehicle_budget_test.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


class Probe:
    """The test's own node: collects budget reports, profiles, diagnostics and output counts."""

    def __init__(self, memory: FakeMemory, log: Path) -> None:
        self.node = rclpy.create_node("budget_test_probe")
        self.memory = memory
        self.log = log  # the graph's output (dynnet up and its nodes), quoted when a wait times out
        self.reports: list[dict] = []
        self.profiles: dict[str, dict] = {}
        self.diags: dict[str, dict] = {}
        self.counts = {topic: 0 for topic in OUTPUTS}
        self.node.create_subscription(String, f"{NS}/{BUDGETS_TOPIC}",
                                      self._on_report, 50)
        self.node.create_subscription(String, f"{NS}/{PROFILES_TOPIC}", self._on_profile, 50)
        self.node.create_subscription(DiagnosticArray, "/diagnostics", self._on_diag, 50)
        for topic, kind in OUTPUTS.items():
            self.node.create_subscription(kind, NS + topic, lambda _m, t=topic: self._count(t),
                                          rclpy.qos.qos_profile_sensor_data)

    def _on_report(self, msg: String) -> None:
        report = json.loads(msg.data)
        self.reports.append(report)
        self.memory.write(report["held_mb"])  # what the nodes hold is not available

    def _count(self, topic: str) -> None:
        self.counts[topic] += 1

    def _on_profile(self, msg: String) -> None:
        data = json.loads(msg.data)
        self.profiles[data["node"]] = data

    def _on_diag(self, msg: DiagnosticArray) -> None:
        for status in msg.status:
            if not status.hardware_id.startswith(NS + "/"):  # /diagnostics is global: another graph's
                continue
            self.diags[status.name] = {"level": status.level[0] if isinstance(status.level, bytes)
                                       else int(status.level), "message": status.message,
                                       "values": {kv.key: kv.value for kv in status.values}}

    def spin_until(self, predicate, timeout: float, what: str, fail: bool = True):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            rclpy.spin_once(self.node, timeout_sec=0.05)
            result = self.check(predicate, what)
            if result:
                return result
        if not fail:
            return None
        raise AssertionError(self.timed_out(timeout, what))

    def check(self, predicate, what: str):
        """``predicate()``; a model node missing from the manager's report (its profile late
        beyond profile_timeout_s) fails with the report, the statuses and the log, not a bare KeyError."""
        try:
            return predicate()
        except KeyError as exc:
            raise AssertionError(f"{exc} missing while waiting for {what}: "
                                 + self.timed_out(0.0, what).split("; ", 1)[1]) from exc

    def timed_out(self, timeout: float, what: str) -> str:
        """What a timed-out wait reports: the manager's last budget report, each model node's
        last status and the tail of the graph's log (its nodes' warnings and errors included)."""
        statuses = {n: self.diags.get(f"{n.rsplit('/', 1)[-1]}: {task} model")
                    for n, task in zip(MODEL_NODES, ("lane", "pedestrian", "depth"))}
        return (f"timed out after {timeout:.0f} s waiting for {what}; "
                f"last report: {self.reports[-1] if self.reports else None}; "
                f"model node statuses: {statuses}; output counts: {self.counts}\n"
                f"graph log tail:\n{self.log.read_text()[-6000:]}")

    def spin_until_stable(self, value, hold_s: float, timeout: float, what: str):
        """Wait until ``value()`` is truthy and unchanged for ``hold_s`` seconds."""
        deadline = time.monotonic() + timeout
        current, since = None, time.monotonic()
        while time.monotonic() < deadline:
            rclpy.spin_once(self.node, timeout_sec=0.1)
            now_value = self.check(value, what)
            if not now_value or now_value != current:
                current, since = now_value, time.monotonic()
            elif time.monotonic() - since >= hold_s:
                return current
        raise AssertionError(self.timed_out(timeout, what))

    def spin_for(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            rclpy.spin_once(self.node, timeout_sec=0.1)

    def call(self, future, timeout: float = STEP_S):
        return self.spin_until(lambda: future.done() and future, timeout, "a service reply").result()

    def node_status(self, node: str) -> dict:
        """Latest /diagnostics status of ``node`` (fully qualified), e.g. ``lane_node: lane model``."""
        return next(v for k, v in self.diags.items() if k.startswith(node.rsplit("/", 1)[-1] + ":"))

    def engines_at_acked(self, timeout: float = STEP_S) -> tuple[dict[str, float], dict[str, int]]:
        """The budgets in force and each model engine's resident weight bytes, once every engine's
        /diagnostics show the budget its node acknowledged last (all of its weights while it runs
        in memory). The budgets are read at each check: a node's levels are re-measured as it
        runs, so the manager may re-send a budget a little off the one acknowledged before."""
        def ready():
            out = {}
            budgets = self.acked()
            for n in MODEL_NODES:
                values = self.node_status(n)["values"]
                if float(values["engine.memory_budget_mb"] or "nan") != pytest.approx(budgets[n], abs=1e-3):
                    return None
                resident = values.get("engine.resident_weight_bytes")
                out[n] = int(float(resident if resident not in (None, "", "None") else values["engine.weight_bytes"]))
            return budgets, out
        return self.spin_until(ready, timeout, "engines running at the budgets acknowledged")

    def last(self) -> dict:
        return self.reports[-1]

    def acked(self) -> dict[str, float]:
        """Budgets in force per model node (acknowledged by each node's parameter service)."""
        nodes = self.last()["nodes"]
        return {n: nodes[n]["budget_mb"] for n in MODEL_NODES if n in nodes}


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("budget_ros")
    memory = FakeMemory(tmp / "memory_root")
    with open(tmp / "graph.log", "w") as log:  # the child holds its own descriptor
        proc = subprocess.Popen([sys.executable, "-m", "dynnet_ros.cli", "up", "--config",
                                 str(_graph_config(tmp, memory.root)),
                                 "--namespace", NS],
                                cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    rclpy.init()
    probe = Probe(memory, tmp / "graph.log")
    try:
        yield proc, probe, tmp / "graph.log"
    finally:
        probe.node.destroy_node()
        rclpy.shutdown()
        stop_process_group(proc)


def _all_profiled(probe: Probe):
    if not probe.reports:
        return None
    nodes = probe.last()["nodes"]
    return all(n in nodes and nodes[n]["budget_mb"] is not None for n in MODEL_NODES) and nodes


def _graph_alive(proc, log: Path) -> None:
    assert proc.poll() is None, f"dynnet up exited ({proc.returncode}):\n{log.read_text()[-4000:]}"


def test_budgets_follow_memory_pressure(graph):
    proc, probe, log = graph
    nodes = probe.spin_until(lambda: _all_profiled(probe), STARTUP_S, "budgets for all three model nodes")
    _graph_alive(proc, log)
    sum_min = sum(nodes[n]["min_mb"] for n in MODEL_NODES)
    sum_max = sum(nodes[n]["max_mb"] for n in MODEL_NODES)
    assert sum_max > sum_min + 8, f"models report no room to swap (min {sum_min:.0f}, max {sum_max:.0f} MB)"

    # (the engines' tables settle after their first frames: wait until the budgets hold still)
    full = lambda: (not probe.last()["pressure"]  # noqa: E731
                    and all(probe.acked()[n] == pytest.approx(probe.last()["nodes"][n]["max_mb"], abs=HYST_MB)
                            for n in MODEL_NODES) and tuple(probe.acked().values()))
    probe.spin_until_stable(full, 3.0, STEP_S, "every model at a steady full budget")
    before, resident_full = probe.engines_at_acked()
    sum_min = sum(probe.last()["nodes"][n]["min_mb"] for n in MODEL_NODES)
    sum_max = sum(probe.last()["nodes"][n]["max_mb"] for n in MODEL_NODES)
    counts0 = dict(probe.counts)
    timings: dict[str, float] = {}

    def squeeze(pool_mb: float, done, what: str, timeout: float = STEP_S) -> None:
        """Aim the pool at ``pool_mb`` and wait until ``done()``."""
        probe.memory.pool_mb = pool_mb
        probe.memory.write(probe.last()["held_mb"])
        start = time.monotonic()
        probe.spin_until(done, timeout, what)
        timings[what] = round(time.monotonic() - start, 2)

    # Step 1: the pool falls between the sums of minimums and maximums: budgets shrink.
    squeeze((sum_min + sum_max) / 2, lambda: probe.last()["pressure"]
            and sum(probe.acked().values()) < sum(before.values()) - 4, "budget shrink")
    shrunk = probe.acked()
    report = probe.last()
    assert report["total_mb"] < sum_max
    for n in MODEL_NODES:  # (a node's levels are re-measured as it runs: compare with its report now)
        assert report["nodes"][n]["min_mb"] - 0.5 <= shrunk[n] <= report["nodes"][n]["max_mb"] + 0.5, (n, report)
    probe.spin_for(4.0)  # the nodes keep serving at the new budgets
    counts1 = dict(probe.counts)
    _graph_alive(proc, log)

    # Step 2: the pool falls below the sum of minimums: every model at its minimum, the
    # lowest-priority one named as starved, ERROR diagnostic.
    squeeze(sum_min - 16, lambda: probe.last()["infeasible"]
            and all(probe.acked()[n] == pytest.approx(probe.last()["nodes"][n]["min_mb"], abs=0.5)
                    for n in MODEL_NODES), "every model at its minimum")
    at_min, resident_min = probe.engines_at_acked()
    assert probe.last()["starved"], probe.last()
    probe.spin_until(lambda: any(k.startswith("budget_manager: allocation") and v["level"] == 2
                                 and "starved" in v["message"] for k, v in probe.diags.items()),
                     STEP_S, "an ERROR allocation diagnostic naming the starved node")
    probe.spin_for(4.0)
    counts2 = dict(probe.counts)
    _graph_alive(proc, log)

    # The pool comes back: budgets rise back to full.
    # (each node's full level is re-measured as it runs, so "full" is the level it reports now)
    squeeze(ROOMY_POOL_MB, lambda: not probe.last()["pressure"]
            and all(probe.acked()[n] == pytest.approx(probe.last()["nodes"][n]["max_mb"], abs=2 * HYST_MB)
                    and probe.acked()[n] > at_min[n] for n in MODEL_NODES), "budgets to rise again")
    print(f"\nbudget test: min {sum_min:.1f} MB, max {sum_max:.1f} MB in total; full {before}; "
          f"under pressure {shrunk}; at minimum {at_min}; resident weight bytes at full {resident_full}, "
          f"at minimum {resident_min}; seconds from each pool step to the budgets acknowledged: {timings}")
    probe.spin_for(3.0)
    _graph_alive(proc, log)

    # The engines really swap at their minimum: fewer weights resident than at full budget.
    for n in MODEL_NODES:
        assert resident_min[n] < resident_full[n], (n, resident_min, resident_full)
    # Every allocation the manager published fit its pool and each node's bounds.
    for r in probe.reports:
        targets = {n: v["target_mb"] for n, v in r["nodes"].items()}
        if not r["infeasible"]:
            assert sum(targets.values()) <= r["total_mb"] + 0.01, r
        for n, v in r["nodes"].items():
            assert v["min_mb"] - 0.01 <= targets[n] <= (v["max_mb"] or float("inf")) + 0.01, r
    # Every output kept publishing in every phase.
    for topic in OUTPUTS:
        assert counts1[topic] > counts0[topic], f"{topic} stopped under the first pool step"
        assert counts2[topic] > counts1[topic], f"{topic} stopped with every model at its minimum"
        assert probe.counts[topic] > counts2[topic], f"{topic} stopped after the pool came back"
    # Frame drops stay bounded: newest-frame-wins, never a backlog that loses most frames.
    for n in MODEL_NODES:
        status = probe.node_status(n)
        received = float(status["values"]["frames_received"])
        dropped = float(status["values"]["frames_dropped"])
        assert received > 0 and dropped <= 0.5 * received, \
            f"{n}: {dropped:.0f} of {received:.0f} frames dropped; its status: {status}\n{log.read_text()[-4000:]}"
    # The nodes report the budget in force in their profiles.
    probe.spin_until(lambda: all(probe.profiles[n]["budget_mb"] == pytest.approx(probe.acked()[n], abs=1e-3)
                                 for n in MODEL_NODES), STEP_S, "profiles to report the budgets in force")


def test_impossible_budget_is_rejected_with_reason(graph):
    proc, probe, log = graph
    nodes = probe.spin_until(lambda: _all_profiled(probe), STARTUP_S, "budgets for all three model nodes")
    depth = AsyncParameterClient(probe.node, DEPTH)
    assert depth.wait_for_services(STEP_S)
    impossible = max(0.5, nodes[DEPTH]["min_mb"] / 4)
    # a budget set by hand is refused while the manager owns the node's budget ...
    result = probe.call(depth.set_parameters([Parameter("memory_budget_mb", Parameter.Type.DOUBLE, impossible)]))
    assert not result.results[0].successful
    assert f"assigned by the budget manager {MANAGER}" in result.results[0].reason, result.results[0].reason
    # ... and one pushed as the manager pushes it, below the model's minimum, by the engine
    result = probe.call(depth.set_parameters([Parameter("memory_budget_mb", Parameter.Type.DOUBLE, impossible),
                                              Parameter("budget_owner", Parameter.Type.STRING, MANAGER)]))
    assert not result.results[0].successful
    assert result.results[0].reason and "assigned by" not in result.results[0].reason, result.results[0].reason
    # the node keeps its previous budget and keeps publishing
    got = probe.call(depth.get_parameters(["memory_budget_mb"]))
    assert got.values[0].double_value != pytest.approx(impossible)
    start = probe.counts["/depth/image"]
    probe.spin_until(lambda: probe.counts["/depth/image"] > start, STEP_S, "depth output after the rejection")

    # The manager's own settings are validated too.
    manager = AsyncParameterClient(probe.node, MANAGER)
    assert manager.wait_for_services(STEP_S)
    bad = probe.call(manager.set_parameters([Parameter("node_priorities", Parameter.Type.DOUBLE_ARRAY, [1.0])]))
    assert not bad.results[0].successful and "node_priorities" in bad.results[0].reason
    # the node list and its per-node arrays change together in one atomic call
    good = probe.call(manager.set_parameters_atomically([
        Parameter("node_names", Parameter.Type.STRING_ARRAY, ["depth_node", "lane_node"]),
        Parameter("node_priorities", Parameter.Type.DOUBLE_ARRAY, [5.0, 1.0]),
        Parameter("node_min_mb", Parameter.Type.DOUBLE_ARRAY, [0.0, 0.0]),
        Parameter("node_max_mb", Parameter.Type.DOUBLE_ARRAY, [0.0, 0.0])]))
    assert good.result.successful, good.result.reason
    probe.spin_until(lambda: probe.last()["nodes"][DEPTH]["priority"] == 5.0
                     and probe.last()["nodes"][PEDESTRIAN]["priority"] == 1.0, STEP_S,
                     "the new priorities in the budget report")
    _graph_alive(proc, log)


def test_manager_parameters_map_to_config():
    from dynnet_ros.nodes.budget_control import MANAGER_SPECS, config_from_params

    params = {s.name: s.default for s in MANAGER_SPECS}
    params.update(node_names=["lane_node", "depth_node"], node_priorities=[2.0, 1.0],
                  node_min_mb=[10.0, 0.0], node_max_mb=[0.0, 300.0], reserve_mb=512.0)
    cfg = config_from_params(params)
    assert [(n.name, n.priority, n.min_mb, n.max_mb) for n in cfg.nodes] == \
        [("/lane_node", 2.0, 10.0, float("inf")), ("/depth_node", 1.0, 0.0, 300.0)]
    assert cfg.pool.reserve_mb == 512.0
    with pytest.raises(ValueError, match="node_min_mb has 1 entries"):
        config_from_params({**params, "node_min_mb": [1.0]})
    with pytest.raises(ValueError, match="priority"):
        config_from_params({**params, "node_priorities": [0.0, 1.0]})
    with pytest.raises(ValueError, match="max_mb"):
        config_from_params({**params, "node_min_mb": [10.0, 400.0]})
    cfg = config_from_params(params, "/robot1")
    assert [n.name for n in cfg.nodes] == ["/robot1/lane_node", "/robot1/depth_node"]
