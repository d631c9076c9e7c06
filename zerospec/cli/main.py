"""The ``zerospec`` command line: one parser, each subcommand's options built on demand, bad input
one line and exit 2 (zerospec/__main__.py runs it)."""
from __future__ import annotations

import argparse
import os
import sys

from . import SUBCOMMANDS, UsageError


DESCRIPTION = "zerospec: the ZeRO paper, executable (report, plan, scale, train, paper, demo)."


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)   # `--zero 1` must not mean --zero1-comm
        super().__init__(*args, **kwargs)

    def error(self, message):  # one line, exit 2, no usage dump or traceback
        raise UsageError(message)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser with ``command``'s options, the other subcommands by name and help only: each
    subcommand's options are built on demand, so no answer waits for what another one imports
    (none imports torch to build its options: tests/unit/cli/test_plan.py)."""
    parser = _Parser(prog="zerospec", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, module in SUBCOMMANDS.items():
        if name == command:
            module.add_parser(sub)
        elif command is None:
            sub.add_parser(name, help=module.HELP)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv[0] if argv and argv[0] in SUBCOMMANDS else None)
    try:
        args = parser.parse_args(argv)
        if args.command is None:   # a command is required: help on stderr, exit 2
            parser.print_help(sys.stderr)
            return 2
        return SUBCOMMANDS[args.command].run(args) or 0
    except (UsageError, ValueError) as exc:
        # bad input is one line; ZEROSPEC_DEBUG=1 shows the traceback (a ValueError from deep
        # inside a run would otherwise look like a usage error)
        if os.environ.get("ZEROSPEC_DEBUG"):
            raise
        print(f"zerospec: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("zerospec: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:   # `zerospec … | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0

