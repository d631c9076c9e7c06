"""Global-norm clipping from shards: every stage computes the same pre-clip norm, bit for bit, and
it is the exact norm of the whole, unsharded gradient, rounded once (P5).

No tolerance anywhere: zerospec/optim/clip.py sums the squares exactly (integer bins per binade), so the
oracle is ``math.fsum`` over the full gradient's squares (each square of an fp32 number is exact
in fp64; fsum returns the correctly rounded exact sum), compared with ``==``.
"""
from __future__ import annotations

import math

import pytest
import torch

from tests.support.runs import CLIP, assert_same_training, config, odd_run, stage_id
from zerospec.render import robust_tables
from zerospec.evaluation.runs import memoised
from zerospec.training.run import train


@pytest.mark.parametrize("stage,n_d", [   # N = 4: the table's runs; N = 3 (a non-divisor): stage 3's
    pytest.param(s, n, id=f"{stage_id(s)}/nd={n}", marks=[pytest.mark.slow] * (n == 3 and s != 3))
    for n in (4, 3) for s in (1, 2, 3)])
@pytest.mark.claim("P5")
def test_clipped_training_is_bit_identical_in_every_stage(stage, n_d, claim_values):
    """Clipping at 0.5 (active every step): losses, weights and pre-clip norms equal DP's bit for bit."""
    dp, zero = odd_run(0, n_d, clip_grad_norm=CLIP), odd_run(stage, n_d, clip_grad_norm=CLIP)
    assert_same_training(dp, zero)
    assert zero.grad_norms == dp.grad_norms
    assert all(n > CLIP for n in dp.grad_norms)          # clipping acted at every step
    claim_values(f"norms {dp.grad_norms[0]:.7f}… equal, Δ vs DP = 0 ({stage_id(stage)}, N={n_d})",
                 "same algorithm")


@memoised   # test_clipping_table reads the N = 4 run a parametrized case trained
def _unsharded_norms(n_d: int = 4) -> tuple[list[float], list[float]]:
    """(fsum norms of DP's full reduced gradient per step, the norms the run reported)."""
    full = []

    def look(step, stage):
        if stage.ctx.rank == 0:
            g = torch.cat([t.float() for t in stage.grad16]).tolist()
            full.append(math.sqrt(math.fsum(x * x for x in g)))
    r = train(config(0, n_d, clip_grad_norm=CLIP), on_step=look)
    return full, r.grad_norms


@pytest.mark.parametrize("n_d", [4, pytest.param(3, marks=pytest.mark.slow)])
@pytest.mark.claim("P5")
def test_the_norm_from_shards_is_the_exact_unsharded_norm(n_d):
    """The reported pre-clip norm is the correctly rounded ‖g‖ of DP's full gradient (math.fsum), exactly."""
    full, reported = _unsharded_norms(n_d)
    assert reported == full


@pytest.mark.claim("P5")
def test_the_norm_does_not_depend_on_how_the_gradient_is_sharded():
    """The same 8 micro-batches on N×G = 1×8, 2×4, 4×2, 8×1 (exact sums): the same norms and weights."""
    runs = [odd_run(3, n, steps=3, global_batch=16, grad_accum_steps=g, exact_grads=True, clip_grad_norm=CLIP)
            for n, g in [(1, 8), (2, 4), (4, 2), (8, 1)]]
    assert all(r.grad_norms == runs[0].grad_norms for r in runs)
    assert all(torch.equal(r.master[k], runs[0].master[k]) for r in runs for k in r.master)


@pytest.mark.claim("P5")
def test_the_clipped_gradient_has_norm_max_norm():
    """After step 1, exp_avg = (1 − β1)·g·max_norm/‖g‖: the gradient Adam saw has norm 0.5."""
    seen = {}

    def look(step, stage):
        if stage.ctx.rank == 0:
            seen["g"] = torch.cat([g.double() for g in stage.grad16])
            seen["m"] = torch.cat([m.double() for m in stage.exp_avg])
    r = train(config(0, steps=1, clip_grad_norm=CLIP), on_step=look)
    expected = 0.1 * seen["g"] * CLIP / (r.grad_norms[0] + 1e-6)
    assert torch.allclose(seen["m"], expected, rtol=1e-6, atol=1e-12)
    assert abs(float(torch.linalg.vector_norm(seen["m"])) / 0.1 - CLIP) <= 1e-6


@pytest.mark.claim("P5")
def test_a_threshold_above_the_norm_changes_nothing():
    """max_norm = 100 (above every norm): the trajectory is the unclipped one, bit for bit."""
    assert_same_training(odd_run(3, clip_grad_norm=100.0), odd_run(3))


def test_clipping_table(md_table_snapshot):
    """spec/clipping.md's table: pre-clip norms per stage next to the exact unsharded norm."""
    full, _ = _unsharded_norms()
    rs = [odd_run(s, clip_grad_norm=CLIP) for s in range(4)]
    # norms within fp32 rounding per step (spec/determinism.md); counts and Δ = 0 exactly
    assert robust_tables.clip_table(rs, full) == md_table_snapshot(steps=["pre-clip ‖g‖ at steps 1…"])
