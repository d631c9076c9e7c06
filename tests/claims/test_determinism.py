"""Determinism: the same config gives the same bits, run after run and whatever order the ranks
are scheduled in (P8).

The virtual cluster runs one rank at a time and hands the baton on in a fixed order, so repeated
runs are trivially alike. The jitter hook (``VirtualCluster(jitter=seed)``) removes that crutch:
the first rank and every next rank are drawn at random, and each hand-off sleeps a random while.
Results must not move, because no computation depends on arrival order: reductions add in rank
order (comm/sim.py), the overflow vote is a max, the norm is an integer sum.
"""
from __future__ import annotations

import pytest
import torch

from tests.support.runs import CLIP, OVERFLOW, SCALER, config, train_with
from zerospec.render import robust_tables
from zerospec.evaluation.runs import memoised
from zerospec.cluster.threads import VirtualCluster

# everything at once (loss scaling with an injected overflow, clipping, exact accumulation: every
# reduction is order-free by design), and the plain step with fp32 gradients, whose fp32 sums
# round at almost every addition — where a reduction that followed arrival order would show (sums
# of four fp16 gradients in fp32 are nearly always exact, so the fp16 policy would hide it)
CFGS = {"P_os+g+p, all mechanisms": config(3, steps=3, grad_accum_steps=2, clip_grad_norm=CLIP, loss_scale=SCALER),
        "P_os, plain fp32 step": config(1, steps=3, precision="fp32")}
OVERFLOWS = {"P_os+g+p, all mechanisms": OVERFLOW}   # (step, rank) whose gradient gets an inf
SEEDS = (1, 2, 3)


@memoised   # one run however it is called: _run(None) and _run(None, cfg=…) alike
def _run(jitter: int | None, tag: int = 0, cfg: str = "P_os+g+p, all mechanisms"):
    """(result, the order in which ranks finished step 1); ``tag`` makes a repeat a new run."""
    order = []
    r = train_with(CFGS[cfg], OVERFLOWS.get(cfg), cluster=VirtualCluster(4, jitter=jitter),
                   on_step=lambda step, stage: order.append(stage.ctx.rank) if step == 1 else None)
    return r, tuple(order)


def _same(a, b) -> bool:
    return (all(torch.equal(a.master[k], b.master[k]) for k in a.master) and a.losses == b.losses
            and a.loss_scales == b.loss_scales and a.skipped == b.skipped
            and [f"{x!r}" for x in a.grad_norms] == [f"{x!r}" for x in b.grad_norms])


@pytest.mark.parametrize("cfg", CFGS)
@pytest.mark.claim("P8")
def test_repeated_runs_are_bit_identical(cfg):
    """The same config twice (all mechanisms on; the plain fp32 step): the same bits."""
    assert _same(_run(None, cfg=cfg)[0], _run(None, tag=1, cfg=cfg)[0])


@pytest.mark.parametrize("cfg", CFGS)
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.claim("P8")
def test_a_random_schedule_with_random_pauses_changes_nothing(seed, cfg, claim_values):
    """Random rank order and pauses at every hand-off: losses, weights, norms and scales unchanged."""
    assert _same(_run(None, cfg=cfg)[0], _run(seed, cfg=cfg)[0])
    claim_values(f"Δ = 0 under schedule {_run(seed, cfg=cfg)[1]}", "schedule-independent")


def test_the_jitter_really_changes_the_schedule():
    """Not vacuous: the jittered runs finish step 1 in other orders than the plain schedule does."""
    plain = _run(None)[1]
    assert sorted(plain) == [0, 1, 2, 3]
    assert len({_run(s)[1] for s in SEEDS} - {plain}) >= 2


def test_determinism_table(md_snapshot):
    """spec/determinism.md's table: each run against the first run of its config."""
    rows = []
    for cfg in CFGS:
        ref = _run(None, cfg=cfg)[0]
        runs = [("fixed order", _run(None, cfg=cfg)), ("fixed order, again", _run(None, tag=1, cfg=cfg))] + [
            (f"jitter seed {s}", _run(s, cfg=cfg)) for s in SEEDS]
        for label, (r, order) in runs:
            rows.append((f"{cfg}: {label}", " ".join(map(str, order)),
                         robust_tables.max_delta(r.master, ref.master),
                         max(abs(a - b) for a, b in zip(r.losses, ref.losses))))
    assert robust_tables.determinism_table(rows) == md_snapshot
