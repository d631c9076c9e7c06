"""zerospec's Adam is torch.optim.Adam's update rule, checked state by state.

Training against the single-process reference (tests/claims/test_equivalence.py) catches a wrong
lr, β1 or eps, but not a wrong β2: over 3 steps that moves weights by ~lr/40, under its lr/10
bound. Here both optimizers step the same vector with the same gradients and non-default
hyper-parameters, and every state is compared after every step.

Tolerance, derived: per step each side makes at most ~10 correctly rounded fp32 operations, on
values no larger than the largest element of the quantity compared, and the moments are averages
(β < 1), so an error does not grow from step to step beyond the steps' sum; over 4 steps that is
at most ~40 roundings of 2⁻²⁴ ≈ 2.4e-6 of that largest element. We allow 1e-5 of it. A wrong
constant changes a moment or the update by a fraction of its size (β2 = 0.95 against 0.99: v by 4
times), far beyond it.
"""
from __future__ import annotations

import pytest
import torch

from zerospec.optim.adam import AdamConfig, adam_update, reference_optimizer

STEPS, SIZE = 4, 1000
TOL = 1e-5   # of the largest element, see the module docstring


def _close(ours: torch.Tensor, theirs: torch.Tensor) -> bool:
    return float((ours - theirs).abs().max()) <= TOL * float(theirs.abs().max())


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_moments_and_weights_follow_torch_adam_every_step(weight_decay):
    """m, v and w equal torch.optim.Adam's within fp32 rounding after each of 4 steps."""
    # no default anywhere, and eps near the gradients' scale, so that each constant shows
    cfg = AdamConfig(lr=0.05, beta1=0.8, beta2=0.95, eps=0.1, weight_decay=weight_decay)
    gen = torch.Generator().manual_seed(0)
    w0 = torch.randn(SIZE, generator=gen)
    ours, m, v = w0.clone(), torch.zeros(SIZE), torch.zeros(SIZE)
    p = torch.nn.Parameter(w0.clone())
    opt = reference_optimizer([p], cfg)
    for step in range(1, STEPS + 1):
        grad = torch.randn(SIZE, generator=gen)
        adam_update(ours, m, v, grad, step, cfg)
        p.grad = grad.clone()
        opt.step()
        state = opt.state[p]
        assert _close(m, state["exp_avg"]), f"exp_avg differs at step {step}"
        assert _close(v, state["exp_avg_sq"]), f"exp_avg_sq differs at step {step}"
        assert _close(ours, p.detach()), f"the weights differ at step {step}"

