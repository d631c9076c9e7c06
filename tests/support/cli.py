"""The CLI through its real entry point, as the CLI tests call it (``zerospec.__main__.main``)."""
from __future__ import annotations

from zerospec.__main__ import main


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``zerospec *argv`` run in this process."""
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def assert_usage_error(capsys, *argv, named: str) -> None:
    """Bad input: exit code 2, nothing on stdout, one stderr line ``zerospec: error: …`` naming it."""
    rc, out, err = run_cli(capsys, *argv)
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("zerospec: error:") and named in err, err


def tiny_hf_config(tmp_path) -> str:
    """A GPT-2 config.json of 2 blocks × 64 (vocabulary 64, context 16): `plan --explain
    --hf-config` steps it on meta in well under a second."""
    import json
    from zerospec.model.gpt import GPTConfig
    from zerospec.model.hf_config import to_hf
    path = tmp_path / "config.json"
    path.write_text(json.dumps(to_hf(GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2,
                                               n_embd=64), "GPT2LMHeadModel")))
    return str(path)
