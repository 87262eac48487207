"""`dynnet map ACTION`: Map-and-Conquer stages, runs, profiles and searches.

The action's implementation is ``commands/map_<action>.py`` (``run(args) -> int``), imported
only when that action runs; the arguments are in ``commands/parsers/map*.py``.
"""
from __future__ import annotations

import argparse
import importlib

from dynnet_ros import commands


def run(args: argparse.Namespace) -> int:
    return int(importlib.import_module(f"{commands.__name__}.{args._map_module}").run(args) or 0)
