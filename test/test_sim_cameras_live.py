"""A live multi-camera sensor_sim (its own process): each camera's rate and yaw change at run
time through the node's parameter service, the camera list does not (read-only), and a bad
per-camera value is refused with the reason while the cameras keep publishing."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from _waiting import wait_for
from rclpy.parameter import Parameter
from rclpy.parameter_client import AsyncParameterClient
from rclpy.qos import qos_profile_sensor_data
from sensor_msgs.msg import Image

from dynnet_ros.nodes.background import BackgroundNode
from dynnet_ros.supervisor.runner import stop_process_group

ROOT = Path(__file__).resolve().parents[1]
NS = f"/simcams_{os.getpid()}"

pytestmark = [pytest.mark.timeout(300), pytest.mark.graph]


class Frames:
    """Arrival times and the last image of each camera."""

    def __init__(self) -> None:
        self.ros = BackgroundNode("sim_cameras_observer")
        self.lock = threading.Lock()
        self.times: dict[str, list[float]] = defaultdict(list)
        self.last: dict[str, bytes] = {}
        for camera in ("front", "rear"):
            self.ros.node.create_subscription(Image, f"{NS}/{camera}/image_raw",
                                              lambda msg, c=camera: self._on_image(c, msg), qos_profile_sensor_data)
        self.params = AsyncParameterClient(self.ros.node, f"{NS}/sensor_sim")
        self.ros.start()

    def _on_image(self, camera: str, msg: Image) -> None:
        with self.lock:
            self.times[camera].append(time.monotonic())
            self.last[camera] = bytes(msg.data)

    def count_since(self, camera: str, since: float) -> int:
        with self.lock:
            return sum(t >= since for t in self.times[camera])

    def set(self, **values):
        assert self.params.wait_for_services(timeout_sec=20.0)
        future = self.params.set_parameters([Parameter(name.replace("__", "."), value=value)
                                             for name, value in values.items()])
        wait_for(future.done, 30.0, f"set {values}")
        return future.result().results[0]


def red_pixels(data: bytes) -> int:
    """Pixels of the nearest pedestrian's red (no road, verge, paint or sky colour is red)."""
    rgb = np.frombuffer(data, np.uint8).reshape(64, 96, 3).astype(int)
    return int(((rgb[..., 0] > 120) & (rgb[..., 1] < 90) & (rgb[..., 2] < 90)).sum())


def test_each_cameras_rate_and_yaw_change_at_run_time_and_the_camera_list_does_not(tmp_path):
    sim = subprocess.Popen([sys.executable, "-m", "dynnet_ros.nodes.sensor_sim", "--ros-args", "-r", f"__ns:={NS}",
                            "-p", "cameras:=[front, rear]", "-p", "rate_hz:=4.0", "-p", "rear.rate_hz:=1.0",
                            "-p", "resolutions:=['96x64']", "-p", "lidar_azimuth_steps:=16"],
                           cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           start_new_session=True)
    frames = Frames()
    try:
        wait_for(lambda: frames.count_since("front", 0.0) >= 3 and frames.count_since("rear", 0.0) >= 1, 60,
                 "both cameras' first frames")
        start = time.monotonic()
        time.sleep(3.0)
        slow = frames.count_since("rear", start)
        assert frames.count_since("front", start) > 2 * slow  # 4 Hz against 1 Hz
        assert frames.set(rear__rate_hz=8.0).successful
        start = time.monotonic()
        time.sleep(3.0)
        assert frames.count_since("rear", start) > 2 * max(slow, 1), "rear.rate_hz 8 at run time"
        # the pedestrians walk ahead: the rear camera sees the nearest (red) one once its yaw turns it forward
        with frames.lock:
            before = red_pixels(frames.last["rear"])
        assert frames.set(rear__yaw_deg=0.0).successful
        changed = time.monotonic()
        wait_for(lambda: frames.count_since("rear", changed) >= 3, 30, "rear frames after the yaw change")
        with frames.lock:
            after = red_pixels(frames.last["rear"])
        assert before == 0 and after >= 10, (before, after)
        refused = frames.set(front__rate_hz=100.0)
        assert not refused.successful and "front.rate_hz out of range" in refused.reason
        listed = frames.set(cameras=["front"])
        assert not listed.successful  # read-only: a change needs a restart
        assert sim.poll() is None
        start = time.monotonic()
        wait_for(lambda: frames.count_since("front", start) >= 2, 30, "the front camera still publishing")
    finally:
        frames.ros.close()
        stop_process_group(sim)
