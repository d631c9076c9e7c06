"""``--shard-group`` on ``zerospec train``, ``zerospec scale`` and ``zerospec plan`` (spec/mics.md)."""
from __future__ import annotations

import pytest

from tests.support.cli import assert_usage_error, run_cli, tiny_hf_config


@pytest.mark.parametrize("cmd", [["train", "--stage", "3", "--ranks", "4"],
                                 ["scale", "--layers", "2", "--hidden", "64", "--gpus", "4",
                                  "--stages", "3"],
                                 ["plan", "--explain", "--hf-config", "CONFIG", "--gpus", "4",
                                  "--stage", "3"]], ids=["train", "scale", "plan"])
def test_a_partition_group_that_does_not_divide_the_ranks_exits_2_naming_it(capsys, cmd, tmp_path):
    """p = 3 of 4 ranks: exit 2, one line naming 3 and the accepted 1, 2, 4."""
    cmd = [tiny_hf_config(tmp_path) if c == "CONFIG" else c for c in cmd]
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


def test_plan_explain_with_a_group_per_node_crosses_only_in_the_replica_all_reduce(capsys, tmp_path):
    """`plan --explain --shard-group 4` on 2 nodes × 4: the only collective with bytes across is
    MiCS's replica all-reduce."""
    from tests.unit.cli.test_nodes_flags import _plan_nodes
    rows = _plan_nodes(capsys, tmp_path, "--gpus", "8", "--gpus-per-node", "4", "--shard-group", "4")
    across = {c for c, cells in rows.items() if c != "total" and cells[1] != "0"}
    assert across == {"replica all-reduce (MiCS)"}


def test_scale_out_draws_bytes_inside_and_across_per_stage(capsys, tmp_path):
    """`scale --gpus-per-node 2 --out DIR`: DIR/node_bytes.svg; without --gpus-per-node, exit 2."""
    base = ("scale", "--layers", "2", "--hidden", "64", "--gpus", "4", "--stages", "3",
            "--vocab", "64", "--seq", "16", "--out", str(tmp_path))
    code, out, _ = run_cli(capsys, *base, "--gpus-per-node", "2", "--shard-group", "2")
    assert code == 0 and (tmp_path / "node_bytes.svg").stat().st_size > 0
    assert f"Drawn: {tmp_path / 'node_bytes.svg'}" in out
    assert_usage_error(capsys, *base, named="--out draws the bytes inside vs across nodes: add "
                                            "--gpus-per-node G")
