"""`dynnet map ACTION`: Map-and-Conquer stages, runs, profiles and searches.

Each action is a module ``commands/map_<action>.py`` defining ``ACTION``, ``HELP``,
``add_arguments(parser)`` and ``run(args) -> int`` (and no ``NAME``, so the top-level discovery
in ``cli.py`` leaves them to this command). Discovering them keeps this file stable while actions
are added.
"""
from __future__ import annotations

import argparse
import importlib
import pkgutil
from types import ModuleType

from dynnet_ros import commands

NAME = "map"
HELP = "Map-and-Conquer: multi-exit stages on several compute units (stages, run, profile, search, show)"
_PREFIX = "map_"


def action_modules() -> list[ModuleType]:
    """The ``map_*`` modules that define an action, sorted by action name."""
    found = []
    for info in pkgutil.iter_modules(commands.__path__):
        if not info.name.startswith(_PREFIX):
            continue
        module = importlib.import_module(f"{commands.__name__}.{info.name}")
        if hasattr(module, "ACTION") and hasattr(module, "run"):
            found.append(module)
    return sorted(found, key=lambda m: m.ACTION)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="map_action", required=True, metavar="ACTION")
    for module in action_modules():
        action = sub.add_parser(module.ACTION, help=module.HELP, description=module.HELP)
        module.add_arguments(action)
        action.set_defaults(_map_run=module.run)


def run(args: argparse.Namespace) -> int:
    return int(args._map_run(args) or 0)
