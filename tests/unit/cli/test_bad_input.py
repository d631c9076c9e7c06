"""Bad input the planner and trainer were given in issue 55: each exits 2 with one line naming
the value (and the limit it passes), before any work, with no traceback."""
from __future__ import annotations

import json

import pytest

from tests.support.cli import assert_usage_error

EXPLAIN = ("plan", "--preset", "llama-3-8b", "--gpus", "8", "--stage", "3", "--seq", "64",
           "--explain")


@pytest.mark.parametrize("argv,named", [
    (("plan", "--params", "1e400"), "'1e400' is beyond 576,460,752,303,423,487"),
    (("plan", "--params", "NaN"), "'NaN'"),
    (("plan", "--gpu-mem", "1e400GB"), "'1e400GB' is beyond 2^63 − 1 bytes"),
    (("plan", "--gpu-mem", "NaNGB"), "'NaNGB'"),
    (("plan", "--params", "1e30"), "'1e30' is beyond 576,460,752,303,423,487"),
    (("plan", "--gpus", "1e12"), "'1e12'"),
    (("plan", "--gpus", "1000000000000"), "'1000000000000' is beyond 2,147,483,647"),
], ids=["params-1e400", "params-nan", "gpu-mem-1e400", "gpu-mem-nan", "params-1e30",
        "gpus-1e12", "gpus-10^12"])
def test_numbers_past_what_a_64_bit_size_or_a_world_size_holds(capsys, argv, named):
    """Ψ past (2^63 − 1)/16, memory past 2^63 − 1 bytes, N past 2^31 − 1, and NaN: refused."""
    assert_usage_error(capsys, *argv, named=named)


def test_out_at_an_existing_file(capsys, tmp_path):
    f = tmp_path / "taken"
    f.write_text("")
    assert_usage_error(capsys, *EXPLAIN, "--out", str(f), named=f"'{f}' is a file")


def test_out_at_a_folder_that_cannot_be_made(capsys, tmp_path):
    f = tmp_path / "taken"
    f.write_text("")
    assert_usage_error(capsys, *EXPLAIN, "--out", str(f / "sub"),
                       named=f"'{f / 'sub'}': cannot write a figure there")


def test_a_refused_command_makes_no_out_folder(capsys, tmp_path, monkeypatch):
    """--out names a folder to make, but a command refused for another reason makes nothing."""
    monkeypatch.chdir(tmp_path)
    assert_usage_error(capsys, "plan", "--out", "x/y", named="add --explain")
    assert list(tmp_path.iterdir()) == []


TRAIN = ("train", "--stage", "3", "--ranks", "2", "--offload-optimizer", "nvme", "--steps", "1")


def test_nvme_path_that_cannot_be_written(capsys):
    """/proc/self is a directory no one can create a file in (root included)."""
    assert_usage_error(capsys, *TRAIN, "--nvme-path", "/proc/self",
                       named="nvme_path '/proc/self' is not writable")


def test_an_empty_nvme_path(capsys):
    assert_usage_error(capsys, *TRAIN, "--nvme-path", "", named="nvme_path '' is empty")


def test_dpu_beyond_the_steps(capsys):
    assert_usage_error(capsys, "train", "--stage", "2", "--ranks", "2", "--offload-optimizer",
                       "cpu", "--steps", "2", "--dpu", "3", named="dpu=3 is beyond steps=2")


LLAMA = {"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
         "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
         "vocab_size": 128256, "max_position_embeddings": 8192, "rms_norm_eps": 1e-5,
         "rope_theta": 500000.0}


@pytest.mark.parametrize("change,named", [
    ({"hidden_size": 2**40}, "the largest sharding unit (its parameters as one flat vector) "
                             "holds 3,022,314,596,326,568,047,411,200 elements"),
    ({"num_hidden_layers": 10**9}, "num_hidden_layers 1,000,000,000 makes 1,000,000,003 "
                                   "sharding units; a meta step takes at most 4,096"),
    ({"rms_norm_eps": float("inf")}, "rms_norm_eps = inf; accepted: a finite number"),
], ids=["hidden-2^40", "layers-10^9", "eps-inf"])
def test_a_config_json_a_meta_step_cannot_hold(capsys, tmp_path, change, named):
    """Sizes past a tensor's 2^63 − 1 bytes or a meta step's unit budget, and an infinite
    epsilon, are refused before any step (a test that hangs or overflows fails by timeout or
    traceback)."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**LLAMA, **change}))
    assert_usage_error(capsys, "plan", "--hf-config", str(path), "--gpus", "8", "--stage", "3",
                       "--seq", "1024", "--explain", named=named)

