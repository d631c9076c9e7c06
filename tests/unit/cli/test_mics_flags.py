"""``--shard-group`` on ``zerospec train`` and ``zerospec scale`` (spec/mics.md)."""
from __future__ import annotations

import pytest

from tests.support.cli import assert_usage_error, run_cli


@pytest.mark.parametrize("cmd", [["train", "--stage", "3", "--ranks", "4"],
                                 ["scale", "--layers", "2", "--hidden", "64", "--gpus", "4",
                                  "--stages", "3"]], ids=["train", "scale"])
def test_a_partition_group_that_does_not_divide_the_ranks_exits_2_naming_it(capsys, cmd):
    """p = 3 of 4 ranks: exit 2, one line naming 3 and the accepted 1, 2, 4."""
    assert_usage_error(capsys, *cmd, "--shard-group", "3",
                       named="shard_group (MiCS's partition group size p)=3 must be an integer "
                             "that divides the 4 data-parallel ranks; accepted: 1, 2, 4")


def test_train_with_a_group_per_node_sends_less_across_nodes(capsys):
    """2 nodes × 2, stage 3: partition groups of 2 leave node 0 with fewer elements per step."""
    rows = {}
    for p in ([], ["--shard-group", "2"]):
        code, out, _ = run_cli(capsys, "train", "--stage", "3", "--ranks", "4", "--model", "odd",
                               "--steps", "1", "--gpus-per-node", "2", *p)
        assert code == 0 and "elements leaving node 0" in out
        assert ("MiCS partition groups of 2" in out) == bool(p)
        rows[bool(p)] = int(out.strip().splitlines()[-1].split("|")[-2].replace(",", ""))
    assert 0 < rows[True] < rows[False]


@pytest.mark.slow
def test_scale_measures_mics_on_meta(capsys):
    """zerospec scale --shard-group 2 on 4 meta GPUs in 2 nodes: exit 0, stage 3's crossing."""
    code, out, _ = run_cli(capsys, "scale", "--layers", "2", "--hidden", "64", "--gpus", "4",
                           "--stages", "3", "--gpus-per-node", "2", "--shard-group", "2",
                           "--vocab", "64", "--seq", "16")
    assert code == 0 and "stage 3:" in out
