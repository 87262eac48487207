"""Argument types of the `dynnet` sub-commands.

Each function parses one command-line value or raises ``argparse.ArgumentTypeError`` with the
reason. Given as ``type=`` they make argparse reject bad input while it parses — before a
command builds a model or starts a worker — with the sub-command's usage and the argument's
name (``dynnet swap bench: error: argument --size: …``, exit status 2). The types a supervisor's
own arguments need are in ``basic_arguments`` (no engine, no mapper) and re-exported here.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from dynnet_ros.commands import CommandError
from dynnet_ros.commands.basic_arguments import _argument_error, _Error, _integer
from dynnet_ros.commands.basic_arguments import bag_output as bag_output
from dynnet_ros.commands.basic_arguments import existing_dir as existing_dir
from dynnet_ros.commands.basic_arguments import ros_namespace as ros_namespace
from dynnet_ros.commands.basic_arguments import tcp_port as tcp_port
from dynnet_ros.engine.modelio.models import input_specs, load_model
from dynnet_ros.mapper.runtime_cache import read_costs_file
from dynnet_ros.mapper.system_model import RuntimeCosts
from dynnet_ros.sim.frames import parse_resolution
from dynnet_ros.sim.rig import DEMO_CAMERAS
from dynnet_ros.zoo import MODEL_NAMES

#: Model inputs the nodes feed are padded to multiples of this (``ModelNode.input_multiple``);
#: the zoo models need it (five stride-2 stages).
INPUT_MULTIPLE = 32



def model_spec(text: str) -> str:
    """``zoo:NAME`` of a known zoo model (built later, by the command) or a readable ONNX file."""
    if text.startswith("zoo:"):
        if text[4:] not in MODEL_NAMES:
            raise _Error(f"unknown zoo model {text[4:]!r}; choose one of {', '.join(MODEL_NAMES)}")
        return text
    if not os.path.exists(text):
        raise _Error(f"model file not found: {text} (give an .onnx file or zoo:NAME)")
    if not os.path.isfile(text):
        raise _Error(f"{text} is not a file (give an .onnx file or zoo:NAME)")
    if os.path.getsize(text) == 0:
        raise _Error(f"{text} is empty (0 bytes), not an ONNX model")
    try:
        proto = load_model(text, check=False, external_data=False)
    except ValueError as exc:
        raise _Error(str(exc)) from None
    if not proto.graph.node:
        raise _Error(f"{text} has no graph nodes: not an ONNX model")
    return text




def positive_int(text: str) -> int:
    """An integer >= 1 (counts: iterations, repeats, threads)."""
    return _integer(text, 1, ">= 1")


def nonnegative_int(text: str) -> int:
    """An integer >= 0."""
    return _integer(text, 0, ">= 0")






def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise _Error(f"{text!r} is not a number") from None


def positive_float(text: str) -> float:
    """A finite number > 0 (durations)."""
    value = _number(text)
    if not value > 0 or value == float("inf"):
        raise _Error(f"{text} must be a positive number")
    return value


def input_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """``NAME=1x3x480x640`` → (name, dims), every dim >= 1."""
    name, sep, dims = text.partition("=")
    try:
        shape = tuple(int(d) for d in dims.lower().replace(",", "x").split("x"))
    except ValueError:
        shape = ()
    if not sep or not name.strip() or not shape or min(shape) < 1:
        raise _Error(f"{text!r}: expected NAME=D0xD1x... with dims >= 1 (e.g. image=1x3x480x640)")
    return name.strip(), shape


def divisor(text: str) -> tuple[str, int]:
    """``SYM=32`` → (symbol, divisor >= 1)."""
    name, sep, value = text.partition("=")
    if not sep or not name.strip() or not value.strip().isdigit() or int(value) < 1:
        raise _Error(f"{text!r}: expected SYM=INT with INT >= 1 (e.g. H=32)")
    return name.strip(), int(value)


def image_size(text: str) -> tuple[int, int]:
    """``HxW``, both positive multiples of ``INPUT_MULTIPLE``."""
    match = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", text)
    if not match:
        raise _Error(f"{text!r}: expected HxW (e.g. 480x640)")
    height, width = int(match.group(1)), int(match.group(2))
    if min(height, width) < 1 or height % INPUT_MULTIPLE or width % INPUT_MULTIPLE:
        raise _Error(f"{height}x{width}: H and W must be positive multiples of {INPUT_MULTIPLE} "
                     "(the input sizes the nodes feed)")
    return height, width


def image_sizes(text: str) -> list[tuple[int, int]]:
    """``HxW[,HxW...]``, each as ``image_size``."""
    items = [item for item in text.split(",") if item.strip()]
    if not items:
        raise _Error(f"{text!r}: expected HxW[,HxW...]")
    return [image_size(item) for item in items]


def budget_spec(text: str) -> str:
    """``P%`` with 0 <= P <= 100 (room for P % of the weights) or ``N`` / ``NMB`` with N > 0."""
    spec = text.strip()
    number = spec[:-1] if spec.endswith("%") else spec[:-2] if spec.lower().endswith("mb") else spec
    try:
        value = float(number)
    except ValueError:
        raise _Error(f"{spec!r}: use P% (0..100) or N / NMB (e.g. 25%, 60MB)") from None
    if spec.endswith("%"):
        if not 0 <= value <= 100:
            raise _Error(f"{spec}: a share of the weights must be between 0% and 100%")
    elif not 0 < value < float("inf"):
        raise _Error(f"{spec}: a budget in MB must be positive")
    return spec


def budget_list(text: str) -> list[str]:
    """Comma-separated ``budget_spec`` values, at least one."""
    items = [item for item in text.split(",") if item.strip()]
    if not items:
        raise _Error(f"{text!r}: give at least one budget (e.g. 100%,50%,25%)")
    return [budget_spec(item) for item in items]


def output_file(text: str) -> Path:
    """A file to write: its directory must exist, and the path must not be a directory."""
    path = Path(text)
    if path.is_dir():
        raise _Error(f"{text} is a directory, expected a file name")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise _Error(f"{text}: directory {parent} does not exist")
    return path




def camera_resolutions(text: str) -> tuple[str, ...]:
    """``WIDTHxHEIGHT[,WIDTHxHEIGHT...]`` (the simulator's resolution schedule), each 16..8192."""
    items = tuple(item.strip() for item in text.split(",") if item.strip())
    if not items:
        raise _Error(f"{text!r}: expected WIDTHxHEIGHT[,WIDTHxHEIGHT...] (e.g. 320x240,640x480)")
    for item in items:
        try:
            parse_resolution(item)
        except ValueError as exc:
            raise _Error(str(exc)) from None
    return items


def output_dir(text: str) -> Path:
    """A directory to write into (created if missing): must not be an existing file."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise _Error(f"{text} exists and is not a directory")
    return path




def fraction(text: str) -> float:
    """A number in [0, 1] (shares: an accuracy drop, a feature-reuse cap)."""
    value = _number(text)
    if not 0.0 <= value <= 1.0:
        raise _Error(f"{text} must be between 0 and 1")
    return value




def existing_file(text: str) -> Path:
    """A file that exists."""
    path = Path(text)
    if not path.is_file():
        raise _Error(f"{text}: no such file")
    return path


def runtime_costs(text: str) -> tuple[str, RuntimeCosts]:
    """``none`` (the paper's model: no runtime costs) or a JSON file of runtime costs
    (``mapper.runtime_cache.read_costs_file``); (where they came from, the costs)."""
    if text == "none":
        return "--runtime-costs none", RuntimeCosts()
    return f"--runtime-costs {text}", _argument_error(read_costs_file, Path(text))


def check_input_shapes(model_path: str, shapes: list[tuple[str, tuple[int, ...]]]) -> None:
    """``--input-shape`` values against the model's inputs (names, ranks, static dims), before
    any analysis or planning: a mismatch is the user's, so it is a ``CommandError``."""
    specs = {spec.name: spec for spec in input_specs(load_model(model_path, check=False, external_data=False))}
    for name, dims in shapes:
        spec = specs.get(name)
        if spec is None:
            raise CommandError(f"argument --input-shape: the model has no input {name!r}; "
                               f"its inputs: {', '.join(specs) or 'none'}")
        if len(dims) != spec.rank:
            raise CommandError(f"argument --input-shape: {name} has rank {spec.rank} "
                               f"({spec.describe()}), got {len(dims)} dims")
        fixed = [(axis, want, got) for axis, (want, got) in enumerate(zip(spec.dims, dims))
                 if isinstance(want, int) and want != got]
        if fixed:
            axis, want, got = fixed[0]
            raise CommandError(f"argument --input-shape: {name} dim {axis} is fixed at {want} "
                               f"({spec.describe()}), got {got}")


def camera_count(text: str) -> int:
    """How many simulated cameras (1..8: ``sim.rig.DEMO_CAMERAS`` in order)."""
    count = positive_int(text)
    if count > len(DEMO_CAMERAS):
        raise _Error(f"simulate 1 to {len(DEMO_CAMERAS)} cameras, got {count}")
    return count
