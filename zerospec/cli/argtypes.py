"""argparse ``type=`` converters for report and plan: errors name the bad value and what is accepted.

argparse turns an :class:`argparse.ArgumentTypeError` into a one-line usage error (exit code 2 via
``zerospec.__main__``); a plain ValueError would lose our message.
"""
from __future__ import annotations

import argparse
import re

from ..plan import closed_form as plan


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


count = _wrap(plan.parse_count)
memory = _wrap(plan.parse_bytes)
bandwidth = _wrap(plan.parse_bandwidth)
gpus = _wrap(plan.parse_gpus)


def layer_count(text: str) -> int:
    """A parameter count that may be 0 (``--largest-layer``: 0 means "not counted", its default)."""
    if re.fullmatch(r"0+(\.0*)?(e[+-]?\d+)?\s*[KMBGT]?", str(text).strip(), re.IGNORECASE):
        return 0
    try:
        return plan.parse_count(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"largest layer must be a parameter count >= 0 (0: not counted), got {text!r}") from None


# DeepSpeed 0.19.8's defaults (runtime/zero/config.py) for the settings `plan --deepspeed-config` reads
DS_DEFAULTS = {"stage": 0, "reduce_bucket_size": 500_000_000, "allgather_bucket_size": 500_000_000,
               "use_multi_rank_bucket_allreduce": True, "stage3_param_persistence_threshold": 100_000,
               "stage3_max_reuse_distance": 1_000_000_000, "stage3_prefetch_bucket_size": 50_000_000}


def deepspeed_config(path: str) -> dict:
    """A DeepSpeed JSON config → its zero_optimization settings that decide traffic, each with
    DeepSpeed's default where absent, and ``"given"``: the names the file sets."""
    import json
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as exc:
        raise argparse.ArgumentTypeError(
            f"cannot read DeepSpeed config {path!r} ({exc}); accepted: a JSON file such as "
            f"deepspeed.initialize(config=...) takes") from None
    if not isinstance(doc, dict):
        raise argparse.ArgumentTypeError(f"{path!r}: a DeepSpeed config is a JSON object, got "
                                         f"a {type(doc).__name__}")
    zero = doc.get("zero_optimization", {})
    if not isinstance(zero, dict):
        raise argparse.ArgumentTypeError(f"{path!r}: zero_optimization must be an object, got {zero!r}")
    out = {"given": sorted(k for k in DS_DEFAULTS if k in zero)}
    for key, default in DS_DEFAULTS.items():
        value = zero.get(key, default)
        if isinstance(default, bool):
            ok = isinstance(value, bool)
        else:   # DeepSpeed accepts 5e8 for an integer setting
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0 \
                and float(value) == int(value)
            value = int(value) if ok else value
        if not ok or (key == "stage" and value not in (0, 1, 2, 3)):
            accepted = ("true or false" if isinstance(default, bool) else
                        "0, 1, 2 or 3" if key == "stage" else "an integer >= 0")
            raise argparse.ArgumentTypeError(f"{path!r}: zero_optimization.{key} = {value!r}; "
                                             f"accepted: {accepted}")
        out[key] = value
    return out


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
