"""Bad input at the command line: exit 2, one line naming the value, no traceback, no work done."""
from __future__ import annotations

import pytest

from tests.support.cli import assert_usage_error, run_cli


@pytest.mark.parametrize("argv,named", [
    (["scale", "--layers", "2", "--hidden", "64", "--heads", "0"], "--heads"),
    (["scale", "--layers", "2", "--hidden", "64", "--vocab", "0"], "--vocab"),
    (["scale", "--layers", "2", "--hidden", "64", "--seq", "0"], "--seq"),
    (["scale", "--gpus", "0"], "--gpus"),
    (["scale", "--micro-batch", "-1"], "--micro-batch"),
    (["train", "--timeout", "nan"], "'nan'"),
    (["train", "--timeout", "inf"], "'inf'"),
    (["train", "--timeout", "0"], "'0'"),
], ids=lambda x: " ".join(x) if isinstance(x, list) else None)
def test_a_value_outside_its_range_is_refused_by_name(capsys, argv, named):
    """Zero, negative and non-finite values are refused, never replaced by a default or a crash."""
    assert_usage_error(capsys, *argv, named=named)


def test_no_command_is_a_usage_error(capsys):
    """`zerospec` alone prints the commands on stderr and exits 2 (nothing was done)."""
    rc, out, err = run_cli(capsys)
    assert rc == 2 and out == "" and "COMMAND" in err


@pytest.mark.parametrize("timeout", [0.0, -1.0, float("nan"), float("inf")])
def test_the_cluster_refuses_a_timeout_that_is_not_a_finite_positive_number(timeout):
    """A NaN timeout would pass a `<= 0` check and wait forever or fail oddly: refused up front."""
    from zerospec import VirtualCluster
    with pytest.raises(ValueError, match="timeout must be a finite number of seconds > 0"):
        VirtualCluster(2, timeout=timeout)
