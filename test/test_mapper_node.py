"""A live lane node (real rclpy, its own process) in mapped mode: exits in /diagnostics, the
mapping switched at run time, a bad mapping file refused while the old one keeps serving."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from _waiting import wait_for
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.parameter import Parameter
from rclpy.parameter_client import AsyncParameterClient
from rclpy.qos import qos_profile_sensor_data
from rclpy.time import Time
from sensor_msgs.msg import Image
from std_msgs.msg import Header

from dynnet_ros.commands.map_inputs import scene_image
from dynnet_ros.commands.up import stop_process_group
from dynnet_ros.nodes.background import BackgroundNode
from dynnet_ros.nodes.convert import array_to_image
from dynnet_ros.nodes.diagnostics import status_values  # booleans come back as "True" / "False"

ROOT = Path(__file__).resolve().parents[1]
NS = f"/maptest_{os.getpid()}"
pytestmark = pytest.mark.timeout(600)


class Client:
    """Publishes scenes, collects lane masks by stamp and the node's diagnostics, sets parameters."""

    def __init__(self) -> None:
        self.ros = BackgroundNode("mapper_node_test")
        node = self.ros.node
        self.lock = threading.Lock()
        self.masks: dict[int, Image] = {}
        self.statuses: list[tuple[float, dict]] = []
        self.image_pub = node.create_publisher(Image, NS + "/camera/image_raw", qos_profile_sensor_data)
        node.create_subscription(Image, NS + "/lane/mask", self._on_mask, 10)
        node.create_subscription(DiagnosticArray, "/diagnostics", self._on_diag, 50)
        self.params = AsyncParameterClient(node, NS + "/lane_node")
        self.stamp = 100
        rgb = (scene_image(3, 224, 320)[0][0].transpose(1, 2, 0) * 255).astype(np.uint8)
        self.rgb = np.ascontiguousarray(rgb)
        self.ros.start()

    def _on_mask(self, msg: Image) -> None:
        with self.lock:
            self.masks[msg.header.stamp.sec] = msg

    def _on_diag(self, msg: DiagnosticArray) -> None:
        for status in msg.status:
            if status.hardware_id.startswith(NS + "/"):
                with self.lock:
                    self.statuses.append((time.monotonic(), status_values(status)))

    def frame(self, timeout: float = 120.0) -> Image:
        """Publish the scene with a fresh stamp until its mask comes back (same header)."""
        self.stamp += 1
        msg = array_to_image(self.rgb, "rgb8", Header(stamp=Time(seconds=self.stamp).to_msg(), frame_id="cam"))

        def answered():
            self.image_pub.publish(msg)
            with self.lock:
                return self.masks.get(self.stamp)
        mask = wait_for(answered, timeout, "the lane mask", interval=0.5)
        assert mask.header.frame_id == "cam" and (mask.width, mask.height) == (320, 224)
        return mask

    def set(self, **values) -> tuple[bool, str]:
        assert self.params.wait_for_services(timeout_sec=30.0)
        future = self.params.set_parameters_atomically([Parameter(k, value=v) for k, v in values.items()])
        wait_for(future.done, 300, f"set_parameters {sorted(values)}")
        response = future.result()
        assert response is not None
        result = response.result
        return result.successful, result.reason

    def status_where(self, t0: float, predicate, what: str) -> dict:
        def match():
            with self.lock:
                return next((s for t, s in self.statuses if t >= t0 and predicate(s)), None)
        return wait_for(match, 60, f"a status with {what}")


def _mapping(path: Path, units: list[str], threshold: float) -> str:
    stages = [{"unit": units[0], "threshold": threshold}, {"unit": units[1]}]
    path.write_text(yaml.safe_dump({"hardware": "this-machine", "stages": stages}))
    return str(path)


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mapper_node")
    never = _mapping(tmp / "never.yaml", ["cpu0", "cpu1"], 2.0)      # exit 0 never confident enough
    params = tmp / "params.yaml"
    params.write_text(yaml.safe_dump({"/**": {"ros__parameters": {"threads": 1, "mapping": never}}}))
    log = (tmp / "node.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "dynnet_ros.nodes.lane_node", "--ros-args", "-r", f"__ns:={NS}",
                             "--params-file", str(params)], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                            start_new_session=True)
    client = Client()
    try:
        wait_for(lambda: client.params.wait_for_services(timeout_sec=0.5) or proc.poll() is not None, 300,
                 "the lane node to start")
        assert proc.poll() is None, (tmp / "node.log").read_text()
        yield {"client": client, "tmp": tmp, "never": never}
    finally:
        client.ros.close()
        stop_process_group(proc)
        log.close()


def test_mapped_mode_reports_exits_and_switches_mapping_at_run_time(node):
    client: Client = node["client"]
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
    client: Client = node["client"]
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
