"""``--gpus-per-node`` and ``--hpz`` on ``zerospec train``, ``zerospec scale`` and ``zerospec plan``
(spec/nodes.md)."""
from __future__ import annotations

import pytest

from tests.support.cli import assert_usage_error, run_cli, tiny_hf_config


@pytest.mark.parametrize("cmd", [["train", "--stage", "3", "--ranks", "8"],
                                 ["scale", "--layers", "2", "--hidden", "64", "--gpus", "8",
                                  "--stages", "3"],
                                 ["plan", "--explain", "--hf-config", "CONFIG", "--gpus", "8",
                                  "--stage", "3"]], ids=["train", "scale", "plan"])
def test_an_hpz_that_does_not_divide_the_node_exits_2_naming_it(capsys, cmd, tmp_path):
    """h = 3 on nodes of 4 GPUs: exit 2, one line naming 3 and the accepted 1, 2, 4."""
    cmd = [tiny_hf_config(tmp_path) if c == "CONFIG" else c for c in cmd]
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


def _plan_nodes(capsys, tmp_path, *argv) -> dict[str, list[str]]:
    """`plan --explain` of the tiny model at stage 3: its bytes inside vs across table, by row."""
    rc, out, _ = run_cli(capsys, "plan", "--explain", "--hf-config", tiny_hf_config(tmp_path),
                         "--stage", "3", *argv)
    assert rc == 0, out
    if "### Bytes inside vs across nodes" not in out:
        return {}
    table = out.split("### Bytes inside vs across nodes")[1].split("\n\n")[1]
    return {r.split("|")[1].strip(): [c.strip() for c in r.split("|")[2:-1]]
            for r in table.splitlines()[2:]}


def test_plan_explain_shows_bytes_across_nodes_on_the_given_nodes(capsys, tmp_path):
    """`plan --explain --gpus-per-node 4` on 8 GPUs: the across column is what leaves node 0 in
    a flat ring (its last GPU's whole share); on nodes of 2 the same; hpZ h = 4 crosses 0 in
    backward's all-gather."""
    from zerospec.model.hf_config import read
    from zerospec.plan.nodes import node_bytes
    from zerospec.training.scale import measure
    from zerospec.training.config import TrainConfig
    from zerospec.training.sections import MeshOptions
    rows = _plan_nodes(capsys, tmp_path, "--gpus", "8", "--gpus-per-node", "4")
    _, model = read(tiny_hf_config(tmp_path))
    for g in (4, 2):
        nb = node_bytes(measure(TrainConfig(stage=3, n_d=8, model=model,
                                            mesh=MeshOptions(gpus_per_node=g))))
        rows = _plan_nodes(capsys, tmp_path, "--gpus", "8", "--gpus-per-node", str(g))
        assert int(rows["total"][1].replace(",", "")) == nb.across() > 0
        assert int(rows["total"][0].replace(",", "")) == nb.inside()
    hpz = _plan_nodes(capsys, tmp_path, "--gpus", "8", "--gpus-per-node", "4", "--hpz", "4")
    assert hpz["backward all-gather"][1] == "0" != rows["backward all-gather"][1]


def test_plan_explain_takes_the_machines_gpus_per_node_when_the_step_spans_nodes(capsys, tmp_path):
    """--machine dgx-h100 (8 GPUs a node), no --gpus-per-node: 16 GPUs are 2 nodes, with the
    table; 8 GPUs are one node, without; --gpus-per-node wins; 12 GPUs are refused."""
    on_machine = _plan_nodes(capsys, tmp_path, "--gpus", "16", "--machine", "dgx-h100")
    assert on_machine == _plan_nodes(capsys, tmp_path, "--gpus", "16", "--gpus-per-node", "8")
    assert on_machine != _plan_nodes(capsys, tmp_path, "--gpus", "16", "--gpus-per-node", "4",
                                     "--machine", "dgx-h100")
    assert _plan_nodes(capsys, tmp_path, "--gpus", "8", "--machine", "dgx-h100") == {}
    assert_usage_error(capsys, "plan", "--explain", "--hf-config", tiny_hf_config(tmp_path),
                       "--stage", "3", "--gpus", "12", "--machine", "dgx-h100",
                       named="--gpus 12 does not fill whole 8-GPU nodes of --machine dgx-h100; "
                             "accepted: a multiple of 8, or --gpus-per-node G dividing 12")


def test_plan_node_flags_without_a_step_exit_2(capsys):
    """--hpz and --gpus-per-node set the step measured: without --explain, exit 2 naming them."""
    assert_usage_error(capsys, "plan", "--gpus", "8", "--gpus-per-node", "4", "--hpz", "2",
                       named="does not take --gpus-per-node, --hpz, options of `zerospec plan "
                             "--deepspeed-config` and `zerospec plan --explain`: add "
                             "--deepspeed-config DS.JSON or add --explain")
