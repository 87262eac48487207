"""`dynnet demo --cameras 4` end to end (short): the simulator's four cameras, one lane node
serving all four with one model, an output on every camera's namespace carrying that camera's
own frame (stamp and frame_id)."""
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
from rclpy.qos import qos_profile_sensor_data
from sensor_msgs.msg import Image

from dynnet_ros.graph_cameras import with_cameras
from dynnet_ros.graph_config import default_config_path, load_graph
from dynnet_ros.nodes.background import BackgroundNode
from dynnet_ros.sim.rig import demo_cameras
from dynnet_ros.zoo import ensure_model

ROOT = Path(__file__).resolve().parents[1]
NAMESPACE = f"/democams_{os.getpid()}"
SIZE = "160x128"

pytestmark = [pytest.mark.timeout(600), pytest.mark.graph]


def small_graph(path: Path) -> Path:
    """vehicle.yaml's simulator (small frames, 4 Hz) and lane node (one thread, that size only)."""
    data = yaml.safe_load(default_config_path().read_text())
    data["nodes"] = [n for n in data["nodes"] if n["name"] in ("sensor_sim", "lane_node")]
    data.pop("containers")
    for node in data["nodes"]:
        node.pop("container", None)
        if node["name"] == "sensor_sim":
            node["parameters"].update(rate_hz=4.0, resolutions=[SIZE], lidar_azimuth_steps=32)
        else:
            node["parameters"].update(threads=1, camera_sizes=[SIZE])
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


class Masks:
    """The lane masks published on each camera's namespace (header stamp and frame_id)."""

    def __init__(self, cameras: list[str]) -> None:
        self.ros = BackgroundNode("demo_cameras_observer")
        self.lock = threading.Lock()
        self.seen: dict[str, list[tuple[int, str]]] = defaultdict(list)
        for camera in cameras:
            self.ros.node.create_subscription(Image, f"{NAMESPACE}/{camera}/lane/mask",
                                              lambda msg, c=camera: self._on_mask(c, msg), qos_profile_sensor_data)
        self.ros.start()

    def _on_mask(self, camera: str, msg: Image) -> None:
        with self.lock:
            self.seen[camera].append((msg.header.stamp.sec * 10**9 + msg.header.stamp.nanosec, msg.header.frame_id))


@pytest.mark.parametrize("how", ["flag", "config"])
def test_demo_with_four_cameras_serves_every_camera_from_one_node(tmp_path, how):
    """``--cameras 4`` on the one-camera graph, or a graph config that lists the cameras itself
    (as config/vehicle_4cam.yaml does): the same graph."""
    ensure_model("lane")
    cameras = demo_cameras(4)
    masks = Masks(cameras)
    report = tmp_path / "report"
    config = small_graph(tmp_path / "g.yaml")
    if how == "config":
        graph = with_cameras(load_graph(config), cameras)
        config.write_text(yaml.safe_dump({"nodes": [{"name": n.name, "executable": n.executable, "sim": n.sim,
                                                     "parameters": n.parameters} for n in graph.nodes]}))
    flag = ["--cameras", "4"] if how == "flag" else []
    try:
        out = subprocess.run([sys.executable, "-m", "dynnet_ros.cli", "demo", *flag, "--duration", "6", "--no-live",
                              "--report", str(report), "--config", str(config), "--namespace", NAMESPACE],
                             capture_output=True, text=True, timeout=540, cwd=ROOT)
    finally:
        masks.ros.close()
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    summary = json.loads((report / "summary.json").read_text())
    assert summary["cameras"] == cameras
    assert set(summary["models"]) == {"lane_node"} and summary["models"]["lane_node"]["frames_processed"] > 0
    per_camera = summary["models"]["lane_node"]["cameras"]  # from the node's camera.<name>.* counters
    assert set(per_camera) == set(cameras) and all(c["processed"] > 0 for c in per_camera.values()), per_camera
    assert "lane_node front" in out.stdout  # the live table has a row per camera
    with masks.lock:
        seen = {camera: list(values) for camera, values in masks.seen.items()}
    for camera in cameras:
        assert seen.get(camera), (camera, {c: len(v) for c, v in seen.items()})
        assert {frame for _, frame in seen[camera]} == {f"{camera}_optical_frame"}
    # the montage pairs the front camera's frames with its masks
    assert (report / "montage.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", out.stdout[-2000:]
