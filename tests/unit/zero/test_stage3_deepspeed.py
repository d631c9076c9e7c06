"""DeepSpeed's ZeRO-3 settings in zerospec (zero/stage3_deepspeed.py): the same bits, other ledgers."""
from __future__ import annotations

import pytest

from tests.support.runs import assert_same_training, odd_run
from zerospec.model import gpt
from zerospec.model.gpt import ODD, SMALL
from zerospec.model.units import make_units
from zerospec.training.config import TrainConfig
from zerospec.zero.stage3_deepspeed import reused_within

SETTINGS = {"reuse": dict(stage3_max_reuse_distance=10**9),
            "persist": dict(stage3_persistence_threshold=3000),      # ODD's blocks: 2895 elements
            "both": dict(stage3_persistence_threshold=100, stage3_max_reuse_distance=10**9),
            "with buckets": dict(stage3_persistence_threshold=100, bucket_elements=100)}


@pytest.mark.parametrize("name", list(SETTINGS))
def test_deepspeed_settings_change_no_bit_of_stage_3(name):
    """A persistent unit holds what a gather would deliver, a kept one what a re-gather would."""
    assert_same_training(odd_run(3), odd_run(3, **SETTINGS[name]))


def test_a_reuse_distance_past_2_psi_keeps_every_unit_from_forward_to_backward():
    """Nothing is gathered in backward; forward gathers each unit once (the embedding twice:
    lookup and tied head): with the reduce-scatter, 2Ψ-shaped instead of 3Ψ (DeepSpeed's default,
    spec/deepspeed.md). The kept units stay gathered: the peak holds all of them at once."""
    plain, kept = odd_run(3), odd_run(3, **SETTINGS["reuse"])
    for r in range(4):
        assert kept.comm.count(r, phase="backward", op="all_gather") == 0
        fwd = kept.comm.records(r, phase="forward", op="all_gather", step=1)
        assert [x.numel for x in fwd] == [u.padded for u in kept.units] + [kept.units[0].padded]
    assert kept.memory[0].peak["gathered"] == sum(u.padded for u in kept.units) * 2 \
        > plain.memory[0].peak["gathered"]


def test_a_persistent_unit_is_whole_on_every_rank_and_gathered_only_after_the_step():
    """Units of at most the threshold (ODD's ln_f, 30 elements) hold all their padded fp16 on every
    rank and are all-gathered once per step, in param_sync; the others as in stage 3."""
    plain, persist = odd_run(3), odd_run(3, stage3_persistence_threshold=100)
    ln_f = persist.units[-1]
    assert persist.model_states(0) - plain.model_states(0) == 2 * (ln_f.padded - ln_f.chunk)
    for r in range(4):
        gathers = persist.comm.records(r, op="all_gather", step=2)
        assert [x.phase for x in gathers if x.numel == ln_f.padded] == ["param_sync"]
        assert all(x.phase != "param_sync" for x in gathers if x.numel != ln_f.padded)


def test_reuse_distance_counts_the_elements_fetched_between_the_two_uses_strictly_below_it():
    """Order embed, b0, b1, ln_f, embed; backward mirrors it. Between b1's forward and backward
    use: ln_f, embed, embed, ln_f (2·2 + 2·10 = 24 elements); between b0's: that and b1 twice
    (24 + 2·5 = 34). Kept when that is < the distance, as DeepSpeed's
    PartitionedParameterCoordinator.__params_to_release stops once params_traversed (a sum of
    ds_numel) >= max_reuse_dist_in_numel: 24 does not keep b1, 25 does; 34 not b0, 35 does."""
    units = make_units([("embed", [("w", (10,))]), ("b0", [("w", (5,))]), ("b1", [("w", (5,))]),
                        ("ln_f", [("w", (2,))])], 1)
    order = [0, 1, 2, 3, 0]
    assert reused_within(order, units, 24) == {0, 3}
    assert reused_within(order, units, 25) == {0, 2, 3}
    assert reused_within(order, units, 34) == {0, 2, 3}
    assert reused_within(order, units, 35) == {0, 1, 2, 3}
    assert gpt.fetch_order(ODD) == [0, 1, 2, 3, 0]


@pytest.mark.parametrize("kw,match", [
    (dict(stage=2, stage3_max_reuse_distance=1), "is a ZeRO-3 setting"),
    (dict(stage=3, stage3_persistence_threshold=-1), "must be an integer >= 0, got -1")])
def test_deepspeed_settings_outside_zero_3_are_refused(kw, match):
    with pytest.raises(ValueError, match=match):
        TrainConfig.of(model=SMALL, **kw)


def _rows(table) -> dict:
    return {r[0]: r[1] for r in table.rows}


def test_plan_measures_a_deepspeed_zero3_config_on_meta_before_anyone_launches_it():
    """`plan --deepspeed-config --preset`: with a reuse distance past 2Ψ and no persistence,
    DeepSpeed's ZeRO-3 moves Ψ of forward gathers (the tied embedding twice) and Ψ of
    reduce-scatters — no backward gathers: read off the meta step's ledger, to the element."""
    from zerospec.model.presets import preset
    from zerospec.plan import ds_config
    from zerospec.plan.deepspeed import deepspeed_measured_table
    ds = ds_config.parse({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {
        "stage": 3, "stage3_param_persistence_threshold": 0, "stage3_max_reuse_distance": 10**12}})
    rows = _rows(deepspeed_measured_table(ds, "1.5B", 8))
    units = preset("1.5B").model.units(8)
    psi_p, embed = sum(u.padded for u in units), units[0].padded
    assert rows["elements sent per step"].startswith(f"{(2 * psi_p + embed) * 7 // 8:,} ")
    assert "  of which in backward" in rows and rows["  of which in backward"] == f"{psi_p * 7 // 8:,} elements"


def test_plan_preset_without_a_deepspeed_config_is_refused_in_one_line(capsys):
    from tests.support.cli import assert_usage_error
    assert_usage_error(capsys, "plan", "--preset", "1.5B",
                       named="does not take --preset, an option of `zerospec plan "
                             "--deepspeed-config` and `zerospec plan --explain`")


@pytest.mark.slow   # one meta step of GPT-2 1.5B: ~2 s
def test_deepspeeds_default_zero3_config_moves_2_68_psi_on_gpt2_1_5b_at_64_gpus(md_snapshot):
    """spec/deepspeed.md's figure: DeepSpeed's defaults (threshold 1e5, reuse distance 1e9,
    buckets 5e8) on 1.5B at N_d = 64 — the distance covers the later blocks only, so between
    2Ψ and 3Ψ: 2.681138Ψ of elements sent per GPU per step."""
    from zerospec.plan import ds_config
    from zerospec.plan.deepspeed import deepspeed_measured_table
    ds = ds_config.parse({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}})
    rows = _rows(deepspeed_measured_table(ds, "1.5B", 64))
    assert rows["elements sent per step"] == "4,176,170,775 = 2.681138Ψ"
    elements, in_psi = rows["elements sent per step"].split(" = ")
    assert md_snapshot == "\n".join([
        "| DeepSpeed's default ZeRO-3 config | elements sent per GPU per step | in Ψ |", "|---|---|---|",
        f"| GPT-2 1.5B, N_d = 64 | {elements} | {in_psi} |"])
