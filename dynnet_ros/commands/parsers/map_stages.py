"""`dynnet map stages`'s arguments; its implementation is dynnet_ros.commands.map_stages."""
from __future__ import annotations

import argparse

from dynnet_ros.commands import _map_arguments, arguments

ACTION = "stages"
HELP = "cut MODEL into stages (depth-wise at its exits, or width-wise by P and I) and write them to DIR"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _map_arguments.add_model(parser)
    parser.add_argument("--partition", type=arguments.existing_file, default=None, metavar="P.yaml",
                        help="partition file (docs/mapper.md); default: depth-wise at the model's own exits")
    parser.add_argument("--out", type=arguments.output_dir, default=None, metavar="DIR",
                        help="directory for stage_<k>.onnx and stages.json (created; required)")
    _map_arguments.add_scenes(parser, "--calibration", 32, (96, 128),
                              "that fit a width split's probe exits and measure its agreement")
    _map_arguments.add_json(parser, "the summary")
