"""A live lane node (real rclpy, its own process) in mapped mode: exits in /diagnostics, the
mapping switched at run time, a bad mapping file refused while the old one keeps serving."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import yaml
from _lane_client import LaneClient, lane_node

NS = f"/maptest_{os.getpid()}"
pytestmark = [pytest.mark.timeout(600), pytest.mark.graph]


def _mapping(path: Path, units: list[str], threshold: float) -> str:
    stages = [{"unit": units[0], "threshold": threshold}, {"unit": units[1]}]
    path.write_text(yaml.safe_dump({"hardware": "this-machine", "stages": stages}))
    return str(path)


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mapper_node")
    never = _mapping(tmp / "never.yaml", ["cpu0", "cpu1"], 2.0)      # exit 0 never confident enough
    with lane_node(tmp, NS, {"threads": 1, "mapping": never}, lambda: LaneClient("mapper_node_test", NS).started()) \
            as client:
        yield {"client": client, "tmp": tmp, "never": never}


def test_mapped_mode_reports_exits_and_switches_mapping_at_run_time(node):
    client: LaneClient = node["client"]
    t0 = time.monotonic()
    client.frame()
    status = client.status_where(t0, lambda s: s.get("mapped.frames", 0) >= 1, "a mapped frame")
    assert status["mapped"] == "True" and status["mapping"] == node["never"]
    assert status["mapped.last_exit"] == 1 and status["mapped.last_early_exit"] == "False"
    assert "mapped.busy_fraction.cpu0" in status and status["mapped.exit_histogram.1"] >= 1
    assert status["mapped.measured_latency_ms"] > 0 and status["mapped.predicted_latency_ms"] == 0
    # switch to a mapping whose first exit always answers: the next masks come from the early exit
    always = _mapping(node["tmp"] / "always.yaml", ["cpu1", "cpu0"], 0.0)
    ok, reason = client.set(mapping=always)
    assert ok, reason
    t1 = time.monotonic()
    client.frame()
    status = client.status_where(t1, lambda s: s.get("mapping") == always and s.get("mapped.frames", 0) >= 1,
                                 "the new mapping serving")
    assert status["mapped.last_exit"] == 0 and status["mapped.last_early_exit"] == "True"
    assert status["mapped.units"] == "cpu1,cpu0"
    # exit_threshold overrides the file's thresholds on the running mapping
    ok, reason = client.set(exit_threshold=1.0)
    assert ok, reason
    t2 = time.monotonic()
    client.frame()
    status = client.status_where(t2, lambda s: s.get("mapped.thresholds") == "1,-" and s.get("mapped.last_exit") == 1,
                                 "exit_threshold in force")
    assert status["mapped.last_early_exit"] == "False"
    ok, reason = client.set(exit_threshold=-1.0, mapping="")
    assert ok, reason
    t3 = time.monotonic()
    client.frame()
    client.status_where(t3, lambda s: s.get("mapped") == "False", "unmapped again")


def test_a_bad_mapping_file_is_refused_and_the_old_mapping_keeps_serving(node):
    client: LaneClient = node["client"]
    ok, reason = client.set(mapping=node["never"])
    assert ok, reason
    bad = node["tmp"] / "bad.yaml"
    bad.write_text(yaml.safe_dump({"hardware": "this-machine", "stages": [{"unit": "npu0"}, {"unit": "cpu0"}]}))
    wrong_count = _mapping(node["tmp"] / "three.yaml", ["cpu0", "cpu1"], 0.5)
    Path(wrong_count).write_text(yaml.safe_dump({"stages": ["cpu0", "cpu1", "cpu0"]}))
    for path, fragment in ((bad, "has no unit 'npu0'"), (Path(wrong_count), "3 stage entries"),
                           (node["tmp"] / "missing.yaml", "cannot read it")):
        t0 = time.monotonic()
        ok, reason = client.set(mapping=str(path))
        assert not ok and fragment in reason, reason
        client.frame()                                   # still serving, on the old mapping
        status = client.status_where(t0, lambda s, f=fragment: f in s.get("last_rejected_change", ""),
                                     f"the rejected mapping ({fragment})")
        assert status["mapping"] == node["never"] and status["mapped"] == "True"
