"""`dynnet map exits`'s arguments; its implementation is dynnet_ros.commands.map_exits."""
from __future__ import annotations

import argparse
from pathlib import Path

from dynnet_ros.commands import _map_arguments, arguments

ACTION = "exits"
HELP = ("learn early exits for MODEL from your own frames (a bag or a directory of images; the target is "
        "the model's own output, no labels) and write the model with them")


#: what --task accepts: a model's exits read as detections, masks or classes, or "auto" from its outputs
TASKS = ("auto", "detector", "segmenter", "classifier")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _map_arguments.add_model(parser)
    parser.add_argument("--frames", type=Path, default=None, metavar="BAG_OR_DIR",
                        help="a bag (dynnet sim --record writes one) or a directory of images (required)")
    parser.add_argument("--topic", default=None, help="the bag's sensor_msgs/Image topic (default: its only one)")
    parser.add_argument("--count", type=arguments.positive_int, default=64, metavar="N",
                        help="at most N frames, spread over the source (default 64)")
    parser.add_argument("--at", default="auto", metavar="auto|TENSOR,…",
                        help="where the heads read: auto (cheap legal cut points) or tensor names, comma-separated")
    parser.add_argument("--exits", type=arguments.positive_int, default=1, metavar="N",
                        help="with --at auto: how many early exits (default 1)")
    parser.add_argument("--task", choices=TASKS, default="auto",
                        help="what the model's output is (default: decided by the perception formats)")
    parser.add_argument("--size", type=arguments.image_size, default=(320, 320), metavar="HxW",
                        help="box a dynamic-size model's frames are fitted into (default 320x320)")
    parser.add_argument("--score-threshold", type=arguments.fraction, default=0.25,
                        help="detector: the class score at which the model reports a box (default 0.25)")
    parser.add_argument("--held-out", type=arguments.fraction, default=0.3,
                        help="share of the frames kept for the report, not for fitting (default 0.3)")
    parser.add_argument("--out", type=arguments.output_file, default=None, metavar="EXITS.onnx",
                        help="the model with its exits (required); run it with `map stages`/`map run`/`map search` "
                             "or as a node's model with `mapping: auto`")
    _map_arguments.add_json(parser, "the held-out report")
