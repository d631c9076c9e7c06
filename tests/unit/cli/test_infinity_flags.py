"""``--offload-params cpu|nvme`` and ``--offload-partition`` on ``zerospec train`` (spec/infinity.md)."""
from __future__ import annotations

from tests.support.cli import assert_usage_error, run_cli


def test_train_with_parameters_on_nvme_writes_their_swap_files(capsys, tmp_path):
    """Stage 3, parameters and optimizer on NVMe, the owner's layout: exit 0, the run and its
    NVMe link named in the summary, the swap files written."""
    code, out, err = run_cli(capsys, "train", "--stage", "3", "--ranks", "2", "--model", "odd",
                             "--steps", "1", "--offload-optimizer", "nvme", "--offload-params",
                             "nvme", "--offload-partition", "owner", "--nvme-path", str(tmp_path))
    assert code == 0, err
    assert "parameters offloaded to nvme (owner partition)" in out and "nvme link bytes" in out
    assert sorted(p.name for p in (tmp_path / "rank0").glob("*.param16.swap"))


def test_train_with_the_prefetcher_exits_0_and_says_so(capsys):
    """--offload-prefetch with parameters on the host: exit 0, a 2-step run (the first traces)."""
    code, out, err = run_cli(capsys, "train", "--stage", "3", "--ranks", "2", "--model", "odd",
                             "--steps", "2", "--offload-optimizer", "cpu", "--offload-params", "cpu",
                             "--offload-prefetch")
    assert code == 0, err
    assert "parameters offloaded to cpu (bandwidth partition, prefetch)" in out


def test_an_owner_layout_without_offloaded_parameters_exits_2_naming_it(capsys):
    """--offload-partition owner alone: exit 2, one line naming the option and what it needs."""
    assert_usage_error(capsys, "train", "--stage", "3", "--ranks", "2", "--offload-optimizer",
                       "cpu", "--offload-partition", "owner",
                       named="offload_partition='owner' says where offloaded parameters live")
