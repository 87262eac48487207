"""`dynnet analyze`'s arguments; its implementation is dynnet_ros.commands.analyze."""
from __future__ import annotations

import argparse

from dynnet_ros.commands import arguments

NAME = "analyze"
HELP = "symbolic rank/dimension propagation (RDP) of an ONNX model"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", nargs="?", type=arguments.model_spec, help="path to an .onnx model, or zoo:NAME")
    parser.add_argument("--input-shape", action="append", default=[], type=arguments.input_shape,
                        metavar="NAME=1x3x480x640", help="pin an input's shape (repeatable)")
    parser.add_argument("--divisor", action="append", default=[], type=arguments.divisor, metavar="SYM=32",
                        help="declare an input symbol a multiple of an int (repeatable)")
    parser.add_argument("--json", type=arguments.output_file, metavar="FILE",
                        help="write the RDP JSON (the contract in docs/rdp.md) to FILE")
    parser.add_argument("--ops", action="store_true", help="print the operator classification table")
    parser.add_argument("--markdown", action="store_true", help="with --ops: print it as Markdown")
    parser.add_argument("--top", type=arguments.nonnegative_int, default=10,
                        help="unresolved tensors to list (default 10)")
