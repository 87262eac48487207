"""What one simulated camera frame and one LiDAR scan cost: the CPU a multi-camera sensor_sim needs.

Times ``sim.frames.render_image`` (one camera's frame) per frame size, for the front camera and
a camera yawed 90 degrees, and ``scan_points`` (the LiDAR) covering one camera and four; each
the median of ``--repeat`` frames at successive scene times, printed as docs/ros.md's Markdown
table ("Multi-camera"). A sensor_sim with N cameras at R Hz spends N x R renders a second.

Usage: python bench/sim_render.py [--repeat 20]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

from dynnet_ros.sim.frames import SimSettings, render_image, scan_points

SIZES = ("320x240", "640x480", "1280x720")
FOUR = (0.0, 90.0, -90.0, 180.0)


def median_ms(run: Callable[[int], object], repeat: int) -> float:
    run(0)  # the frame size's noise pattern is drawn once, on first use
    times = []
    for index in range(repeat):
        start = time.perf_counter()
        run(index)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20, help="frames per measurement (default 20)")
    args = parser.parse_args()
    rows = []
    for size in SIZES:
        settings = SimSettings(resolutions=(size,))
        cells = [median_ms(lambda i, s=settings, y=yaw: render_image(s, i, 1.0 + i / 10, y), args.repeat)
                 for yaw in (0.0, 90.0)]
        rows.append(f"| {size} | {cells[0]:.1f} ms | {cells[1]:.1f} ms |")
    lidar = [median_ms(lambda i, y=yaws: scan_points(SimSettings(), i, 1.0 + i / 10, y), args.repeat)
             for yaws in ((0.0,), FOUR)]
    print("| frame | one camera, front | one camera, yawed 90° |\n|---|---|---|")
    print("\n".join(rows))
    print(f"\nLiDAR scan (512 azimuth steps per camera): 1 camera {lidar[0]:.1f} ms, 4 cameras {lidar[1]:.1f} ms")
    print(f"load average {os.getloadavg()[0]:.1f}, {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
