"""`dynnet map ACTION`'s arguments; its implementation is dynnet_ros.commands.map.

Each action's arguments are a module ``parsers/map_<action>.py`` defining ``ACTION``, ``HELP``
and ``add_arguments(parser)``; its implementation is ``commands/map_<action>.py`` with
``run(args) -> int``. Discovering them keeps this file stable while actions are added.
"""
from __future__ import annotations

import argparse
import importlib
import pkgutil
from types import ModuleType

from dynnet_ros.commands import parsers

NAME = "map"
HELP = "Map-and-Conquer: multi-exit stages on several compute units (stages, run, profile, search, show)"
_PREFIX = "map_"


def action_modules() -> list[ModuleType]:
    """The ``parsers/map_*`` modules that define an action, sorted by action name."""
    found = []
    for info in pkgutil.iter_modules(parsers.__path__):
        if info.name.startswith(_PREFIX):
            module = importlib.import_module(f"{parsers.__name__}.{info.name}")
            if hasattr(module, "ACTION"):
                found.append(module)
    return sorted(found, key=lambda m: m.ACTION)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="map_action", required=True, metavar="ACTION")
    for module in action_modules():
        action = sub.add_parser(module.ACTION, help=module.HELP, description=module.HELP)
        module.add_arguments(action)
        action.set_defaults(_map_module=module.__name__.rpartition(".")[2])
