"""ZeRO changes where bytes live, not the math: every stage trains bit-identically (P1).

Tolerance for the single-process reference (the only comparison that is not exact), derived:
the reference takes one mean over the global batch where the ranks take micro-batch means and then
a mean over ranks, and torch's Adam orders its operations differently (lerp, addcmul, addcdiv)
from ours. Losses: every difference is fp32 summation order; cascade summation of n terms errs
by at most ~log2(n)·u relative (u = 2^-24), ≤ 12u ≈ 7.2e-7 for the 4096 tokens of our largest
batch, so we allow 1e-6 relative. Weights: Adam normalises each update by √v̂, so a rounding-level
difference in a near-zero gradient can change that element's update by O(1) of its size, but no
update exceeds ~lr; over 3 steps a wrong optimizer (lr, beta1, eps, bias correction, a missing
mean) moves weights by ≥ lr, so |Δw| ≤ lr/10 separates rounding from bugs (measured: ≤ 1.4e-5 =
lr/72). A wrong beta2 moves them by only ~lr/40 in so few steps: tests/unit/optim/test_adam.py,
which compares Adam's moments with torch's step by step, catches that.
"""
from __future__ import annotations

import pytest
import torch

from tests.support.runs import MODELS, N_DS, assert_same_training, run, stage_id, wider
from zerospec.testing.reference import reference_train

CASES = [pytest.param(s, n, m, v, id=f"{stage_id(s)}{'-allreduce' if v == 'all_reduce' else ''}/nd={n}/{m}",
                      marks=wider(n, m))
         for m in MODELS for n in N_DS for s, v in [(1, "reduce_scatter"), (2, None), (3, None)]
         ] + [pytest.param(1, n, "small", "all_reduce", id=f"P_os-allreduce/nd={n}/small", marks=wider(n))
              for n in (2, 8, 32)]


@pytest.mark.parametrize("stage,n_d,model,variant", CASES)
@pytest.mark.claim("P1")
def test_every_stage_is_bit_identical_to_data_parallelism(stage, n_d, model, variant, claim_values):
    """Same seed and data: per-step losses and final master weights equal stage 0's bit for bit."""
    kw = {"zero1_comm": variant} if variant else {}
    dp, zero = run(0, n_d, model), run(stage, n_d, model, **kw)
    assert_same_training(dp, zero)
    claim_values(f"max|Δloss| = 0, max|Δmaster| = 0 ({stage_id(stage)}, N={n_d})", "identical")


@pytest.mark.parametrize("n_d,model", [(1, "small"), (4, "small"), (8, "odd")])
@pytest.mark.claim("P1")
def test_data_parallelism_equals_single_process_training(n_d, model):
    """N ranks with a gradient mean equal one process on the global batch (fp32, tolerance derived above)."""
    r = run(0, n_d, model, precision="fp32")
    losses, weights = reference_train(r.config)
    for ours, ref in zip(r.losses, losses):
        assert abs(ours - ref) <= 1e-6 * abs(ref)
    lr = r.config.adam.lr
    assert max(float((r.master[k] - weights[k]).abs().max()) for k in weights) <= lr / 10


def test_losses_fall_so_the_comparison_is_not_vacuous():
    """The runs being compared actually learn (a frozen model would be trivially identical)."""
    losses = run(0, 4).losses
    assert losses[-1] < losses[0]


def test_repeated_runs_are_bit_identical():
    """Determinism: the same config twice gives the same bits (the baton fixes the schedule)."""
    from zerospec.training.config import TrainConfig
    from zerospec.training.run import train
    cfg = TrainConfig(stage=3, n_d=4, model=MODELS["odd"], steps=2)
    a, b = train(cfg), train(cfg)
    assert all(torch.equal(a.master[k], b.master[k]) for k in a.master) and a.losses == b.losses


@pytest.mark.parametrize("stage,buckets", [(2, None), (3, None), (2, 1000), (3, 1000)],
                         ids=["P_os+g", "P_os+g+p", "P_os+g/C_B", "P_os+g+p/C_B"])
@pytest.mark.claim("P1")
def test_no_stage_reads_memory_it_never_wrote(stage, buckets):
    """With every non-zeroed allocation filled with NaN, stages 2 and 3 still equal stage 0 bit for bit."""
    from tests.support.runs import SCALER, config
    from zerospec.testing.faults import uninitialized_memory
    from zerospec.training.run import train
    # the ODD model pads every unit, and the loss scaler's overflow check reads the whole owned
    # shard, padding included: a NaN read anywhere (a gradient slot's padding, a gathered unit's
    # real elements) makes the ranks skip a step that stage 0 takes
    kw = {"steps": 2, "loss_scale": SCALER, "bucket_elements": buckets}
    dp = train(config(0, **kw))
    with uninitialized_memory() as seen:
        zero = train(config(stage, **kw))
    assert seen["poisoned"] > 0
    assert_same_training(dp, zero)
