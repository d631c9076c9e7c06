"""The optimizer side of one step: agree on overflow, measure the norm, clip, then step or skip.

Order matters and is the same in every stage:

1. with loss scaling, every rank checks the gradient it owns for inf/nan and the flags are
   all-reduced (``max``): all ranks skip the same steps (zerospec/optim/loss_scale.py);
2. with clipping, the pre-clip global norm is assembled from per-chunk partial sums in one fixed
   order (zerospec/optim/clip.py) and the clip coefficient follows from it;
3. Adam runs on the owned elements with ``grad_mul = coefficient / scale``: unscaling and clipping
   in one correctly rounded multiply (the scale is a power of two by default, so unscaling alone
   is exact).

With model parallelism (N_m > 1) both decisions span the whole N_d × N_m grid (:class:`Reach`):
the vote is all-reduced over every rank, and the norm's integer bins over the ranks that together
own each element once, a parameter replicated across the MP group binned by MP rank 0 only — so
the norm is that of the one unsharded model's gradient, as Megatron-LM's clipping counts
tensor-parallel duplicates once.

A skipped step leaves master weights, moments and Adam's step count untouched (torch's GradScaler
skips ``optimizer.step()`` the same way), so bias correction counts only the updates that happened.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable

from .clip import clip_coefficient, global_norm
from .loss_scale import LossScaler, found_overflow


@dataclasses.dataclass(frozen=True)
class StepReport:
    skipped: bool
    scale: float          # the loss scale the updated gradients carried (DPU: the last step's)
    norm: float | None    # pre-clip global norm of the unscaled gradient (None: clipping off)
    deferred: bool = False  # DPU's step N: no update now, the gradient's comes next step (B8)


@dataclasses.dataclass(frozen=True)
class Reach:
    """Whom the step's two global decisions ask, on the N_d × N_m grid (None: the stage's DP
    group alone, the N_m = 1 rule: :func:`found_overflow`'s and :func:`global_norm`'s defaults).

    ``vote``: every rank of the grid; ``norm``: the ranks that together hold each gradient
    element once — the grid from stage 1 on (DP shards × MP slices), the MP group in stage 0
    (every DP rank holds its slice whole); ``counts(unit, param)``: whether this rank bins that
    parameter — a sliced one always, a replicated one on MP index 0 only."""
    vote: object
    norm: object
    counts: Callable[[str, str], bool]

    @classmethod
    def model_parallel(cls, stage, world, mp, mp_index: int, replicated) -> Reach:
        """The reach of MP rank ``mp_index``; ``replicated(unit, param)``: the model's predicate
        (zerospec/model/megatron.py), asked, never re-derived here."""
        return cls(world, world if stage.stage > 0 else mp,
                   lambda unit, param: mp_index == 0 or not replicated(unit, param))


class Updater:
    """One rank's optimizer driver: loss-scaler state and the count of Adam steps taken."""

    def __init__(self, stage, clip_grad_norm: float | None, scaler: LossScaler | None,
                 optim_step: int = 0, reach: Reach | None = None):
        self.stage = stage
        self.clip_grad_norm = clip_grad_norm
        self.scaler = scaler
        self.optim_step = optim_step
        self.reach = reach

    @property
    def scale(self) -> float:
        return self.scaler.scale if self.scaler is not None else 1.0

    def step(self) -> StepReport:
        scale = self.scale
        reach = self.reach
        if self.scaler is not None and found_overflow(self.stage, reach and reach.vote):
            self.scaler.update(found_inf=True)
            return StepReport(True, scale, math.nan if self.clip_grad_norm is not None else None)
        mul, norm = 1.0 / scale, None
        if self.clip_grad_norm is not None:
            norm = (global_norm(self.stage) if reach is None else
                    global_norm(self.stage, reach.norm, reach.counts)) / scale
            mul = clip_coefficient(norm, self.clip_grad_norm) / scale
        self.optim_step += 1
        self.stage.optimizer_step(self.optim_step, mul)
        if self.scaler is not None:
            self.scaler.update(found_inf=False)
        return StepReport(False, scale, norm)
