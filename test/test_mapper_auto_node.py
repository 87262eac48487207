"""A live lane node (real rclpy, its own process, loopback) with `mapping: auto`: it runs the
cached search's pick, re-picks when a budget report shrinks a unit's memory, and without a
cache reports an ERROR naming the command to run while it keeps serving unmapped."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from _lane_client import LaneClient, lane_node
from _waiting import wait_for
from std_msgs.msg import String

from dynnet_ros.budget.protocol import BUDGETS_TOPIC, PROFILES_TOPIC, ModelProfile
from dynnet_ros.engine.backends.trt_cache import model_sha256
from dynnet_ros.mapper.choices import Constraints, SearchChoices, cache_file, write_choices
from dynnet_ros.mapper.hardware import load_hardware
from dynnet_ros.mapper.search import NEVER, Candidate
from dynnet_ros.nodes.diagnostics import ERROR
from dynnet_ros.supervisor.runner import stop_process_group
from dynnet_ros.zoo import ensure_model

NS = f"/mapauto_{os.getpid()}"
NODE = NS + "/lane_node"
pytestmark = [pytest.mark.timeout(600), pytest.mark.graph]


def _candidate(units: tuple[str, str], latency: float, memory: dict[str, float]) -> Candidate:
    return Candidate((("stage0", units[0]), ("stage1", units[1])), tuple((u, "") for u in dict.fromkeys(units)),
                     (NEVER,), latency, latency * 4, 1.0, latency, (0.0, 1.0), tuple(memory.items()))


#: the cache a search would leave: the fastest needs the most of cpu0
BOTH_CPU0 = _candidate(("cpu0", "cpu0"), 10.0, {"cpu0": 8.0})
SPLIT = _candidate(("cpu1", "cpu0"), 12.0, {"cpu1": 5.0, "cpu0": 3.0})
BOTH_CPU1 = _candidate(("cpu1", "cpu1"), 15.0, {"cpu1": 8.0})


class Client(LaneClient):
    """The lane client plus budget reports out and the node's budget profiles in."""

    def __init__(self) -> None:
        super().__init__("mapper_auto_test", NS)
        self.profiles: list[ModelProfile] = []
        self.budget_pub = self.ros.node.create_publisher(String, NS + "/" + BUDGETS_TOPIC, 10)
        self.ros.node.create_subscription(String, NS + "/" + PROFILES_TOPIC, self._on_profile, 10)
        self.started()

    def _on_profile(self, msg: String) -> None:
        with self.lock:
            self.profiles.append(ModelProfile.from_json(msg.data))

    def budget(self, units: dict[str, float]) -> None:
        """A budget report that gives the node ``units`` (MB per unit), as the manager's."""
        self.budget_pub.publish(String(data=json.dumps({"unit_budgets": {NODE: units}, "nodes": {}})))


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mapper_auto")
    model = Path(ensure_model("lane")).read_bytes()
    hardware = load_hardware("this-machine")
    write_choices(cache_file(tmp / "map", model, hardware),
                  SearchChoices(model_sha256(model), hardware.name, "224x320", 1.0, Constraints(prefer="latency"),
                                (BOTH_CPU0, SPLIT, BOTH_CPU1)))
    with lane_node(tmp, NS, {"threads": 1, "mapping": "auto"}, Client, env={"DYNNET_MAP_DIR": str(tmp / "map")}) \
            as client:
        yield {"client": client, "log": tmp / "node.log"}


