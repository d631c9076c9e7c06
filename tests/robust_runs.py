"""Runs shared by the robustness claim tests (loss scaling, clipping, accumulation, checkpoints,
determinism): the ODD model (units divisible by no N, so padding is always exercised) at N = 4,
each distinct config trained once per session."""
from __future__ import annotations

import contextlib
import functools

import torch

from zerospec.optim.loss_scale import LossScale
from zerospec.model.gpt import ODD
from zerospec.training.result import Result
from zerospec.training.config import TrainConfig
from zerospec.testing.faults import inject_overflow
from zerospec.training.run import train

SCALER = LossScale(init_scale=2.0 ** 10, growth_interval=2)   # grows every 2 clean steps
OVERFLOW = (2, 0)                                  # (step, rank): rank 0's gradient overflows at step 2
INJECT = {"loss_scale": SCALER, "overflow": OVERFLOW}  # run(stage, **INJECT), train_with(cfg, OVERFLOW)
CLIP = 0.5                                                       # below every measured norm (0.88–1.4)
STEPS = 5


def config(stage: int, n_d: int = 4, steps: int = STEPS, **kw) -> TrainConfig:
    return TrainConfig(stage=stage, n_d=n_d, model=ODD, steps=steps, **kw)


def train_with(cfg: TrainConfig, overflow: tuple[int, int] | None = None, **train_kw) -> Result:
    """``train(cfg, **train_kw)``; ``overflow=(step, rank)``: that rank's gradient gets an inf at
    that step (zerospec.testing.faults.inject_overflow)."""
    hook = inject_overflow(*overflow) if overflow else contextlib.nullcontext()
    with hook:
        return train(cfg, **train_kw)


def run(stage: int, n_d: int = 4, steps: int = STEPS, overflow: tuple[int, int] | None = None,
        **kw) -> Result:
    """The cached ``train_with(config(...), overflow)`` (arguments normalised, so any spelling
    hits the cache)."""
    return _run(stage, n_d, steps, overflow, tuple(sorted(kw.items())))


@functools.lru_cache(maxsize=None)
def _run(stage: int, n_d: int, steps: int, overflow: tuple | None, kw: tuple) -> Result:
    return train_with(config(stage, n_d, steps, **dict(kw)), overflow)


def assert_same_training(a: Result, b: Result) -> None:
    """Every rank's per-step losses and the final master weights are equal bit for bit."""
    assert len(a.rank_losses[0]) == len(b.rank_losses[0]) >= 2
    for la, lb in zip(a.rank_losses, b.rank_losses):
        assert all(torch.equal(x, y) for x, y in zip(la, lb))
    assert a.master.keys() == b.master.keys()
    assert all(torch.equal(a.master[k], b.master[k]) for k in a.master)
