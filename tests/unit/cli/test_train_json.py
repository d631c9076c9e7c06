"""``zerospec train --format json``: two runs compared bit for bit from the shell (exact losses, a
digest of the fp32 masters), and ``--save`` / ``--resume`` for the run's checkpoint files."""
from __future__ import annotations

import json

import pytest
import torch

from tests.support.cli import assert_usage_error, run_cli
from zerospec.model.gpt import ODD
from zerospec.training.config import TrainConfig
from zerospec.training.record import master_digest
from zerospec.training.run import train

TINY = ("--model", "odd", "--steps", "2", "--ranks", "4")


def _json(capsys, *argv) -> dict:
    rc, out, err = run_cli(capsys, "train", "--format", "json", *argv)
    assert rc == 0 and err == "", err
    return json.loads(out)


def _same_training(a: dict, b: dict) -> None:
    assert len(a["losses"]) >= 2 and a["losses"] == b["losses"]
    assert a["master_sha256"] is not None and a["master_sha256"] == b["master_sha256"]


@pytest.mark.parametrize("argv", [
    ("--stage", "3", "--grad-accum", "2"),
    ("--stage", "2", "--bucket-size", "1000", "--contiguous-gradients"),
], ids=["stage3-grad-accum", "stage2-buckets-contiguous"])
def test_offload_prints_the_losses_and_master_digest_of_the_run_without_it(capsys, argv):
    """ZeRO-Offload moves the optimizer, not the arithmetic: the same exact losses and the same
    master digest as the command without ``--offload-optimizer``; the host link carries bytes."""
    off = _json(capsys, *TINY, *argv, "--offload-optimizer", "cpu")
    ref = _json(capsys, *TINY, *argv)
    _same_training(off, ref)
    assert off["config"]["offload"]["offload_optimizer"] == "cpu" and ref["config"]["offload"]["offload_optimizer"] is None
    assert all(b > 0 for b in off["ledgers"]["host_link_bytes"])
    assert not any(ref["ledgers"]["host_link_bytes"])


@pytest.mark.slow
@pytest.mark.parametrize("argv", [
    ("--stage", "3", "--grad-accum", "2"),
    ("--stage", "2", "--bucket-size", "100000", "--contiguous-gradients"),
], ids=["stage3-grad-accum", "stage2-buckets-contiguous"])
def test_the_issues_commands_print_the_same_losses_and_digest_with_and_without_offload(capsys, argv):
    """The commands as a user types them (the small model, 5 steps, 4 ranks)."""
    _same_training(_json(capsys, "--ranks", "4", *argv, "--offload-optimizer", "cpu"),
                   _json(capsys, "--ranks", "4", *argv))


@pytest.mark.parametrize("feature", [
    ("--stage3-persistence-threshold", "100", "--stage3-max-reuse-distance", "1000000"),
    ("--gpus-per-node", "2", "--hpz", "2")], ids=["deepspeed-knobs", "hpz"])
def test_parameter_offload_with_a_feature_prints_the_feature_alones_losses_and_digest(capsys,
                                                                                       feature):
    """Pairs spec/combine.md composes through ZeRO-Infinity's parameter offload: the same exact
    losses and master digest as the feature without offload."""
    off = ("--offload-optimizer", "cpu", "--offload-params", "cpu", "--offload-prefetch")
    _same_training(_json(capsys, *TINY, "--stage", "3", *feature, *off),
                   _json(capsys, *TINY, "--stage", "3", *feature))


def test_the_losses_are_exact_floats_of_the_run_the_table_rounds(capsys):
    """Each loss is float.hex of the run's fp64 mean loss, every bit (train() on the same
    config), which the table prints rounded to 6 decimals."""
    rc, table, _ = run_cli(capsys, "train", *TINY, "--stage", "1")
    got = _json(capsys, *TINY, "--stage", "1")["losses"]
    api = train(TrainConfig(stage=1, n_d=4, model=ODD, steps=2)).losses
    rows = [line.split("|")[2].strip() for line in table.splitlines() if line.startswith("| 1 ")
            or line.startswith("| 2 ")]
    assert [float.fromhex(x) for x in got] == api
    assert rc == 0 and rows == [f"{x:.6f}" for x in api]


def test_the_digest_changes_with_any_bit_of_any_master():
    """Equal tensors give equal digests whatever the dict order; one flipped bit changes it."""
    a = {"w": torch.arange(6, dtype=torch.float32).view(2, 3), "b": torch.ones(3)}
    b = {"b": torch.ones(3), "w": torch.arange(6, dtype=torch.float32).view(2, 3)}
    assert master_digest(a) == master_digest(b)
    b["w"].view(torch.int32)[1, 2] ^= 1
    assert master_digest(a) != master_digest(b)
    assert master_digest({"w": a["w"].view(3, 2)}) != master_digest({"w": a["w"]})


def test_save_then_resume_continues_the_run_bit_for_bit(capsys, tmp_path):
    """Two steps saved, then resumed to four: the resumed steps' losses and the final masters are
    the uninterrupted four-step run's."""
    base = ("--model", "odd", "--ranks", "4", "--stage", "3")
    whole = _json(capsys, *base, "--steps", "4")
    first = _json(capsys, *base, "--steps", "2", "--save", str(tmp_path / "ck"))
    rest = _json(capsys, *base, "--steps", "4", "--resume", str(tmp_path / "ck"))
    assert first["losses"] + rest["losses"] == whole["losses"]
    assert rest["master_sha256"] == whole["master_sha256"] != first["master_sha256"]


def test_resume_from_a_missing_directory_is_one_line(capsys, tmp_path):
    """A directory with no checkpoint: exit 2, one line naming it."""
    assert_usage_error(capsys, "train", *TINY, "--resume", str(tmp_path / "none"),
                       named=str(tmp_path / "none"))


def test_deepspeeds_stage3_knobs_reach_the_run_and_move_no_bit(capsys):
    """``--stage3-persistence-threshold`` and ``--stage3-max-reuse-distance`` reach the config,
    and with ``--grad-accum 2`` and ``--offload-optimizer cpu`` the losses and master digest
    are those of plain stage 3 with accumulation."""
    knobs = _json(capsys, *TINY, "--stage", "3", "--grad-accum", "2", "--offload-optimizer", "cpu",
                  "--stage3-persistence-threshold", "100", "--stage3-max-reuse-distance", "100000")
    assert knobs["config"]["variants"]["stage3_persistence_threshold"] == 100
    assert knobs["config"]["variants"]["stage3_max_reuse_distance"] == 100000
    _same_training(knobs, _json(capsys, *TINY, "--stage", "3", "--grad-accum", "2"))


def test_a_save_the_delayed_update_would_miss_is_one_line(capsys, tmp_path):
    """``--save`` after step ``--dpu`` N would miss the pending gradient: exit 2, one line, no
    rank started."""
    assert_usage_error(capsys, "train", *TINY, "--stage", "2", "--offload-optimizer", "cpu",
                       "--dpu", "1", "--save", str(tmp_path / "ck"),
                       named="save=[2]: a checkpoint at or after step dpu=1")