def test_auto_runs_the_cached_pick_and_re_picks_when_a_units_memory_shrinks(node):
    client: Client = node["client"]
    t0 = time.monotonic()
    client.frame()
    status = client.status_where(t0, lambda s: s.get("mapped.frames", 0) >= 1, "a mapped frame")
    assert status["mapping"] == "auto" and status["mapped"] == "True"
    assert status["mapped.auto.candidate"] == "stage0=cpu0,stage1=cpu0" and status["mapped.units"] == "cpu0,cpu0"
    assert "prefer latency" in status["mapped.auto.reason"] and status["mapped.predicted_latency_ms"] == 10.0
    # the node asks the manager for a share of its hardware's units
    wait_for(lambda: any(p.units == ("cpu0", "cpu1") for p in list(client.profiles)), 30, "units in the profile")
    # a budget report leaves it 4 MB of cpu0: the split candidate (3 MB there) takes over
    t1 = time.monotonic()
    status = client.status_where(t1, lambda s: s.get("mapped.auto.candidate") == "stage0=cpu1,stage1=cpu0",
                                 "the re-pick", on_poll=lambda: client.budget({"cpu0": 4.0}))
    assert status["mapped.auto.unit_limits_mb"] == "cpu0=4" and "1 over cpu0's 4 MB" in status["mapped.auto.reason"]
    t2 = time.monotonic()
    client.frame()                                  # serving on the new stages
    status = client.status_where(t2, lambda s: s.get("mapped.units") == "cpu1,cpu0"
                                 and s.get("mapped.frames", 0) >= 1, "the new stages serving")
    assert status["mapped.predicted_latency_ms"] == 12.0
    # no unit memory at all: nothing fits, ERROR, unmapped, still serving
    t3 = time.monotonic()
    status = client.status_where(t3, lambda s: "none of the 3 cached candidates" in s.get("mapped.auto.error", ""),
                                 "no candidate within the limits",
                                 on_poll=lambda: client.budget({"cpu0": 0.0, "cpu1": 0.0}))
    assert status["level"] == ERROR and status["mapped"] == "False"
    client.frame()
    # the budget back: the fastest again
    t4 = time.monotonic()
    client.status_where(t4, lambda s: s.get("mapped.auto.candidate") == "stage0=cpu0,stage1=cpu0",
                        "the fastest pick back", on_poll=lambda: client.budget({}))


def test_auto_without_a_cache_reports_the_command_and_keeps_serving(node):
    client: Client = node["client"]
    ok, reason = client.set(mapping="auto:no-such-board")
    assert not ok and "no-such-board" in reason, reason
    ok, reason = client.set(mapping="auto:this-machine:1")       # another hardware: nothing cached for it
    assert ok, reason
    t0 = time.monotonic()
    client.frame()
    status = client.status_where(t0, lambda s: s.get("mapping") == "auto:this-machine:1"
                                 and s.get("frames_processed", 0) >= 1, "the uncached auto mapping")
    assert status["level"] == ERROR and status["mapped"] == "False"
    assert "dynnet map search" in status["mapped.auto.error"] and "--hw this-machine:1" in status["mapped.auto.error"]
    assert "no search result cached" in node["log"].read_text()
    ok, reason = client.set(mapping="")
    assert ok, reason


def test_a_budget_manager_with_unit_memory_moves_the_pick(node, tmp_path):
    """The whole chain: the node's profile asks for its units, a real budget_manager (allocating
    nothing, only reporting) shares `cpu0=4` and the node re-picks under it."""
    client: Client = node["client"]
    ok, reason = client.set(mapping="auto")
    assert ok, reason
    t0 = time.monotonic()
    client.status_where(t0, lambda s: s.get("mapped.auto.candidate") == "stage0=cpu0,stage1=cpu0", "the fastest pick")
    params = tmp_path / "manager.yaml"
    params.write_text(yaml.safe_dump({"/**": {"ros__parameters": {"allocate": False, "rate_hz": 2.0,
                                                                  "unit_memory_mb": ["cpu0=4"]}}}))
    with (tmp_path / "manager.log").open("w") as log:
        manager = subprocess.Popen([sys.executable, "-m", "dynnet_ros.nodes.budget_manager", "--ros-args", "-r",
                                    f"__ns:={NS}", "--params-file", str(params)], stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        try:
            t1 = time.monotonic()
            status = client.status_where(t1, lambda s: s.get("mapped.auto.unit_limits_mb") == "cpu0=4",
                                         "the manager's share of cpu0")
            assert manager.poll() is None, (tmp_path / "manager.log").read_text()
            if status["mapped.auto.candidate"] != "stage0=cpu1,stage1=cpu0":
                status = client.status_where(t1, lambda s: s.get("mapped.auto.candidate") == "stage0=cpu1,stage1=cpu0",
                                             "the re-pick under the manager's share")
            assert "cpu0 <= 4 MB" in status["mapped.auto.reason"]
        finally:
            stop_process_group(manager)
