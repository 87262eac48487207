"""`dynnet plan`'s arguments; its implementation is dynnet_ros.commands.plan."""
from __future__ import annotations

import argparse

from dynnet_ros.commands import arguments

NAME = "plan"
HELP = "show the planned engine's simplification, partitions, order and memory plan for a model"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", type=arguments.model_spec, help="ONNX file or zoo:NAME")
    parser.add_argument("--input-shape", action="append", default=[], type=arguments.input_shape,
                        metavar="NAME=D0xD1x...",
                        help="concrete input shape for the memory plan (repeatable); default: every "
                             "dynamic dim at the planner's reference size")
    parser.add_argument("--granularity", choices=("choose", "auto", "fine", "coarse"), default="choose",
                        help="choose: the planner picks auto or fine by arena lower bound + session cost")
    parser.add_argument("--layout", choices=("nchwc", "as-given"), default="nchwc",
                        help="nchwc (what Engine runs where the CPU has NCHWc kernels): plan onnxruntime's "
                             "blocked-layout rewrite; as-given: plan the model's own graph")
    parser.add_argument("--json", type=arguments.output_file, metavar="FILE", help="write the report as JSON")
    parser.add_argument("--order", action="store_true", help="print the full node execution order")
