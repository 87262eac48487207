"""`dynnet map profile`'s arguments; its implementation is dynnet_ros.commands.map_profile."""
from __future__ import annotations

import argparse

from dynnet_ros.commands import arguments

ACTION = "profile"
HELP = "measure each stage and layer on each unit (or import CSV / trtexec --exportProfile files)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", nargs="?", type=arguments.model_spec, default=None,
                        help="ONNX file or zoo:NAME with exits (omit with --import)")
    parser.add_argument("--hw", default="this-machine",
                        help="hardware: this-machine[:N], a preset (jetson-agx-orin, jetson-agx-xavier) or a YAML file")
    parser.add_argument("--sizes", type=arguments.image_sizes, default=[(64, 64), (128, 128)],
                        help="input sizes HxW[,HxW...] (default 64x64,128x128)")
    parser.add_argument("--repeats", type=arguments.positive_int, default=10, help="timed runs per point (median)")
    parser.add_argument("--no-layers", action="store_true", help="whole stages only (no per-layer rows)")
    parser.add_argument("--import", dest="imports", action="append", default=[], metavar="FILE",
                        help="a profile CSV or UNIT[@DVFS]=trtexec.json (repeatable); combined into --out")
    parser.add_argument("--out", type=arguments.output_file, default=None, metavar="FILE.csv",
                        help="write the profile CSV here (also cached under DYNNET_MAP_DIR)")
    parser.add_argument("--json", type=arguments.output_file, default=None, metavar="FILE",
                        help="summary as JSON: rows, units, power source, surrogate accuracy per unit")
