"""`dynnet bench`'s arguments; its implementation is dynnet_ros.commands.bench."""
from __future__ import annotations

import argparse
from dataclasses import dataclass

import numpy as np

from dynnet_ros.commands import arguments
from dynnet_ros.engine.backends import BACKEND_NAMES

NAME = "bench"
HELP = "benchmark the planned engine against plain onnxruntime (fresh process each)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", type=arguments.model_spec, help="ONNX file or zoo:NAME")
    parser.add_argument("--shapes", type=shape_spec, default="224-640:32",
                        help="image sides LO-HI:STEP (H and W drawn from them) or a list HxW,HxW,...; "
                             f"sides are multiples of {arguments.INPUT_MULTIPLE}")
    parser.add_argument("--samples", type=arguments.positive_int, default=50, help="length of the shape sequence")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=arguments.positive_int, default=None,
                        help="intra-op threads for both (default: all cores)")
    parser.add_argument("--steady-runs", type=arguments.nonnegative_int, default=2,
                        help="extra runs per distinct shape after the sequence (steady-state latency)")
    parser.add_argument("--repeats", type=arguments.positive_int, default=1,
                        help="alternate engine/onnxruntime processes this many times; medians are reported")
    parser.add_argument("--engine-backend", choices=BACKEND_NAMES, default="cpu",
                        help="Engine backend for the 'engine' side")
    parser.add_argument("--json", type=arguments.output_file, metavar="FILE", help="write the full results as JSON")
    parser.add_argument("--plot", type=arguments.output_file, metavar="PNG", help="write a side-by-side plot")


@dataclass(frozen=True)


class ShapeSpec:
    """``--shapes``: a list of (H, W) pairs, cycled, or the image sides H and W are drawn from."""

    pairs: tuple[tuple[int, int], ...] = ()
    sides: tuple[int, ...] = ()

    def sequence(self, samples: int, seed: int) -> list[tuple[int, int]]:
        """``samples`` (H, W) pairs: the list cycled, or sides drawn with ``seed``."""
        if samples < 1:
            raise ValueError(f"samples must be >= 1, got {samples}")
        if self.pairs:
            return [self.pairs[i % len(self.pairs)] for i in range(samples)]
        rng = np.random.default_rng(seed)
        return [(int(rng.choice(self.sides)), int(rng.choice(self.sides))) for _ in range(samples)]


def shape_spec(text: str) -> ShapeSpec:
    """``LO-HI:STEP`` (sides LO, LO+STEP, ... <= HI) or ``HxW,HxW,...`` (argparse type)."""
    spec = text.strip()
    if "x" in spec.lower():
        return ShapeSpec(pairs=tuple(arguments.image_sizes(spec)))
    multiple = arguments.INPUT_MULTIPLE
    lohi, _, step_text = spec.partition(":")
    try:
        lo, hi = (int(v) for v in lohi.split("-"))  # ValueError unless exactly two
        step = int(step_text or multiple)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{spec!r}: use LO-HI:STEP (e.g. 224-640:32) or HxW,HxW") from None
    if lo < 1 or step < 1 or hi < lo or lo % multiple or step % multiple:
        raise argparse.ArgumentTypeError(f"{spec}: need 1 <= LO <= HI, with LO and STEP multiples of {multiple}")
    return ShapeSpec(sides=tuple(range(lo, hi + 1, step)))
