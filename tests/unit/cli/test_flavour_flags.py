"""``--flavour fsdp2`` on ``zerospec train``, ``zerospec scale`` and ``zerospec plan --explain``
(zerospec/zero/fsdp2.py, spec/fsdp2.md)."""
from __future__ import annotations

import json

import pytest

from tests.support.cli import assert_usage_error, run_cli, tiny_hf_config


@pytest.mark.parametrize("cmd", [["train", "--stage", "2", "--ranks", "2"],
                                 ["plan", "--explain", "--hf-config", "CONFIG", "--gpus", "2",
                                  "--stage", "2"]], ids=["train", "plan"])
def test_the_flavour_at_another_stage_exits_2_naming_it(capsys, cmd, tmp_path):
    """A way of running stage 3: at stage 2, exit 2 with one line naming the value."""
    cmd = [tiny_hf_config(tmp_path) if c == "CONFIG" else c for c in cmd]
    assert_usage_error(capsys, *cmd, "--flavour", "fsdp2",
                       named="flavour='fsdp2' is a way of running stage 3")


def test_train_runs_the_flavour_in_bf16(capsys):
    """`train --stage 3 --flavour fsdp2 --precision bf16`: exit 0; rank 0 starts with 12Ψ/N of
    the padded units (fp32 parameters, exp_avg, exp_avg_sq: no master)."""
    code, out, _ = run_cli(capsys, "train", "--stage", "3", "--ranks", "2", "--model", "odd",
                           "--steps", "1", "--flavour", "fsdp2", "--precision", "bf16")
    from zerospec.model.gpt import ODD
    padded = sum(u.padded for u in ODD.units(2))
    assert code == 0 and f"model states on rank 0: {12 * padded // 2:,} B" in out


@pytest.mark.slow   # one traced meta step with its suggestions: ~2 s
def test_plan_explain_names_the_flavour_and_its_ledger(capsys, tmp_path):
    """`plan --explain --stage 3 --flavour fsdp2 --precision bf16 --format json`: the summary
    and the phase table's title say the flavour and precision; the buffers are FSDP2's fp32 shards, none of fp16 or master."""
    code, out, _ = run_cli(capsys, "plan", "--explain", "--hf-config", tiny_hf_config(tmp_path),
                           "--gpus", "2", "--stage", "3", "--flavour", "fsdp2", "--precision",
                           "bf16", "--format", "json")
    assert code == 0
    doc = json.loads(out)
    assert (doc["summary"]["flavour"], doc["summary"]["precision"]) == ("fsdp2", "bf16")
    phases, = (t for t in doc["tables"] if t["name"] == "explain_phases")
    assert ", bf16, FSDP2 flavour" in phases["title"]
    buffers = json.dumps([t for t in doc["tables"] if t["name"] == "explain_buffers"])
    assert "fp32 shards Adam updates (FSDP2)" in buffers and "fp32 master" not in buffers
