"""The command line's flags for TrainConfig's sections, derived from their fields: each flag is
declared once, in zerospec/training/sections.py (name, help, accepted values, default), and
``train``, ``scale`` and ``plan`` add the ones they take from here.

A flag's argparse default is None, "not given": the section's own default applies, so a flag has
one default wherever it appears, and a command can tell which flags were given.
"""
from __future__ import annotations

import argparse
import dataclasses


def _bucket_size(text: str):
    """``--bucket-size``: an integer >= 1, or ``model``."""
    if text == "model":
        return text
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1 or 'model', got {text!r}")
    return n


def _ac_mode(text: str) -> str:
    """``--activation-checkpointing``: none, full, selective-op or selective-layer:K."""
    from ..training.sections import ac_mode
    try:
        ac_mode(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _converter(name: str | None):
    from . import argtypes as T
    return {None: None, "int": int, "positive_int": T.positive_int,
            "positive_float": T.positive_float, "bucket_size": _bucket_size,
            "ac_mode": _ac_mode}[name]


def field(name: str) -> dataclasses.Field:
    """The section field named ``name`` (tests/unit/cli: every flag has one)."""
    from ..training.sections import SECTION_OF, SECTIONS
    return next(f for f in dataclasses.fields(SECTIONS[SECTION_OF[name]]) if f.name == name)


def add_flags(parser, names, help_suffix: str = "") -> None:
    """Add the flags of the section fields ``names`` to ``parser`` (or an argument group)."""
    for name in names:
        f = field(name)
        m = f.metadata
        kw = dict(dest=name, default=None, help=m["help"] + help_suffix)
        if isinstance(f.default, bool):
            kw["action"] = "store_true"
        else:
            kw["type"] = _converter(m["parse"])
            if m["choices"] is not None:
                kw["choices"] = m["choices"]
            if m["metavar"] is not None:
                kw["metavar"] = m["metavar"]
        parser.add_argument(m["flag"], **kw)


def given(args, names) -> dict:
    """The options of ``names`` given on the command line, as the sections take them. A flag that
    only qualifies another (``--offload-mode`` says which gradients ``--offload-optimizer`` sends
    down) is refused without it, never dropped."""
    out = {}
    for name in names:
        v = getattr(args, name, None)
        if v is not None:
            build = field(name).metadata["build"]
            out[name] = build(v) if build is not None else v
    if out.get("offload_mode") is not None and out.get("offload_optimizer") is None:
        from .argtypes import UsageError
        raise UsageError(f"--offload-mode {out['offload_mode']} says which gradients ZeRO-Offload "
                         f"sends down; it needs --offload-optimizer cpu or nvme")
    return out


def flag(name: str) -> str:
    """The command-line flag of section field ``name`` (for messages)."""
    return field(name).metadata["flag"]


def add_attention(parser) -> None:
    """``--attention``: the model's attention kernel (GPTConfig.attention), for plan and train."""
    parser.add_argument(
        "--attention", choices=("eager", "sdpa"), default=None,
        help="the attention kernel: eager (written out, B·H·T² scores kept) or sdpa (a "
             "memory-efficient kernel keeping q, k, v, the output and a log-sum-exp per row, as "
             "FlashAttention-2; the same values; spec/models.md). Default: the model's (sdpa for "
             "published presets and --hf-config, eager for the paper's and train's tiny models)")
