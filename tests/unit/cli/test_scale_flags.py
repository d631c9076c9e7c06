"""``--loss-scale`` and ``--clip-grad-norm`` on ``zerospec scale``: the meta step runs them (the
step without overflow, spec/loss_scaling.md, spec/clipping.md)."""
from __future__ import annotations

import pytest

from tests.support.cli import run_cli

TINY = ("scale", "--layers", "1", "--hidden", "64", "--gpus", "4", "--vocab", "64", "--seq", "16",
        "--stages", "0,3")


def _collectives(capsys, *flags) -> dict[str, int]:
    code, out, err = run_cli(capsys, *TINY, *flags)
    assert code == 0, err
    rows = [line.split("|") for line in out.splitlines() if line.startswith("| ") and
            not line.startswith("| stage")]
    return {r[1].strip(): int(r[8]) for r in rows}


@pytest.mark.slow
def test_scale_measures_loss_scaling_and_clipping_on_meta(capsys):
    """Exit 0, and each stage's step has the overflow vote's all-reduce more, and stage 3 the norm
    bins' all-reduce too (stage 0 bins its whole gradient locally)."""
    plain = _collectives(capsys)
    both = _collectives(capsys, "--loss-scale", "65536", "--clip-grad-norm", "1.0")
    assert {s: both[s] - plain[s] for s in plain} == {"DP": 1, "P_os+g+p": 2}
