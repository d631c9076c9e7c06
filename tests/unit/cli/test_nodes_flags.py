"""``--gpus-per-node`` and ``--hpz`` on ``zerospec train`` and ``zerospec scale`` (spec/nodes.md)."""
from __future__ import annotations

import pytest

from tests.support.cli import assert_usage_error, run_cli


@pytest.mark.parametrize("cmd", [["train", "--stage", "3", "--ranks", "8"],
                                 ["scale", "--layers", "2", "--hidden", "64", "--gpus", "8",
                                  "--stages", "3"]], ids=["train", "scale"])
def test_an_hpz_that_does_not_divide_the_node_exits_2_naming_it(capsys, cmd):
    """h = 3 on nodes of 4 GPUs: exit 2, one line naming 3 and the accepted 1, 2, 4."""
    assert_usage_error(capsys, *cmd, "--gpus-per-node", "4", "--hpz", "3",
                       named="hpz (zero_hpz_partition_size)=3 must divide the GPUs per node (4) "
                             "so that each secondary partition lies inside one node; accepted: 1, 2, 4")


def test_train_prints_what_leaves_node_0_and_hpz_lowers_it(capsys):
    """The table's last column is node 0's cross-node elements: hpZ's is stage 3's less its
    backward all-gathers."""
    rows = {}
    for h in ("1", "2"):
        code, out, _ = run_cli(capsys, "train", "--stage", "3", "--ranks", "4", "--model", "odd",
                               "--steps", "1", "--gpus-per-node", "2", "--hpz", h)
        assert code == 0 and "elements leaving node 0" in out
        rows[h] = int(out.strip().splitlines()[-1].split("|")[-2].replace(",", ""))
    assert 0 < rows["2"] < rows["1"]
