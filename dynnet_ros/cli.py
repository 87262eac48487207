"""The `dynnet` command: one sub-command per module in `dynnet_ros.commands`.

Each command module defines ``NAME``, ``HELP``, ``add_arguments(parser)`` and
``run(args) -> int``. Discovery keeps this file stable while commands are added.
"""
from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from types import ModuleType

from dynnet_ros import commands
from dynnet_ros.commands import CommandError


def _command_modules() -> list[ModuleType]:
    modules = []
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{commands.__name__}.{info.name}")
        if hasattr(module, "NAME") and hasattr(module, "run"):
            modules.append(module)
    return modules


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dynnet",
        description="Analyse, plan, benchmark and run dynamic-shape DNNs under a memory budget (dynnet_ros).")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in _command_modules():
        cmd = sub.add_parser(module.NAME, help=module.HELP, description=module.HELP)
        module.add_arguments(cmd)
        cmd.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args._run(args) or 0)
    except (CommandError, ValueError, FileNotFoundError) as exc:
        print(f"dynnet {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
