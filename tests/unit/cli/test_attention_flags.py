"""`--attention` on the command line: plan --explain names the kernel it stepped, train runs it."""
from __future__ import annotations

import json

from tests.support.cli import run_cli, tiny_hf_config


def test_train_with_sdpa_attention_prints_eager_losses(capsys):
    """`train --attention sdpa`: the kernel is named, and the losses are eager's, digit for digit."""
    argv = ("train", "--model", "odd", "--ranks", "2", "--steps", "2", "--stage", "3")
    rc0, eager, _ = run_cli(capsys, *argv)
    rc1, sdpa, _ = run_cli(capsys, *argv, "--attention", "sdpa")
    assert rc0 == rc1 == 0 and "sdpa attention" in sdpa.splitlines()[0]
    assert eager.splitlines()[3:] == sdpa.splitlines()[3:]


def test_plan_explain_attention_flag_overrides_the_models_kernel(capsys, tmp_path):
    """A config.json's model runs sdpa unless --attention eager says otherwise; the JSON summary
    and the title both say which, and eager's peak is the higher."""
    cmd = ("plan", "--hf-config", tiny_hf_config(tmp_path), "--gpus", "4", "--stage", "3",
           "--explain", "--format", "json")
    runs = {}
    for flag in ((), ("--attention", "eager")):
        rc, out, _ = run_cli(capsys, *cmd, *flag)
        doc = json.loads(out)
        runs[doc["summary"]["attention"]] = doc
        assert rc == 0 and f"{doc['summary']['attention']} attention" in doc["tables"][0]["title"]
    assert set(runs) == {"sdpa", "eager"}
    assert runs["eager"]["summary"]["peak_bytes"] > runs["sdpa"]["summary"]["peak_bytes"]
