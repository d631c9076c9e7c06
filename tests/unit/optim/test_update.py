"""zerospec.optim.update.Updater: a step skipped for an fp16 overflow is not an Adam step.

Adam's bias correction divides by 1 − β^t, where t counts the updates applied. If a skipped step
still advanced t, every later update would be scaled as if one more step had happened (torch's
GradScaler skips ``optimizer.step()`` entirely for the same reason). The stage here is the smallest
one Updater drives — one rank, one unit, the real Adam on one fp32 master — so the rule is stated
on Updater itself, without a training run or a fault-injection hook.
"""
from __future__ import annotations

from types import SimpleNamespace

import torch

from zerospec.optim.adam import AdamConfig, adam_update
from zerospec.optim.loss_scale import LossScale, LossScaler
from zerospec.optim.update import Updater

SCALE = 2.0 ** 4
GRADS = (0.5, 0.25, -1.0)        # one value per clean step, times the loss scale (exact in fp16)


class OneRankStage:
    """One unit of four fp16 gradients on one rank; Adam on its fp32 master, moments beside it."""

    units = (None,)
    ctx = SimpleNamespace(device=torch.device("cpu"))

    def __init__(self):
        self.master = torch.tensor([1.0, -2.0, 3.0, 0.5])
        self.exp_avg, self.exp_avg_sq = torch.zeros(4), torch.zeros(4)
        self.grad = torch.zeros(4, dtype=torch.float16)
        self.adam_steps: list[int] = []           # the step count each applied update used
        self.comm = SimpleNamespace(all_reduce=lambda t, op: t)   # max over one rank: itself

    def grad_for_step(self, i: int) -> torch.Tensor:
        return self.grad

    def optimizer_step(self, step: int, grad_mul: float = 1.0) -> None:
        self.adam_steps.append(step)
        adam_update(self.master, self.exp_avg, self.exp_avg_sq, self.grad, step, AdamConfig(), grad_mul)


def train(grads) -> tuple[OneRankStage, Updater, list[bool]]:
    """Run Updater.step once per gradient value (``inf``: an overflowed backward)."""
    stage = OneRankStage()
    updater = Updater(stage, clip_grad_norm=None, scaler=LossScaler(LossScale(init_scale=SCALE)))
    skipped = []
    for g in grads:
        stage.grad.fill_(g * updater.scale)       # the loss-scaled gradient backward would leave
        skipped.append(updater.step().skipped)
    return stage, updater, skipped


def test_a_skipped_step_leaves_adams_step_count_at_the_updates_applied():
    """After clean, overflow, clean: Adam has taken 2 steps, the third update used t = 2, and
    master and moments equal those of the two clean steps alone, bit for bit."""
    stage, updater, skipped = train([GRADS[0], float("inf"), GRADS[1]])
    clean, clean_updater, _ = train([GRADS[0], GRADS[1]])
    assert skipped == [False, True, False]
    assert updater.optim_step == 2 and stage.adam_steps == [1, 2]
    for name in ("master", "exp_avg", "exp_avg_sq"):
        assert torch.equal(getattr(stage, name), getattr(clean, name)), name
    assert updater.scale == SCALE / 2 and clean_updater.scale == SCALE   # only the scale backed off


def test_every_skipped_step_is_skipped_whole_even_in_a_row():
    """Two overflows in a row before any update: the first update is still Adam's step 1."""
    stage, updater, skipped = train([float("inf"), float("nan"), GRADS[2]])
    clean, _, _ = train([GRADS[2]])
    assert skipped == [True, True, False]
    assert updater.optim_step == 1 and stage.adam_steps == [1]
    assert torch.equal(stage.master, clean.master)
