"""The `dynnet` command: one sub-command per module in `dynnet_ros.commands`.

Each command's arguments are ``commands/parsers/NAME.py`` (``NAME``, ``HELP``,
``add_arguments(parser)``) and its implementation ``commands/NAME.py`` (``run(args) -> int``);
``commands.SUMMARIES`` lists them with their help line. Only the parser of the command named is
imported, and its implementation only when it runs: ``dynnet --help`` loads no command,
``dynnet CMD --help`` none of CMD's machinery, and ``dynnet up`` does not load the engine, the
mapper or the other commands.

Errors take one path: argparse rejects what the argument types (``commands/arguments.py``)
refuse, printing the sub-command's usage and one ``dynnet SUB: error: …`` line; what a command
can only check once it runs (``CommandError``, ``ValueError``, ``OSError``) is that one line
alone. Both exit with status 2.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from types import ModuleType

from dynnet_ros import commands
from dynnet_ros.commands import CommandError, parsers


def command_module(name: str) -> ModuleType:
    """The implementation of sub-command ``name`` (one of ``commands.SUMMARIES``): its ``run``."""
    return importlib.import_module(f"{commands.__name__}.{name}")


def parser_module(name: str) -> ModuleType:
    """The arguments of sub-command ``name``: its ``NAME``, ``HELP`` and ``add_arguments``."""
    return importlib.import_module(f"{parsers.__name__}.{name}")


class SubcommandParser(argparse.ArgumentParser):
    """A sub-command's parser that rejects arguments it does not know itself.

    argparse hands a sub-parser's leftovers back to the top-level parser, which would report
    them under ``dynnet``'s usage; raising here names the sub-command whose flag was wrong."""

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace, extras


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The CLI's parser. With ``argv``, only the parser of the command it names is imported and
    given its arguments (the others are listed by their help line); without, every command's is."""
    parser = argparse.ArgumentParser(
        prog="dynnet",
        description="Analyse, plan, benchmark and run dynamic-shape DNNs under a memory budget (dynnet_ros).")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=SubcommandParser)
    chosen = argv[0] if argv else None
    for name, summary in commands.SUMMARIES.items():
        if argv is not None and name != chosen:
            sub.add_parser(name, help=summary, description=summary)
            continue
        module = parser_module(name)
        cmd = sub.add_parser(module.NAME, help=module.HELP, description=module.HELP)
        module.add_arguments(cmd)
        cmd.set_defaults(_command=name)
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
        argv = sys.argv[1:] if argv is None else argv
        args = build_parser(argv).parse_args(argv)
    except SystemExit as exc:  # argparse has printed the usage and the error line (or the help)
        return exc.code if isinstance(exc.code, int) else 2
    try:
        return int(command_module(args._command).run(args) or 0)
    except (CommandError, ValueError, OSError) as exc:
        print(error_line(args._prog, exc), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
