"""`dynnet demo`'s arguments; its implementation is dynnet_ros.commands.demo."""
from __future__ import annotations

import argparse
from pathlib import Path

from dynnet_ros.commands import arguments

NAME = "demo"
HELP = "run the vehicle graph with the simulator (or on a bag) for a while; live table + demo-report/ (JSON, PNG)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--duration", type=arguments.positive_float, default=30.0, metavar="S",
                        help="seconds to run once every model node serves (default 30; starting the nodes "
                             "comes first and is not counted)")
    parser.add_argument("--report", type=arguments.output_dir, default=Path("demo-report"), help="report directory")
    parser.add_argument("--config", type=arguments.existing_file, default=None,
                        help="graph description (default: vehicle.yaml)")
    parser.add_argument("--no-live", action="store_true", help="no live table (plain progress lines instead)")
    parser.add_argument("--bag", default=None, metavar="BAG",
                        help="play this bag in a loop instead of running the simulator (as `dynnet replay --loop`)")
    parser.add_argument("--namespace", type=arguments.ros_namespace, default="", metavar="NS",
                        help="run the graph under this ROS namespace (as `dynnet up --namespace`)")
    parser.add_argument("--cameras", type=arguments.camera_count, default=1, metavar="N",
                        help="simulate N cameras (1-8: front, left, right, rear, front_left, front_right, rear_left, "
                             "rear_right), each model node serving them all (default 1: one camera on camera/)")

