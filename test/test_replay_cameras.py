"""`dynnet replay` of a multi-camera rig's bag: every camera's frames go out on the graph's
camera topics (``NAME/image_raw`` under the namespace) with the stamps they were recorded with,
the bag's own topic names mapped onto them with ``--remap``; into a graph whose lane node serves
all four cameras, every camera's every frame is processed, paced and counted per camera topic."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections import defaultdict
from pathlib import Path

import pytest
import yaml
from _bags import write_cameras_bag
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import CameraInfo, Image

from dynnet_ros.nodes.background import BackgroundNode
from dynnet_ros.zoo import ensure_model

ROOT = Path(__file__).resolve().parents[1]
NAMESPACE = f"/replaycams_{os.getpid()}"
#: the rig's cameras (as its bag names them) -> the graph's camera namespaces
RIG = {"cam0": "front", "cam1": "left", "cam2": "right", "cam3": "rear"}
#: what the player offers (reliable, transient-local): a matching reader misses no frame
RELIABLE = QoSProfile(depth=50, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL)

pytestmark = [pytest.mark.timeout(300), pytest.mark.graph]


class Headers:
    """(topic -> header stamps and frame_ids) of the graph's camera topics."""

    def __init__(self) -> None:
        self.ros = BackgroundNode("replay_cameras_observer")
        self.lock = threading.Lock()
        self.seen: dict[str, list[tuple[int, str]]] = defaultdict(list)
        for camera in RIG.values():
            for topic, kind in ((f"{NAMESPACE}/{camera}/image_raw", Image),
                                (f"{NAMESPACE}/{camera}/camera_info", CameraInfo)):
                self.ros.node.create_subscription(kind, topic, self._recorder(topic), RELIABLE)
        self.ros.start()

    def _recorder(self, topic: str):
        def record(msg) -> None:
            with self.lock:
                self.seen[topic].append((msg.header.stamp.sec * 10**9 + msg.header.stamp.nanosec,
                                         msg.header.frame_id))
        return record

    def snapshot(self) -> dict[str, list[tuple[int, str]]]:
        with self.lock:
            return {topic: list(values) for topic, values in self.seen.items()}


def test_a_four_camera_bag_replays_every_camera_onto_the_graphs_camera_topics(tmp_path):
    written = write_cameras_bag(tmp_path / "rig", cameras=tuple(RIG), frames=5, topic="/{name}/image")
    remaps = [f"/{rig}/{kind}:={graph}/{target}" for rig, graph in RIG.items()
              for kind, target in (("image", "image_raw"), ("camera_info", "camera_info"))]
    headers = Headers()
    try:
        proc = subprocess.run([sys.executable, "-m", "dynnet_ros.cli", "replay", str(tmp_path / "rig"), "--no-graph",
                               "--namespace", NAMESPACE, "--rate", "4", "--json", str(tmp_path / "replay.json"),
                               "--remap", *remaps], cwd=ROOT, capture_output=True, text=True, timeout=240)
        seen = headers.snapshot()
    finally:
        headers.ros.close()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((tmp_path / "replay.json").read_text())
    assert summary["completed"]
    for rig, camera in RIG.items():
        recorded = [r.stamp_ns for r in written if r.topic == f"/{rig}/image"]
        for topic in (f"{NAMESPACE}/{camera}/image_raw", f"{NAMESPACE}/{camera}/camera_info"):
            assert [stamp for stamp, _ in seen.get(topic, [])] == recorded, topic  # once each, in order
            assert {frame for _, frame in seen[topic]} == {f"{rig}_optical_frame"}
            assert summary["topics"][topic]["published"] == len(recorded) == 5
        assert summary["topics"][f"{NAMESPACE}/{camera}/image_raw"]["source"] == f"/{rig}/image"
    assert summary["topics"][f"{NAMESPACE}/lidar/points"]["published"] == 5


def test_a_four_camera_bag_replays_into_one_lane_node_serving_all_four_losing_no_frame(tmp_path):
    ensure_model("lane")
    cameras = tuple(RIG.values())
    write_cameras_bag(tmp_path / "rig", cameras=cameras, frames=4)
    config = tmp_path / "lane.yaml"
    config.write_text(yaml.safe_dump({"nodes": [{"name": "lane_node", "executable": "lane_node", "parameters": {
        "threads": 1, "camera_sizes": ["32x24"], "cameras": list(cameras)}}]}, sort_keys=False))
    namespace = f"{NAMESPACE}_lane"
    proc = subprocess.run([sys.executable, "-m", "dynnet_ros.cli", "replay", str(tmp_path / "rig"), "--config",
                           str(config), "--namespace", namespace, "--strict", "--linger", "1",
                           "--json", str(tmp_path / "replay.json")],
                          cwd=ROOT, capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    assert "every model node processed every frame" in proc.stdout, proc.stdout[-3000:]
    rows = json.loads((tmp_path / "replay.json").read_text())["frames"].values()
    assert {row["topic"] for row in rows} == {f"{namespace}/{camera}/image_raw" for camera in cameras}
    for row in rows:
        assert row["node"] == f"{namespace}/lane_node"
        assert (row["published"], row["processed"], row["dropped"], row["lost"]) == (4, 4, 0, 0), row
