"""Arguments `dynnet map run` and `dynnet map stages` share: the model, synthetic road scenes,
the JSON summary, and the options they require but check in ``run()`` (so that an unknown flag
is reported before a missing required one)."""
from __future__ import annotations

import argparse
from typing import Any

from dynnet_ros.commands import CommandError, arguments


def add_model(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", type=arguments.model_spec, help="ONNX file or zoo:NAME")


def add_scenes(parser: argparse.ArgumentParser, flag: str, count: int, size: tuple[int, int], purpose: str) -> None:
    """``FLAG N`` synthetic scenes of mixed difficulty, for ``purpose``, at ``--size HxW``."""
    parser.add_argument(flag, type=arguments.positive_int, default=count, metavar="N",
                        help=f"synthetic scenes of mixed difficulty {purpose} (default {count})")
    parser.add_argument("--size", type=arguments.image_size, default=size, metavar="HxW",
                        help=f"synthetic scene size (default {size[0]}x{size[1]})")


def add_json(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--json", type=arguments.output_file, default=None, metavar="FILE",
                        help=f"also write {what} as JSON")


def required(value: Any, flag: str, metavar: str, hint: str) -> Any:
    """``value``, or a CommandError like argparse's for a missing ``flag`` (``hint``: what to give)."""
    if value is None:
        raise CommandError(f"argument {flag}: {hint} ({flag} {metavar})")
    return value
