"""TrainConfig's sections (zerospec/training/sections.py): a few top-level fields, each option in
one section under a name no other section uses, each section checking its own values."""
from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from zerospec.training.config import TrainConfig
from zerospec.training.sections import (SECTIONS, BatchOptions, MeshOptions, OffloadOptions,
                                        QuantOptions, VariantOptions)

ROOT = Path(__file__).resolve().parents[3] / "zerospec"


def test_a_train_config_has_at_most_15_top_level_fields():
    """The rest of the options live in their feature's section."""
    assert len(dataclasses.fields(TrainConfig)) <= 15
    assert {f.name for f in dataclasses.fields(TrainConfig)} >= set(SECTIONS)


def test_an_option_name_is_unique_across_sections_and_the_top_level():
    """``cfg.hpz`` reads one field: no two sections (nor a top-level field) share a name."""
    names = [f.name for t in SECTIONS.values() for f in dataclasses.fields(t)]
    top = {f.name for f in dataclasses.fields(TrainConfig)}
    assert len(names) == len(set(names)) and not top & set(names)


def test_an_option_reads_through_its_section_and_nothing_else_does():
    """``cfg.hpz`` is ``cfg.mesh.hpz``; a name no section has is an AttributeError."""
    cfg = TrainConfig(stage=3, n_d=4, mesh=MeshOptions(gpus_per_node=4, hpz=2))
    assert (cfg.hpz, cfg.gpus_per_node, cfg.qwz) == (2, 4, False)
    with pytest.raises(AttributeError, match="nonesuch"):
        cfg.nonesuch


def test_of_and_replace_put_each_option_in_its_section():
    """``TrainConfig.of`` / ``.replace`` by option names equal the sectioned construction."""
    made = TrainConfig(stage=3, n_d=4, mesh=MeshOptions(gpus_per_node=4, hpz=2),
                       quant=QuantOptions(qwz=True))
    assert TrainConfig.of(stage=3, n_d=4, gpus_per_node=4, hpz=2, qwz=True) == made
    assert TrainConfig(stage=3, n_d=4).replace(gpus_per_node=4, hpz=2, qwz=True) == made
    with pytest.raises(ValueError, match="unknown TrainConfig option.*hpZ"):
        TrainConfig.of(hpZ=2)


@pytest.mark.parametrize("make,named", [
    (lambda: QuantOptions(qwz=1), "qwz must be True or False, got 1"),
    (lambda: BatchOptions(grad_accum_steps=0), "grad_accum_steps must be an integer >= 1, got 0"),
    (lambda: VariantOptions(stage3_max_reuse_distance=-1),
     "stage3_max_reuse_distance must be an integer >= 0, got -1"),
    (lambda: VariantOptions(zero1_comm="ring"), "unknown ZeRO-1 variant 'ring'"),
    (lambda: OffloadOptions(offload_mode="gpu"), "offload_mode must be one of paper, deepspeed, got 'gpu'"),
    (lambda: OffloadOptions(offload_optimizer="disk"),
     "offload_optimizer must be one of cpu, nvme or None, got 'disk'"),
])
def test_a_section_refuses_a_bad_value_when_it_is_made(make, named):
    """Before any TrainConfig: the section names the field, the value and what is accepted."""
    with pytest.raises(ValueError, match=named):
        make()


def test_the_offload_sections_choices_are_the_offload_packages():
    """The section's tiers, modes and partitions are the ones zerospec/offload/ builds."""
    from zerospec import offload
    fields = {f.name: f.metadata["choices"] for f in dataclasses.fields(OffloadOptions)}
    assert fields["offload_optimizer"] == fields["offload_params"] == offload.TIERS
    assert (fields["offload_mode"], fields["offload_partition"]) == (offload.MODES, offload.PARTITIONS)


def test_no_module_outside_the_command_line_imports_argparse():
    """argparse lives in zerospec/cli/ (and the entry point, zerospec/__main__.py)."""
    users = []
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("cli/") or rel == "__main__.py":
            continue
        text = path.read_text()
        if "argparse" not in text:   # no import of it can be there: no parse needed
            continue
        for node in ast.walk(ast.parse(text)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) else []
            users += [rel for n in names if n == "argparse"]
    assert not users
