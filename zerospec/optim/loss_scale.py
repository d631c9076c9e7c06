"""Dynamic loss scaling for fp16 gradients, with the overflow decision agreed by every rank.

fp16 has 5 exponent bits: gradients below 2^-24 flush to zero. Loss scaling multiplies them by
``scale`` before they are stored in fp16 and divides again before the optimizer uses them. On a
CPU the backward pass computes in fp32, so the scale is applied where the fp32 gradient is cast to
the stored fp16 gradient (:attr:`zerospec.zero.fetch.ParamFetcher.grad_scale`) — the cast is where
a GPU's fp16 backward would overflow or underflow, so the same values come out.

If any element of the reduced gradient is inf or nan, the step is skipped and the scale backs off;
after ``growth_interval`` clean steps in a row it grows. The rule is torch's ``GradScaler``
(``torch._amp_update_scale_``), which tests/unit/optim/test_loss_scale.py uses as its oracle.

Overflow detection needs every rank's opinion. In stages 2 and 3 a rank holds only its shard of
the reduced gradient, so an inf produced on rank 0 may land in rank 3's shard alone; each rank
checks what it owns and the flags are combined with an all-reduce ``max`` (one element, booked in
the comm ledger like every collective), so all ranks skip the same steps. Stages 0 and 1 pay the
same collective: one algorithm, four layouts.

On meta tensors (which measure memory and traffic, not values) every rank makes the same checks
and the same vote, and the step is taken as the no-overflow step: it does every allocation and
collective a skipped step does, then the update, so what it measures bounds the skipped step
(spec/loss_scaling.md).
"""
from __future__ import annotations

import dataclasses
import math
import struct

import torch


def _f32(x: float) -> float:
    """``x`` rounded to fp32: the scale is an fp32 number, as in torch's GradScaler."""
    return struct.unpack("f", struct.pack("f", x))[0]


@dataclasses.dataclass(frozen=True)
class LossScale:
    """Hyper-parameters of dynamic loss scaling (torch.amp.GradScaler's defaults)."""

    init_scale: float = 2.0 ** 16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000

    def __post_init__(self):
        if not (isinstance(self.init_scale, (int, float)) and math.isfinite(self.init_scale)
                and self.init_scale > 0):
            raise ValueError(f"LossScale.init_scale must be a finite number > 0, got {self.init_scale!r}")
        if not (isinstance(self.growth_factor, (int, float)) and math.isfinite(self.growth_factor)
                and self.growth_factor > 1):
            raise ValueError(f"LossScale.growth_factor must be a finite number > 1, got "
                             f"{self.growth_factor!r}")
        if not (isinstance(self.backoff_factor, (int, float)) and 0 < self.backoff_factor < 1):
            raise ValueError(f"LossScale.backoff_factor must be in (0, 1), got {self.backoff_factor!r}")
        if not isinstance(self.growth_interval, int) or isinstance(self.growth_interval, bool) \
                or self.growth_interval < 1:
            raise ValueError(f"LossScale.growth_interval must be an integer >= 1, got "
                             f"{self.growth_interval!r}")


class LossScaler:
    """One rank's scaler state: the current scale and the count of clean steps since a change."""

    def __init__(self, cfg: LossScale, scale: float | None = None, growth_tracker: int = 0):
        self.cfg = cfg
        self.scale = _f32(cfg.init_scale if scale is None else scale)
        self.growth_tracker = growth_tracker

    def update(self, found_inf: bool) -> None:
        """After a step: back off on overflow, grow after ``growth_interval`` clean steps."""
        if found_inf:
            self.scale = _f32(self.scale * self.cfg.backoff_factor)
            self.growth_tracker = 0
            return
        self.growth_tracker += 1
        if self.growth_tracker == self.cfg.growth_interval:
            self.scale = _f32(self.scale * self.cfg.growth_factor)
            self.growth_tracker = 0

    def state_dict(self) -> dict:
        return {"scale": self.scale, "growth_tracker": self.growth_tracker}


def found_overflow(stage, comm=None) -> bool:
    """Whether any rank's owned gradient holds an inf or nan: an all-reduce ``max`` of a flag
    over ``comm`` — the stage's DP group by default; with model parallelism every rank of the
    N_d × N_m grid (an inf in one MP rank's slice must stop its peers too, or the replica's
    slices would step apart)."""
    if stage.ctx.device.type == "meta":   # no values: the same checks and vote, no overflow
        for i in range(len(stage.units)):
            torch.isfinite(stage.grad_for_step(i)).all()
        flag = torch.zeros(1, device=stage.ctx.device)
        (stage.comm if comm is None else comm).all_reduce(flag, "max")
        return False
    bad = any(not bool(torch.isfinite(stage.grad_for_step(i)).all()) for i in range(len(stage.units)))
    flag = torch.tensor([1.0 if bad else 0.0], device=stage.ctx.device)
    (stage.comm if comm is None else comm).all_reduce(flag, "max")
    return bool(flag.item() > 0)

