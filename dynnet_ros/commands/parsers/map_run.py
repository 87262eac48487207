"""`dynnet map run`'s arguments; its implementation is dynnet_ros.commands.map_run."""
from __future__ import annotations

import argparse

from dynnet_ros.commands import _map_arguments, arguments

ACTION = "run"
HELP = "run MODEL's stages mapped onto compute units (a mapping file); print the exits taken and stage times"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _map_arguments.add_model(parser)
    parser.add_argument("--mapping", type=arguments.existing_file, default=None, metavar="FILE",
                        help="mapping file: hardware, partition, unit and threshold per stage (docs/mapper.md; "
                             "required)")
    parser.add_argument("--inputs", type=arguments.existing_file, nargs="+", default=None, metavar="FILE.npz",
                        help="frames to run, one .npz per frame with an array per model input "
                             "(default: --frames synthetic road scenes)")
    _map_arguments.add_scenes(parser, "--frames", 8, (224, 320), "to run without --inputs")
    parser.add_argument("--deadline-ms", type=arguments.positive_float, default=None,
                        help="anytime mode: answer with the deepest exit done by then (overrides the file)")
    _map_arguments.add_json(parser, "per-frame results and the summary")
