"""Dynamic loss scaling: an fp16 overflow on one rank is skipped by every rank, in every stage, and
the four stages stay bit-identical (P4).

Tolerance in the unscaling test, derived: a power-of-two scale s = 2^10 changes an fp16 rounding
only where a value is subnormal in fp16 (|x| < 2^-14; elsewhere fp16(x·s) = s·fp16(x) exactly).
There a rank's unscaled cast errs by at most half a subnormal step, 2^-25, the scaled one by 2^-35.
The reduced element is the mean of the per-rank casts rounded once more to fp16; a 2^-25 shift of
the mean can move that rounding across a tie, so the two runs' gradients may differ by one fp16
ulp (≤ 2^-10 relative) plus 2^-25 absolute (measured: 879 of 6,555 elements differ by one ulp).
After Adam's first step exp_avg = 0.1·g, so rtol = 2^-9 (one ulp, plus fp32 rounding) and
atol = 2^-27 (> 0.1·2^-25). Forgetting to unscale, or unscaling twice, is off by 1024×.
"""
from __future__ import annotations

import pytest
import torch

from tests.support.runs import (INJECT, OVERFLOW, SCALER, assert_same_training, config, odd_run, stage_id,
                                train_with)
from zerospec.render import robust_tables
from zerospec.optim.loss_scale import LossScale
from zerospec.training.run import train


@pytest.mark.parametrize("stage", [1, 2, 3], ids=stage_id)
@pytest.mark.claim("P4")
def test_an_overflow_on_one_rank_is_skipped_by_every_rank_and_stages_stay_bit_identical(stage, claim_values):
    """Rank 0's inf at step 2: every rank of every stage skips step 2; losses and weights equal DP's."""
    dp, zero = odd_run(0, **INJECT), odd_run(stage, **INJECT)
    assert_same_training(dp, zero)
    assert [[rep.skipped for rep in o.reports] for o in zero.ranks] == [[False, True, False, False, False]] * 4
    claim_values(f"step 2 skipped on 4/4 ranks, Δ vs DP = 0 ({stage_id(stage)})", "all ranks skip")


@pytest.mark.claim("P4")
def test_the_scale_backs_off_on_overflow_and_grows_after_clean_steps():
    """Scale 1024 → ×0.5 after the overflow at step 2 → ×2 after two clean steps (3, 4)."""
    assert odd_run(3, **INJECT).loss_scales == [1024.0, 1024.0, 512.0, 512.0, 1024.0]
    assert odd_run(3, **INJECT).skipped == [False, True, False, False, False]


@pytest.mark.claim("P4")
def test_a_skipped_step_leaves_weights_and_moments_untouched():
    """After the skipped step 2 every rank's master, exp_avg and exp_avg_sq are those after step 1."""
    snaps = {}

    def keep(step, stage):
        snaps[step, stage.ctx.rank] = [torch.cat([t.clone() for t in ts])
                                       for ts in (stage.master, stage.exp_avg, stage.exp_avg_sq)]
    train_with(config(3, steps=3, loss_scale=SCALER), OVERFLOW, on_step=keep)
    for r in range(4):
        assert all(torch.equal(a, b) for a, b in zip(snaps[1, r], snaps[2, r]))
        assert not torch.equal(snaps[2, r][0], snaps[3, r][0])   # step 3 does update


@pytest.mark.claim("P4")
def test_only_the_owner_sees_the_inf_so_the_decision_must_be_a_collective():
    """Stage 3 at step 2: only rank 3's gradient shard holds the inf; one all-reduce max per step decides."""
    finite = {}

    def look(step, stage):
        if step == 2:
            finite[stage.ctx.rank] = all(bool(torch.isfinite(stage.grad_for_step(i)).all())
                                         for i in range(len(stage.units)))
    r = train_with(config(3, steps=2, loss_scale=SCALER), OVERFLOW, on_step=look)
    assert finite == {0: True, 1: True, 2: True, 3: False}
    for step in (1, 2):
        votes = r.comm.records(0, step=step, phase="step", op="all_reduce")
        assert [(v.numel, v.dtype) for v in votes] == [(1, torch.float32)]


@pytest.mark.claim("P4")
def test_a_scale_too_large_for_fp16_backs_off_until_gradients_fit():
    """init 2^20: the first three steps overflow by themselves and are skipped, identically in DP and P_os+g+p."""
    ls = {"loss_scale": LossScale(init_scale=2.0 ** 20, growth_interval=2)}
    dp, zero = odd_run(0, **ls), odd_run(3, **ls)
    assert_same_training(dp, zero)
    assert zero.skipped[:4] == [True, True, True, False]
    assert zero.loss_scales[:4] == [2.0 ** 20, 2.0 ** 19, 2.0 ** 18, 2.0 ** 17]


@pytest.mark.claim("P4")
def test_unscaling_gives_the_unscaled_gradient_to_adam():
    """exp_avg after step 1 with scale 2^10 equals the unscaled run's within one fp16 rounding (derived above)."""
    moments = {}

    def keep(step, stage, tag):
        if stage.ctx.rank == 0:
            moments[tag] = torch.cat([m.clone() for m in stage.exp_avg])
    train(config(0, steps=1, loss_scale=SCALER), on_step=lambda s, st: keep(s, st, "scaled"))
    train(config(0, steps=1), on_step=lambda s, st: keep(s, st, "plain"))
    assert torch.allclose(moments["scaled"], moments["plain"], rtol=2.0 ** -9, atol=2.0 ** -27)
    assert moments["plain"].abs().max() > 1e-3       # not vacuous: the moments are far above atol


def test_loss_scaling_table(md_table_snapshot):
    """spec/loss_scaling.md's table: scale, skipped steps, votes and Δ vs DP per stage."""
    # losses within fp32 rounding per step (spec/determinism.md); scales, skips, votes, Δ exactly
    assert robust_tables.loss_scale_table([odd_run(s, **INJECT) for s in range(4)]) == \
        md_table_snapshot(steps=["loss at steps 1…"])
