"""argparse ``type=`` converters for report and plan: errors name the bad value and what is accepted.

argparse turns an :class:`argparse.ArgumentTypeError` into a one-line usage error (exit code 2 via
``zerospec.__main__``); a plain ValueError would lose our message.
"""
from __future__ import annotations

import argparse
import re

from . import parse as P


class UsageError(Exception):
    """Bad command-line input: printed as one line, exit code 2."""


def _wrap(parse):
    def convert(text: str):
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    convert.__name__ = parse.__name__
    return convert


count = _wrap(P.parse_count)
memory = _wrap(P.parse_bytes)
bandwidth = _wrap(P.parse_bandwidth)
gpus = _wrap(P.parse_gpus)


def layer_count(text: str) -> int:
    """A parameter count that may be 0 (``--largest-layer``: 0 means "not counted", its default)."""
    if re.fullmatch(r"0+(\.0*)?(e[+-]?\d+)?\s*[KMBGT]?", str(text).strip(), re.IGNORECASE):
        return 0
    try:
        return P.parse_count(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"largest layer must be a parameter count >= 0 (0: not counted), got {text!r}") from None


def deepspeed_config(path: str):
    """``--deepspeed-config``: the file read by zerospec/plan/ds_config.py (a usage error naming the
    key and the value DeepSpeed would refuse)."""
    from ..plan import ds_config
    try:
        return ds_config.read(path)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def hf_config(path: str):
    """``--hf-config``: (name, shape) of a Hugging Face config.json (zerospec/model/hf_config.py)."""
    from ..model import hf_config as hf
    try:
        return hf.read(path)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def out_dir(text: str) -> str:
    """``--out DIR``: a directory the figures can be written into, or one that can be made there
    (its nearest existing parent takes a file); checked before any work, so a bad one costs no
    step, and made only when a figure is written, so a refused command leaves nothing behind."""
    import os
    import pathlib
    import tempfile
    p = pathlib.Path(text)
    if not str(text).strip():
        raise argparse.ArgumentTypeError("--out is empty: give a directory for the figures")
    if p.exists() and not p.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a file, not a directory")
    there = next(a for a in (p.absolute(), *p.absolute().parents) if a.exists())
    if not there.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r}: cannot write a figure there ({str(there)!r} "
                                         f"is a file, not a directory)")
    try:      # write access tried, not read from the mode bits (a superuser ignores them)
        fd, probe = tempfile.mkstemp(dir=there, prefix=".zerospec-probe-")
    except OSError as e:
        raise argparse.ArgumentTypeError(f"{text!r}: cannot write a figure there "
                                         f"({e.strerror})") from None
    os.close(fd)
    os.unlink(probe)
    return str(p)


def machine(text: str):
    """A machine of zerospec/paper/hardware.py by its key (``--machine dgx-h100``)."""
    from ..paper.hardware import MACHINES
    key = str(text).strip().lower()
    if key not in MACHINES:
        raise argparse.ArgumentTypeError(f"unknown machine {text!r}; accepted: {', '.join(MACHINES)}")
    return key


def machine_help(what: str) -> str:
    from ..paper.hardware import MACHINES
    return f"a spec-sheet machine (zerospec/paper/hardware.py): {', '.join(MACHINES)}; {what}"


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
    return _wrap(lambda text: P.parse_list(text, parse, what))


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
