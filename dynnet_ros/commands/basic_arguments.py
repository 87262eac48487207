"""The argument types that need nothing beyond the standard library and the graph config.

`dynnet up` parses its arguments with these and stays free of the engine and the mapper that
``arguments`` (which re-exports them) imports for model and cost-file arguments.
"""
from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from dynnet_ros.bags.paths import check_output
from dynnet_ros.graph_config import validate_namespace

_Error = argparse.ArgumentTypeError
_In = TypeVar("_In")
_Out = TypeVar("_Out")


def _integer(text: str, low: int, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise _Error(f"{text!r} is not an integer") from None
    if value < low:
        raise _Error(f"{value} must be {what}")
    return value


def tcp_port(text: str) -> int:
    """A TCP port, 0..65535 (0 = any free port)."""
    port = _integer(text, 0, ">= 0")
    if port > 65535:
        raise _Error(f"{port} is not a TCP port (0..65535)")
    return port


def _argument_error(check: Callable[[_In], _Out], value: _In) -> _Out:
    """``check(value)``, its ValueError reported as argparse reports a refused argument."""
    try:
        return check(value)
    except ValueError as exc:
        raise _Error(str(exc)) from None


def bag_output(text: str) -> Path:
    """A bag to create: a new ``.mcap`` file or rosbag2 directory in a writable directory."""
    return _argument_error(check_output, text)


def existing_dir(text: str) -> Path:
    """A directory that exists."""
    path = Path(text)
    if not path.is_dir():
        raise _Error(f"{text}: no such directory")
    return path


def ros_namespace(text: str) -> str:
    """A ROS namespace: '' (none) or /name[/name...]; a missing leading slash is added."""
    return _argument_error(validate_namespace, text)
