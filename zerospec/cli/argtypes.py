"""argparse ``type=`` converters for report and plan: errors name the bad value and what is accepted.

argparse turns an :class:`argparse.ArgumentTypeError` into a one-line usage error (exit code 2 via
``zerospec.__main__``); a plain ValueError would lose our message.
"""
from __future__ import annotations

import argparse
import re

from ..report import plan


def _wrap(parse):
    def convert(text: str):
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    convert.__name__ = parse.__name__
    return convert


count = _wrap(plan.parse_count)
memory = _wrap(plan.parse_bytes)
bandwidth = _wrap(plan.parse_bandwidth)
gpus = _wrap(plan.parse_gpus)


def accept_negative_values(parser: argparse.ArgumentParser) -> None:
    """Let ``--gpu-mem -1GB`` reach our converter (which names the bad value) instead of argparse's
    "expected one argument": argparse treats only plain negative numbers as values. No option of
    ours starts with a digit, so any "-<digit>" token is a value. (A private argparse attribute,
    present in every supported Python; without it the error is merely less specific.)"""
    parser._negative_number_matcher = re.compile(r"^-\.?[0-9]")
    parser._has_negative_number_optionals = []


def positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return n


def positive_float(text: str) -> float:
    """A finite number > 0 (a loss scale, a norm threshold)."""
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not (x > 0 and x != float("inf")):
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text!r}")
    return x


def list_of(parse, what: str):
    return _wrap(lambda text: plan.parse_list(text, parse, what))


def choice_list(choices, what: str):
    """A comma list whose items must be among ``choices`` (order kept, duplicates dropped)."""
    def convert(text: str) -> list[str]:
        items = [t.strip() for t in str(text).split(",") if t.strip()]
        bad = [t for t in items if t not in choices]
        if bad or not items:
            raise argparse.ArgumentTypeError(
                f"unknown {what} {', '.join(map(repr, bad)) or '(none given)'}; accepted: "
                f"{', '.join(choices)}")
        return list(dict.fromkeys(items))
    return convert
