"""`dynnet up`'s arguments; its implementation is dynnet_ros.commands.up."""
from __future__ import annotations

import argparse
from pathlib import Path

from dynnet_ros.commands.basic_arguments import bag_output, existing_dir, ros_namespace, tcp_port
from dynnet_ros.view import DEFAULT_PORT

NAME = "up"
HELP = "start the vehicle graph (config/vehicle.yaml): its processes and containers; Ctrl-C stops it"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, default=None,
                        help="graph description (default: the package's config/vehicle.yaml)")
    parser.add_argument("--duration", type=float, default=None, metavar="S",
                        help="stop the graph after S seconds (default: run until Ctrl-C)")
    parser.add_argument("--no-sim", action="store_true", help="do not start the simulator nodes (sim: true)")
    parser.add_argument("--namespace", type=ros_namespace, default="", metavar="NS",
                        help="run every node (and its topics, except /diagnostics) under this ROS namespace")
    parser.add_argument("--foxglove", action="store_true",
                        help=f"also serve the camera, lane mask, depth image and pedestrian boxes to Foxglove Studio "
                             f"on ws://127.0.0.1:{DEFAULT_PORT} (docs/ros.md, 'Live view in Foxglove')")
    parser.add_argument("--foxglove-port", type=tcp_port, default=None, metavar="P",
                        help=f"port of the --foxglove WebSocket, bound to 127.0.0.1 only (default {DEFAULT_PORT}; "
                             "0 = any free port, logged)")
    parser.add_argument("--record", type=bag_output, default=None, metavar="OUT",
                        help="record the graph's inputs and every output topic: OUT.mcap = one MCAP file, any other "
                             "name = a rosbag2 directory; finalised when the graph stops (docs/bags.md)")
    parser.add_argument("--memory-root", type=existing_dir, default=Path("/"), metavar="DIR",
                        help="directory whose proc/vmstat, proc/pressure/memory and proc/meminfo tell an OOM kill "
                             "from another SIGKILL (default /; a host's /proc mounted elsewhere, or a prepared tree)")
