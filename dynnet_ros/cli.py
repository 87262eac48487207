"""The `dynnet` command: one sub-command per module in `dynnet_ros.commands`.

Each command module defines ``NAME``, ``HELP``, ``add_arguments(parser)`` and
``run(args) -> int``. Discovery keeps this file stable while commands are added.

Errors take one path: argparse rejects what the argument types (``commands/arguments.py``)
refuse, printing the sub-command's usage and one ``dynnet SUB: error: …`` line; what a command
can only check once it runs (``CommandError``, ``ValueError``, ``OSError``) is that one line
alone. Both exit with status 2.
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


class SubcommandParser(argparse.ArgumentParser):
    """A sub-command's parser that rejects arguments it does not know itself.

    argparse hands a sub-parser's leftovers back to the top-level parser, which would report
    them under ``dynnet``'s usage; raising here names the sub-command whose flag was wrong."""

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace, extras


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dynnet",
        description="Analyse, plan, benchmark and run dynamic-shape DNNs under a memory budget (dynnet_ros).")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=SubcommandParser)
    for module in _command_modules():
        cmd = sub.add_parser(module.NAME, help=module.HELP, description=module.HELP)
        module.add_arguments(cmd)
        cmd.set_defaults(_run=module.run)
    for command in command_parsers(parser):  # the innermost one parsed sets it last
        command.set_defaults(_prog=command.prog)
    return parser


def command_parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """Every sub-command's parser below ``parser``, nested ones included (``dynnet swap bench``)."""
    found: list[argparse.ArgumentParser] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):
                found.append(child)
                found.extend(command_parsers(child))
    return found


def error_line(prog: str, exc: BaseException) -> str:
    """``prog: error: reason`` on one line, however many lines the exception's text has."""
    reason = " ".join(line.strip() for line in str(exc).splitlines() if line.strip()) or type(exc).__name__
    return f"{prog}: error: {reason}"


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns the exit status (argparse's own: 0 after --help, 2 on bad input)."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # argparse has printed the usage and the error line (or the help)
        return exc.code if isinstance(exc.code, int) else 2
    try:
        return int(args._run(args) or 0)
    except (CommandError, ValueError, OSError) as exc:
        print(error_line(args._prog, exc), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
