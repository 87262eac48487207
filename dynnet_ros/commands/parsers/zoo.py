"""`dynnet zoo`'s arguments; its implementation is dynnet_ros.commands.zoo."""
from __future__ import annotations

import argparse

from dynnet_ros.commands import arguments

NAME = "zoo"
HELP = "build the deterministic demo models (lane, pedestrian, depth, gated, multiexit) and show their size"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="zoo_command", required=True, metavar="ACTION")
    build = sub.add_parser("build", help="build all models into the cache (or --out DIR)")
    build.add_argument("--out", type=arguments.output_dir, default=None,
                       help="output directory (default: $DYNNET_ZOO_DIR or ~/.cache/dynnet_ros/zoo)")
    build.add_argument("--force", action="store_true", help="rebuild even when the cached files are current")
    build.add_argument("--json", type=arguments.output_file, default=None, metavar="FILE",
                       help="also write the table as JSON")
    info = sub.add_parser("info", help="print params, weight MB and GFLOPs at 640x480 (builds in memory)")
    info.add_argument("--json", type=arguments.output_file, default=None, metavar="FILE",
                      help="also write the table as JSON")
    info.add_argument("--latency", action="store_true",
                      help="also measure onnxruntime CPU latency at 640x480 (median of --runs)")
    info.add_argument("--threads", type=arguments.positive_int, default=2,
                      help="intra-op threads for --latency (default 2)")
    info.add_argument("--runs", type=arguments.positive_int, default=10,
                      help="timed runs per model for --latency (default 10)")
