"""zerospec.cli.parse: the command line's readers of counts, sizes, bandwidths, GPU counts and
stages; each error names the bad value and what is accepted."""
from __future__ import annotations

import pytest

from zerospec.cli import parse as plan

GB, GIB = 10**9, 2**30


# -- parsing -------------------------------------------------------------------------------------
@pytest.mark.parametrize("text,value", [("7.5e9", 7_500_000_000), ("7.5B", 7_500_000_000),
                                        ("175M", 175_000_000), ("1T", 10**12), ("128b", 128 * 10**9)])
def test_parameter_counts_take_decimal_suffixes(text, value):
    """7.5e9, 7.5B, 175M, 1T are parameter counts."""
    assert plan.parse_count(text) == value


@pytest.mark.parametrize("text,value", [("32GB", 32 * GB), ("80GiB", 80 * GIB), ("512 MB", 512 * 10**6)])
def test_memory_sizes_are_decimal_unless_binary_is_named(text, value):
    """GB is 10^9 bytes, as the paper uses; GiB is 2^30."""
    assert plan.parse_bytes(text) == value


@pytest.mark.parametrize("text,value", [("50GB/s", 50 * GB), ("25GiB/s", 25 * GIB),
                                        ("400Gbps", 50 * GB), ("100Gbit/s", 12_500_000_000)])
def test_bandwidths_in_bytes_or_bits_per_second(text, value):
    """50GB/s and 400Gbps are the same link."""
    assert plan.parse_bandwidth(text) == value


@pytest.mark.parametrize("parse,text,match", [
    (plan.parse_count, "-5", "must be >= 1, got '-5'"),
    (plan.parse_count, "7.5X", "cannot read parameter count '7.5X'.*7.5B"),
    (plan.parse_count, "0", "must be >= 1"),
    (plan.parse_bytes, "32", "cannot read memory size '32'.*GB"),
    (plan.parse_bytes, "0GB", "must be > 0"),
    (plan.parse_bandwidth, "50GB", "cannot read bandwidth '50GB'"),
    (plan.parse_gpus, "0", "must be >= 1, got '0'"),
    (plan.parse_stage, "4", "accepted: 0, 1, 2, 3"),
])
def test_bad_values_are_named_with_what_is_accepted(parse, text, match):
    """Errors name the bad value and the accepted forms."""
    with pytest.raises(ValueError, match=match):
        parse(text)
