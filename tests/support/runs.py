"""The one cache of training runs the tests share: each distinct run is trained once per session
(per xdist worker), whatever engine it runs on.

Results are deterministic (the baton serialises the ranks; reductions sum in a fixed order), so one
cached run can serve every test that reads it. Three families, one cache:

- ``run(stage, n_d, model)``: the claim tests' stage × N_d × model grid;
- ``odd_run(stage, ...)``: the robustness tests (loss scaling, clipping, accumulation, checkpoints,
  determinism) on the ODD model at N = 4 (its units divide by no N, so padding is always
  exercised), optionally with an injected overflow;
- ``gloo(n_d, model, precision)`` and ``sim_matched(...)``: the engine tests' process runs and the
  simulator run with the rank processes' thread count.
"""
from __future__ import annotations

import contextlib

import pytest
import torch

from zerospec.cluster.threads import VirtualCluster
from zerospec.model.gpt import ODD, SMALL
from zerospec.optim.loss_scale import LossScale
from zerospec.paper import theory
from zerospec.testing.faults import inject_overflow
from zerospec.training.config import TrainConfig
from zerospec.training.sections import OptimOptions
from zerospec.training.result import Result
from zerospec.training.run import train, train_processes

MODELS = {"small": SMALL, "odd": ODD}
N_DS = (1, 2, 4, 8, 32)
# The default run checks each claim at the sizes that tell it apart (N = 1 has no peer, 2 and 4
# shard, and the ODD model's units divide by neither); the N = 8 and 32 runs repeat the same checks
# wider, and with them the spec's tables measured at N = 32 (test_tables_spec.py), in the slow
# cases (README, "Tests and benchmarks"), which CI runs too.
N_DS_DEFAULT = {"small": (1, 2, 4), "odd": (1, 2, 4)}
# the claim grid: step 1 from zero optimizer state, then steps whose traffic and memory repeat
# (every stage's step 2 equals its step 3 and on), so 3 steps show all of it
STEPS = 3
# the robustness runs, the engine's and the peers': an overflow at step 2, then enough clean steps
# for the loss scale to grow back (growth_interval = 2); across engines, rounding differences grow
# with the steps, so their bounds are checked over as many
LONG_STEPS = 5
SCALER = LossScale(init_scale=2.0 ** 10, growth_interval=2)   # grows every 2 clean steps
OVERFLOW = (2, 0)                    # (step, rank): rank 0's gradient overflows at step 2
INJECT = {"loss_scale": SCALER, "overflow": OVERFLOW}   # odd_run(stage, **INJECT)
CLIP = 0.5                           # below every measured norm (0.88–1.4)
THREADS = 1                          # the launcher's default torch threads per rank process

_CACHE: dict = {}


def cached(key, make):
    """``make()`` once per ``key`` (hashable: configs are frozen dataclasses)."""
    if key not in _CACHE:
        _CACHE[key] = make()
    return _CACHE[key]


def train_with(cfg: TrainConfig, overflow: tuple[int, int] | None = None, **train_kw) -> Result:
    """``train(cfg, **train_kw)``; ``overflow=(step, rank)``: that rank's gradient gets an inf at
    that step (zerospec.testing.faults.inject_overflow)."""
    hook = inject_overflow(*overflow) if overflow else contextlib.nullcontext()
    with hook:
        return train(cfg, **train_kw)


def trained(cfg: TrainConfig) -> Result:
    """The cached ``train(cfg)`` on the thread simulator."""
    return cached(("threads", cfg, None), lambda: train(cfg))


def run(stage: int, n_d: int, model: str = "small", steps: int = STEPS, **kw) -> Result:
    """The claim grid's run of ``stage`` on ``n_d`` virtual GPUs."""
    return trained(TrainConfig.of(stage=stage, n_d=n_d, model=MODELS[model], steps=steps, **kw))


def config(stage: int, n_d: int = 4, steps: int = LONG_STEPS, **kw) -> TrainConfig:
    """The robustness tests' config: the ODD model, N = 4 unless said."""
    return TrainConfig.of(stage=stage, n_d=n_d, model=ODD, steps=steps, **kw)


def odd_run(stage: int, n_d: int = 4, steps: int = LONG_STEPS, overflow: tuple[int, int] | None = None,
            **kw) -> Result:
    """The cached ``train_with(config(...), overflow)``."""
    cfg = config(stage, n_d, steps, **kw)
    return cached(("threads", cfg, overflow), lambda: train_with(cfg, overflow))


def gloo(n_d: int, model: str = "small", precision: str = "fp16") -> tuple:
    """Results of stages 0–3 on ``n_d`` gloo processes, in stage order (one launch for all four)."""
    cfgs = tuple(TrainConfig(stage=s, n_d=n_d, model=MODELS[model], steps=LONG_STEPS, timeout=60,
                             optim=OptimOptions(precision=precision)) for s in range(4))
    return cached(("gloo", cfgs), lambda: tuple(train_processes(list(cfgs))))


def sim_matched(stage: int, n_d: int, model: str, precision: str) -> Result:
    """The simulator with the rank processes' intra-op thread count: CPU kernels split their
    reductions by thread, so bit-equality across engines needs the same count (spec/engine.md)."""
    cfg = TrainConfig(stage=stage, n_d=n_d, model=MODELS[model], steps=LONG_STEPS,
                      optim=OptimOptions(precision=precision))
    return cached(("threads", cfg, THREADS),
                  lambda: train(cfg, cluster=VirtualCluster(n_d, torch_threads=THREADS)))


def wider(n_d: int, model: str = "small") -> list:
    """The marks of a case of ``model`` at ``n_d`` ranks: slow unless N_DS_DEFAULT lists it."""
    return [] if n_d in N_DS_DEFAULT[model] else [pytest.mark.slow]


def sizes(*n_ds: int) -> list:
    """``n_ds`` as parameters of the small model's runs, the wider ones marked slow (``wider``)."""
    return [pytest.param(n, marks=wider(n)) for n in n_ds]


def stage_cases(claim) -> list:
    """stage × N_d × model parameters with readable ids (``P_os+g/nd=32/small``), each marked with
    ``claim(stage)``'s id, read from theory's stage table (``lambda s: s.memory_claim``), and slow
    at the wider N_d (``wider``); the default model last, so its largest N_d run (4 in the default run,
    32 in the slow cases) speaks in the summary."""
    return [pytest.param(s, n, m, id=f"{stage_id(s)}/nd={n}/{m}",
                         marks=[pytest.mark.claim(claim(theory.stage(s)))] + wider(n, m))
            for m in reversed(list(MODELS)) for n in N_DS for s in range(4)]


def stage_id(stage: int) -> str:
    """The paper's label of ``stage``, as test ids carry it: DP, P_os, P_os+g, P_os+g+p."""
    return theory.stage(stage).label


def assert_same_training(a: Result, b: Result) -> None:
    """Every rank's per-step losses and the final master weights are equal bit for bit."""
    assert len(a.rank_losses[0]) >= 2, "a comparison of fewer than 2 steps is vacuous"
    for la, lb in zip(a.rank_losses, b.rank_losses, strict=True):
        assert all(torch.equal(x, y) for x, y in zip(la, lb, strict=True))
    assert a.master.keys() == b.master.keys()
    assert all(torch.equal(a.master[k], b.master[k]) for k in a.master)
