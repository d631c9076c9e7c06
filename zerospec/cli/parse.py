"""The command line's readers of sizes, counts, stages and lists: ``7.5B``, ``32GB``, ``50GB/s``,
``400Gbps``, ``zero-3``. Each error names the bad value and what is accepted (a ValueError;
zerospec/cli/argtypes.py turns it into argparse's one-line usage error).
"""
from __future__ import annotations

import re
from fractions import Fraction

from ..plan.limits import check_bytes, check_count, check_gpus

_NUM = r"([+-]?[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)"   # signed, so "-5" is "must be > 0"
_COUNT_SUFFIX = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9, "T": 10**12}
_BYTE_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "PB": 10**15,
               "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
_BIT_UNITS = {"BPS": 1, "KBPS": 10**3, "MBPS": 10**6, "GBPS": 10**9, "TBPS": 10**12,
              "KBIT/S": 10**3, "MBIT/S": 10**6, "GBIT/S": 10**9, "TBIT/S": 10**12}


def parse_count(text: str) -> int:
    """A parameter count: ``7.5e9``, ``7.5B``, ``175M``, ``1T`` (decimal suffixes K, M, B/G, T)."""
    m = re.fullmatch(_NUM + r"\s*([KMBGT]?)", str(text).strip(), re.IGNORECASE)
    if not m:
        raise ValueError(f"cannot read parameter count {text!r}; accepted: a number with an optional "
                         f"suffix K, M, B or T, e.g. 7.5e9, 7.5B, 175M")
    value = Fraction(m.group(1)) * _COUNT_SUFFIX[m.group(2).upper()]
    if value < 1:
        raise ValueError(f"parameter count must be >= 1, got {text!r}")
    return check_count(int(value), text)


def parse_bytes(text: str) -> int:
    """A memory size with its unit: ``32GB`` (decimal, as the paper), ``80GiB``, ``512MB``."""
    m = re.fullmatch(_NUM + r"\s*([A-Za-z]+)", str(text).strip())
    unit = m.group(2).upper() if m else None
    if not m or unit not in _BYTE_UNITS:
        raise ValueError(f"cannot read memory size {text!r}; accepted: a number with a unit "
                         f"B, KB, MB, GB, TB (decimal) or KiB, MiB, GiB, TiB, e.g. 32GB")
    value = Fraction(m.group(1)) * _BYTE_UNITS[unit]
    if value <= 0:
        raise ValueError(f"memory size must be > 0, got {text!r}")
    return check_bytes(int(value), text)


def parse_bandwidth(text: str) -> Fraction:
    """Bytes per second from ``50GB/s``, ``25GiB/s`` or bits: ``400Gbps``, ``100Gbit/s``."""
    s = str(text).strip()
    m = re.fullmatch(_NUM + r"\s*([A-Za-z/]+)", s)
    if m:
        unit = m.group(2)
        if unit.upper().endswith("/S") and unit[:-2].upper() in _BYTE_UNITS and unit[-3] == "B":
            value = Fraction(m.group(1)) * _BYTE_UNITS[unit[:-2].upper()]
        elif unit.upper() in _BIT_UNITS and unit[-3 if unit.endswith("ps") else -5] == "b":
            value = Fraction(m.group(1)) * _BIT_UNITS[unit.upper()] / 8
        else:
            value = None
        if value is not None:
            if value <= 0:
                raise ValueError(f"bandwidth must be > 0, got {text!r}")
            return value
    raise ValueError(f"cannot read bandwidth {text!r}; accepted: bytes per second such as 50GB/s, "
                     f"25GiB/s, or bits per second such as 400Gbps, 100Gbit/s")


def parse_list(text: str, parse, what: str) -> list:
    items = [t for t in str(text).split(",") if t.strip()]
    if not items:
        raise ValueError(f"empty {what} list {text!r}")
    return [parse(t) for t in items]


def parse_gpus(text: str, what: str = "GPU count N_d") -> int:
    """A data-parallel degree N_d (or, named by ``what``, another degree): an integer >= 1."""
    try:
        n = int(str(text).strip())
    except ValueError:
        raise ValueError(f"cannot read {what} {text!r}; accepted: an integer >= 1") from None
    if n < 1:
        raise ValueError(f"{what} must be >= 1, got {text!r}")
    return check_gpus(n, text, what)


def parse_mp(text: str) -> int:
    """A model-parallel degree N_m (Table 2's MP column): an integer >= 1."""
    return parse_gpus(text, "model-parallel degree N_m")


def parse_stage(text: str) -> int:
    t = str(text).strip().lower().removeprefix("zero-").removeprefix("zero")
    if t not in ("0", "1", "2", "3"):
        raise ValueError(f"unknown stage {text!r}; accepted: 0, 1, 2, 3")
    return int(t)
