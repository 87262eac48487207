"""Peak RSS and frames of a live sensor_sim with one camera and with N: what more cameras cost in memory.

Starts ``python -m dynnet_ros.nodes.sensor_sim`` (default parameters: 10 Hz, 320x240 -> 640x480
-> 1280x720 every 5 s) once with its single camera and once with ``--cameras`` names, each for
``--seconds`` (default 22: every resolution once), and reads the node's own diagnostics
(``rss_mb``, frames published per camera). Needs a ROS 2 environment (rclpy) and a free
ROS_DOMAIN_ID.

Usage: python bench/sim_memory.py [--cameras front left right rear] [--seconds 22]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import rclpy
from diagnostic_msgs.msg import DiagnosticArray


def run(cameras: list[str], seconds: float) -> tuple[float, dict[str, str]]:
    """Peak rss_mb and the last status values of a sensor_sim with ``cameras`` ([] = the single one)."""
    namespace = f"/simmem_{os.getpid()}_{len(cameras)}"
    args = ["-p", f"cameras:=[{', '.join(cameras)}]"] if cameras else []
    proc = subprocess.Popen([sys.executable, "-m", "dynnet_ros.nodes.sensor_sim", "--ros-args", "-r",
                             f"__ns:={namespace}", *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    node = rclpy.create_node("sim_memory_probe")
    peak, last = 0.0, {}

    def on_diag(msg: DiagnosticArray) -> None:
        nonlocal peak, last
        for status in msg.status:
            if status.hardware_id.startswith(namespace):
                last = {kv.key: kv.value for kv in status.values}
                peak = max(peak, float(last["rss_mb"]))

    node.create_subscription(DiagnosticArray, "/diagnostics", on_diag, 10)
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            rclpy.spin_once(node, timeout_sec=0.2)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        node.destroy_node()
    return peak, last


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cameras", nargs="+", default=["front", "left", "right", "rear"])
    parser.add_argument("--seconds", type=float, default=22.0)
    args = parser.parse_args()
    os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")   # the probe and the simulator stay on loopback
    rclpy.init()
    print("| cameras | peak RSS | frames published per camera |\n|---|---|---|")
    runs: list[list[str]] = [[], args.cameras]
    for cameras in runs:
        peak, last = run(cameras, args.seconds)
        counts = {k.split(".")[1]: v for k, v in last.items() if k.startswith("camera.") and
                  k.endswith(".frames_published")} or {"camera": last.get("frames_published", "-")}
        print(f"| {len(cameras) or 1} | {peak:.1f} MB | {', '.join(f'{k} {v}' for k, v in counts.items())} |")
    print(f"\n{args.seconds:g} s each; load average {os.getloadavg()[0]:.1f}, {os.cpu_count()} CPUs")
    rclpy.shutdown()


if __name__ == "__main__":
    main()
