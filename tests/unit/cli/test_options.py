"""Every section flag is declared once (zerospec/training/sections.py) and `train`, `scale` and
`plan` take theirs from it: one name, one help, one default."""
from __future__ import annotations

import dataclasses

import pytest

from zerospec.__main__ import build_parser
from zerospec.training.sections import SECTIONS


def _actions(command: str) -> dict:
    """The command's options; plan's, of its three modes together."""
    parser = build_parser(command)
    sub = next(a for a in parser._actions if a.dest == "command").choices[command]
    modes = [a for a in sub._actions if a.dest == "mode"]
    parsers = list(modes[0].choices.values()) if modes else [sub]
    return {s: a for p in parsers for a in p._actions for s in a.option_strings}


FIELDS = {f.metadata["flag"]: f for t in SECTIONS.values() for f in dataclasses.fields(t)
          if f.metadata.get("flag")}


# plan's --mp is its own: a comma list of MP degrees (--table2's columns, --explain's one grid)
OWN = {"plan": {"--mp"}}


@pytest.mark.parametrize("command", ["train", "scale", "plan"])
def test_each_section_flag_of_a_command_is_its_fields(command):
    """Same help, same choices, the field's name as dest, and no default of its own (the
    section's applies)."""
    actions = _actions(command)
    mine = {flag: a for flag, a in actions.items() if flag in FIELDS and flag not in OWN.get(command, ())}
    assert mine, command
    for flag, a in mine.items():
        f = FIELDS[flag]
        assert (a.dest, a.default) == (f.name, None), flag
        assert a.help.startswith(f.metadata["help"]), flag
        assert a.choices == f.metadata["choices"] or a.nargs == 0, flag


def test_train_takes_every_section_flag():
    """`zerospec train` exposes every option that has a flag."""
    assert set(FIELDS) <= set(_actions("train"))


def test_a_flag_not_given_leaves_the_sections_default():
    """`train` without --hpz builds hpz = 1, the section's default."""
    from zerospec.cli.train import _config
    args = build_parser("train").parse_args(["train", "--stage", "3"])
    cfg = _config(args, 4)
    assert (cfg.hpz, cfg.offload_mode, cfg.zero1_comm, cfg.precision) == (1, "paper", "reduce_scatter", "fp16")
    args = build_parser("train").parse_args(["train", "--loss-scale", "1024", "--mp", "2",
                                             "--bucket-size", "model"])
    cfg = _config(args, 4)
    assert (cfg.loss_scale.init_scale, cfg.n_m, cfg.n_d, cfg.bucket_elements) == (1024.0, 2, 2, "model")
