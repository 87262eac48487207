"""`dynnet map show`'s arguments; its implementation is dynnet_ros.commands.map_show."""
from __future__ import annotations

import argparse

from dynnet_ros.commands import arguments

ACTION = "show"
HELP = "print a `dynnet map search --json` result: the pick, the baselines and the Pareto set"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("result", nargs="?", type=arguments.existing_file, default=None,
                        help="the JSON `dynnet map search --json` wrote")
    parser.add_argument("--limit", type=arguments.positive_int, default=20, help="Pareto rows shown (default 20)")
