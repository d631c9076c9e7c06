"""Subcommands: each module has ``HELP`` (its line in ``zerospec --help``), ``add_parser(subparsers)``
and ``run(args) -> int``.

To add one, write ``zerospec/cli/<name>.py`` and list it in ``SUBCOMMANDS`` below.
"""
from __future__ import annotations

from . import demo, paper, plan, report, scale, train
from .argtypes import UsageError


__all__ = ["SUBCOMMANDS", "UsageError"]

SUBCOMMANDS = {"report": report, "plan": plan, "demo": demo, "scale": scale, "train": train,
               "paper": paper}
