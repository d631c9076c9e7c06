"""The optimizer side of one step: agree on overflow, measure the norm, clip, then step or skip.

Order matters and is the same in every stage:

1. with loss scaling, every rank checks the gradient it owns for inf/nan and the flags are
   all-reduced (``max``): all ranks skip the same steps (zerospec/optim/loss_scale.py);
2. with clipping, the pre-clip global norm is assembled from per-chunk partial sums in one fixed
   order (zerospec/optim/clip.py) and the clip coefficient follows from it;
3. Adam runs on the owned elements with ``grad_mul = coefficient / scale``: unscaling and clipping
   in one correctly rounded multiply (the scale is a power of two by default, so unscaling alone
   is exact).

A skipped step leaves master weights, moments and Adam's step count untouched (torch's GradScaler
skips ``optimizer.step()`` the same way), so bias correction counts only the updates that happened.
"""
from __future__ import annotations

import dataclasses
import math

from .clip import clip_coefficient, global_norm
from .loss_scale import LossScaler, found_overflow


@dataclasses.dataclass(frozen=True)
class StepReport:
    skipped: bool
    scale: float          # the loss scale this step's gradients carried
    norm: float | None    # pre-clip global norm of the unscaled gradient (None: clipping off)


class Updater:
    """One rank's optimizer driver: loss-scaler state and the count of Adam steps taken."""

    def __init__(self, stage, clip_grad_norm: float | None, scaler: LossScaler | None,
                 optim_step: int = 0):
        self.stage = stage
        self.clip_grad_norm = clip_grad_norm
        self.scaler = scaler
        self.optim_step = optim_step

    @property
    def scale(self) -> float:
        return self.scaler.scale if self.scaler is not None else 1.0

    def step(self) -> StepReport:
        scale = self.scale
        if self.scaler is not None and found_overflow(self.stage):
            self.scaler.update(found_inf=True)
            return StepReport(True, scale, math.nan if self.clip_grad_norm is not None else None)
        mul, norm = 1.0 / scale, None
        if self.clip_grad_norm is not None:
            norm = global_norm(self.stage) / scale
            mul = clip_coefficient(norm, self.clip_grad_norm) / scale
        self.optim_step += 1
        self.stage.optimizer_step(self.optim_step, mul)
        if self.scaler is not None:
            self.scaler.update(found_inf=False)
        return StepReport(False, scale, norm)
