"""`dynnet swap`'s arguments; its implementation is dynnet_ros.commands.swap."""
from __future__ import annotations

import argparse

from dynnet_ros.commands import arguments

NAME = "swap"
HELP = "weights streamed under a memory budget: prepare a weight file, benchmark budgets"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="swap_command", required=True, metavar="ACTION")
    prep = sub.add_parser("prepare", help="write MODEL's weight file for streaming (built on first use otherwise)")
    prep.add_argument("model", type=arguments.model_spec, help="ONNX file or zoo:NAME")
    prep.add_argument("--layout", choices=("nchwc", "as-given"), default="nchwc",
                      help="nchwc: onnxruntime's blocked layout where this CPU has its kernels, else the model "
                           "as given (default); as-given: always the model as given")
    prep.add_argument("--json", type=arguments.output_file, default=None, metavar="FILE",
                      help="write the weight file's summary as JSON")

    bench = sub.add_parser("bench", help="peak memory and latency per budget: streamed vs in-memory vs naive")
    bench.add_argument("model", type=arguments.model_spec, help="ONNX file or zoo:NAME")
    bench.add_argument("--budgets", type=arguments.budget_list, default="100%,50%,25%",
                       help="P%% = room for P%% of the weights (unlimited peak - (1-P)*weights), or N MB")
    sizes = bench.add_mutually_exclusive_group()
    sizes.add_argument("--size", type=arguments.image_size, default=None,
                       help="one input HxW: the full comparison (onnxruntime, in-memory, streamed, naive, A/B)")
    sizes.add_argument("--sizes", type=arguments.image_sizes, default=None,
                       help="the size sweep's input sizes HxW[,HxW...] (default: every padded size the nodes feed "
                            "for 320x240 ... 1920x1080 cameras with max_input_side 640); peak / budget per size, "
                            "rows above 1.05 flagged")
    bench.add_argument("--iters", type=arguments.positive_int, default=8)
    bench.add_argument("--repeats", type=arguments.positive_int, default=1,
                       help="rounds of fresh processes; medians reported")
    bench.add_argument("--threads", type=arguments.positive_int, default=None)
    bench.add_argument("--no-ab", action="store_true",
                       help="skip the same-process A/B latency run (direct onnxruntime vs swapped, alternating)")
    bench.add_argument("--json", type=arguments.output_file, default=None, metavar="FILE")
    bench.add_argument("--png", type=arguments.output_file, default=None, metavar="FILE")
