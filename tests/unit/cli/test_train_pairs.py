"""`zerospec train` accepts every pair the combination table composes (spec/combine.md): the
flags each feature's settings declare parse into the TrainConfig the table's walk trains
(tests/claims/test_combine.py), field for field. Meta tensors are `zerospec scale`'s, the
run-level features `--save`/`--resume` and `--backend torch` (tests/unit/cli/test_train_json.py)."""
from __future__ import annotations

import dataclasses
import itertools

import pytest

from zerospec.cli import train as cli_train
from zerospec.cli.main import build_parser
from zerospec.cli.options import flag
from zerospec.model import gpt
from zerospec.optim.loss_scale import LossScale
from zerospec.training import combine
from zerospec.training.config import TrainConfig

ON_TRAIN = [f.name for f in combine.FEATURES if f.name not in (*combine.RUN_LEVEL, "meta")]
PAIRS = [p for p in itertools.combinations(ON_TRAIN, 2) if combine.refusal(*p) is None]


def _argv(kw: dict) -> list[str]:
    """The command line a user would type for TrainConfig keywords ``kw``."""
    n = kw["n_d"] * kw.get("n_m", 1)
    argv = ["train", "--stage", str(kw["stage"]), "--ranks", str(n), "--steps", "2"]
    for k, v in kw.items():
        if k in ("stage", "n_d"):
            continue
        if v is True:
            argv.append(flag(k))
        else:
            argv += [flag(k), str(v.init_scale if isinstance(v, LossScale) else v)]
    return argv


def test_every_composing_pair_is_a_train_command():
    """Each composing pair's flags parse into the walk's TrainConfig (every field but the model,
    which is train's --model small here)."""
    assert len(PAIRS) > 250
    parser = build_parser("train")
    for pair in PAIRS:
        kw = combine.settings(pair)
        args = parser.parse_args(_argv(kw))
        got = cli_train._config(args, kw["n_d"] * kw.get("n_m", 1))
        want = TrainConfig.of(model=gpt.SMALL, steps=2, **kw)
        assert dataclasses.replace(got, seed=want.seed, timeout=want.timeout) == want, pair


def test_a_refused_pair_on_the_command_line_is_the_tables_message(capsys):
    """A refused pair exits 2 with the table's message on one line."""
    from zerospec.cli.main import main
    kw = combine.settings(("fsdp2", "dpu"))
    assert main(_argv(kw)) == 2
    err = capsys.readouterr().err.strip()
    assert combine.message("dpu", "fsdp2") in err and "\n" not in err
