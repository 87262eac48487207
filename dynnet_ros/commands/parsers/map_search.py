"""`dynnet map search`'s arguments; its implementation is dynnet_ros.commands.map_search."""
from __future__ import annotations

import argparse

from dynnet_ros.commands import arguments
from dynnet_ros.mapper.search import PREFER

ACTION = "search"
HELP = "NSGA-II search of unit, DVFS level and exit thresholds per stage; Pareto set, plot, mapping file"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", nargs="?", type=arguments.model_spec, default=None,
                        help="ONNX file or zoo:NAME with exits (omit with --profile)")
    parser.add_argument("--profile", action="append", default=[], metavar="FILE",
                        help="profile-only search of a layer-group chain: a CSV or UNIT[@DVFS]=trtexec.json "
                             "(repeatable)")
    parser.add_argument("--hw", default="this-machine", help="hardware: this-machine[:N], a preset, or a YAML file")
    parser.add_argument("--size", type=arguments.image_size, default=(128, 128), help="input size HxW (model search)")
    parser.add_argument("--frames", type=arguments.positive_int, default=32, help="calibration frames")
    parser.add_argument("--calibration", type=arguments.existing_file, default=None, metavar="FILE.npz",
                        help="calibration inputs (one array per model input, frames first)")
    parser.add_argument("--repeats", type=arguments.positive_int, default=10, help="profiling runs per point")
    parser.add_argument("--no-layers", action="store_true", help="profile whole stages only (faster)")
    parser.add_argument("--width", type=arguments.positive_int, default=None, metavar="STAGES",
                        help="search the paper's width split (P, I) into STAGES stages instead of the model's "
                             "depth-wise exits; each distinct split is built and calibrated (seconds each)")
    parser.add_argument("--reuse-cap", type=arguments.fraction, default=None,
                        help="width split: largest share of the reusable features that may be reused (0..1)")
    parser.add_argument("--deadline-ms", type=arguments.positive_float, default=None,
                        help="latency of a frame that runs to the last exit must not exceed this")
    parser.add_argument("--prefer", choices=PREFER, default="balanced", help="the pick rule (default balanced)")
    parser.add_argument("--max-accuracy-drop", type=arguments.fraction, default=0.01,
                        help="largest accepted drop in agreement with the final exit (default 0.01)")
    parser.add_argument("--generations", type=arguments.positive_int, default=30, help="the paper: 200")
    parser.add_argument("--population", type=arguments.positive_int, default=40, help="the paper: 60")
    parser.add_argument("--seed", type=arguments.nonnegative_int, default=0)
    parser.add_argument("--measure", action="store_true",
                        help="run the pick and the baselines in the stage runtime on the calibration frames: "
                             "measured vs predicted")
    parser.add_argument("--runtime-costs", type=arguments.runtime_costs, default=None, metavar="FILE|none",
                        help="runtime costs to predict with: a JSON file (dispatch_ms, contention, slowdown, "
                             "handoff_ms) or none (the paper's model); default: those the last --measure run "
                             "fitted on this hardware, if any")
    parser.add_argument("--memory-mb", action="append", default=[], metavar="UNIT=MB",
                        help="memory a unit may hold for this model's stages (e.g. the budget manager's share; "
                             "repeatable; default: the hardware file's memory_mb)")
    parser.add_argument("--allow-slower-than-one-stage", action="store_true",
                        help="keep the rule's pick even when it is predicted slower than every stage on the fastest "
                             "single unit (by default the search then picks that single unit: stages do not pay)")
    parser.add_argument("--json", type=arguments.output_file, default=None, metavar="OUT")
    parser.add_argument("--png", type=arguments.output_file, default=None, metavar="FILE")
    parser.add_argument("--mapping", type=arguments.output_file, default=None, metavar="FILE.yaml",
                        help="write the pick as a mapping file for the runtime (model search)")
