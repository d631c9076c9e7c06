"""DPU (B8) composed with dynamic loss scaling (P4) and with ZeRO-Infinity's offloaded parameters
(spec/offload.md, "The delayed parameter update").

Loss scaling: the vote on step t's gradient is taken when the delayed update of it starts, before
FWD-BWD of t + 1 (DeepSpeed decides overflow before its CPU step): an overflow skips update t, and
backward t + 1 is the first to carry the new scale, as in synchronous training. The reference is
the stale-by-one run (zerospec/testing/stale.py, no DPU code) with the same injected overflow.

Offloaded parameters: the host's Adam writes the fp32 master and a separate fp16 result; the fp16
copy FWD-BWD fetch is overwritten only in param_sync, so it is the stale copy. The reference is
DPU with the parameters on the device, bit for bit.

Runs: the ODD model (units divide by no N) on N = 4 virtual GPUs, warm-up N_dpu = 2; 5 steps with
loss scaling (an overflow at step 3 is skipped at 4 and the update resumes at 5), 4 with offloaded
parameters (two delayed updates).
"""
from __future__ import annotations

import contextlib
import functools
from unittest import mock

import pytest
import torch

from tests.support.runs import assert_same_training
from zerospec.model.gpt import ODD
from zerospec.optim.loss_scale import LossScale
from zerospec.runtime.context import RankContext
from zerospec.testing.faults import inject_overflow
from zerospec.testing.stale import train_stale
from zerospec.training.config import TrainConfig
from zerospec.training.run import train
from zerospec.zero.fetch import ParamFetcher

N, STEPS, WARMUP = 4, 5, 2
SCALER = LossScale(init_scale=2.0 ** 10, growth_interval=2)   # grows after two clean votes


def cfg(stage: int = 3, **kw) -> TrainConfig:
    return TrainConfig.of(stage=stage, n_d=N, model=ODD, steps=kw.pop("steps", STEPS),
                          offload_optimizer="cpu", **kw)


@contextlib.contextmanager
def watching(masters: dict, scales: dict):
    """Record, per step, rank 0's fp32 masters after the step and the loss scale each backward's
    fp16 gradients were cast with (the fetcher's, seen at the fault hook's seam)."""
    inner = ParamFetcher.grad_written   # the overflow hook's, when one is open

    def grad_written(fetcher, i, grad16):
        ctx = fetcher.stage.ctx
        if ctx.rank == 0:
            scales.setdefault(ctx.step, set()).add(fetcher.grad_scale)
        inner(fetcher, i, grad16)

    def on_step(step, stage):
        if stage.ctx.rank == 0:
            masters[step] = [m.clone() for _, m in stage.owned_master()]
    with mock.patch.object(ParamFetcher, "grad_written", grad_written):
        yield on_step


@functools.lru_cache(maxsize=None)
def scaled(stage: int, overflow: int | None, stale: bool):
    """(Result, masters after each step, scales per backward): DPU from step 2 with the scaler and
    an inf in rank 0's gradient at step ``overflow``, or (``stale``) the stale-by-one reference."""
    masters, scales = {}, {}
    base = cfg(stage, loss_scale=SCALER)
    hook = inject_overflow(step=overflow, rank=0) if overflow else contextlib.nullcontext()
    with hook, watching(masters, scales) as on_step:
        r = (train_stale(base, WARMUP, on_step=on_step) if stale else
             train(base.replace(dpu=WARMUP), on_step=on_step))
    return r, masters, {t: s.pop() for t, s in scales.items() if len(s) == 1}


def _same(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


# (stage, step of the overflow): a step of the delayed phase, the deferred step N itself
OVERFLOWS = [(3, 3)] + [pytest.param(s, t, marks=pytest.mark.slow) for s, t in
                        ((3, WARMUP), (2, 3), (2, WARMUP))]
CASES = OVERFLOWS + [pytest.param(s, None, marks=pytest.mark.slow) for s in (2, 3)]


@pytest.mark.parametrize("stage,overflow", CASES)
@pytest.mark.claim("B8")
def test_dpu_with_loss_scaling_equals_the_stale_reference_with_the_same_overflow(stage, overflow):
    """The vote on step t's gradient precedes backward t + 1: every backward carries the scale it
    carries in the stale-by-one reference, every loss equals it, and the masters trail it by the
    one pending update, bit for bit."""
    dpu, d, ds = scaled(stage, overflow, False)
    ref, s, ss = scaled(stage, overflow, True)
    assert dpu.losses == ref.losses
    assert ds == ss and len(ds) == STEPS
    for t in range(1, STEPS + 1):
        assert _same(d[t], s[t] if t < WARMUP else s[t - 1]), f"step {t}"


@pytest.mark.parametrize("stage,overflow", OVERFLOWS)
@pytest.mark.claim("P4")
def test_an_overflow_under_dpu_skips_its_own_update_and_halves_the_next_backwards_scale(
        stage, overflow):
    """An inf in step t's gradient: the masters after step t + 1, where update t runs, are those
    after step t (the skip), the next step updates them; backwards 1..t carry the scale grown
    after two clean votes (1024, 1024, 2048 from step 3), backward t + 1 half of backward t's."""
    _, d, scales = scaled(stage, overflow, False)
    t = overflow
    assert _same(d[t + 1], d[t])
    assert not _same(d[t + 2], d[t + 1])
    grown = [2.0 ** 10, 2.0 ** 10] + [2.0 ** 11] * (STEPS - 2)   # torch's rule, no overflow
    assert [scales[k] for k in range(1, t + 1)] == grown[:t]
    assert scales[t + 1] == grown[t - 1] / 2


@pytest.mark.claim("P4")
def test_each_gradient_is_voted_on_once_and_the_pending_one_before_the_next_forward():
    """The overflow vote (an all-reduce of one fp32 flag) on step t's gradient: in step t's
    update through the warm-up, none at the deferred step N, and from N + 1 in the delayed
    update of t − 1, booked before the step's forward; the last step's gradient is still
    pending, so the run takes STEPS − 1 votes."""
    r = scaled(3, 3, False)[0]
    for t in range(1, STEPS + 1):
        recs = r.comm.records(0, step=t)
        votes = [x for x in recs if x.op == "all_reduce" and x.numel == 1]
        assert [(x.phase, x.dtype) for x in votes] == [("step", torch.float32)] * (t != WARMUP)
        first_forward = min(x.seq for x in recs if x.phase == "forward")
        assert all((x.seq < first_forward) == (t > WARMUP) for x in votes), f"step {t}"


# -- offloaded parameters ----------------------------------------------------------------------
PARAMS = [{"offload_params": "cpu"}] + [pytest.param(kw, marks=pytest.mark.slow) for kw in (
    {"offload_params": "cpu", "offload_prefetch": True}, {"offload_params": "nvme"},
    {"offload_params": "cpu", "offload_partition": "owner"},
    {"offload_params": "cpu", "stage3_persistence_threshold": 100,
     "stage3_max_reuse_distance": 10 ** 6})]


@functools.lru_cache(maxsize=None)
def dpu_run(**kw):
    """Stage 3 with DPU from step 2, 4 steps (two delayed updates), and what rank 0's host holds
    in fp16 parameters at the end of each step's forward."""
    held = {}
    phase = RankContext.phase

    @contextlib.contextmanager
    def watched(ctx, name):
        with phase(ctx, name):
            yield
        if ctx.rank == 0 and name == "forward":
            held[ctx.step] = ctx.host.current["param16"]
    with mock.patch.object(RankContext, "phase", watched):
        return train(cfg(3, steps=4, dpu=WARMUP, **kw)), held


@pytest.mark.parametrize("where", PARAMS, ids=["cpu", "cpu-prefetch", "nvme", "owner", "ds3"])
@pytest.mark.claim("B8")
def test_dpu_with_offloaded_parameters_trains_as_dpu_with_them_on_the_device(where):
    """FWD-BWD fetch the host's fp16 copy, which the delayed update leaves alone until
    param_sync: the same stale values reach the device as without parameter offload, so every
    loss and master weight equals that run's bit for bit (two delayed steps after N = 2)."""
    assert_same_training(dpu_run(**where)[0], dpu_run()[0])


@pytest.mark.claim("B8")
def test_under_dpu_the_host_holds_the_stale_fp16_copy_and_the_updates_through_fwd_bwd():
    """While FWD-BWD of step t > N run, the host holds rank 0's fp16 chunks twice: the copy they
    fetch and the delayed update's result, which param_sync writes over it; in the warm-up
    param_sync has consumed the result before the next forward. PCIe carries per step, phase and
    direction what it carries without DPU."""
    r, held = dpu_run(offload_params="cpu")
    m = 2 * sum(u.chunk for u in r.units)          # fp16 bytes of rank 0's chunks
    assert held == {1: m, 2: m, 3: 2 * m, 4: 2 * m}
    sync = train(cfg(3, steps=4, offload_params="cpu"))
    assert r.comm.link_bytes(0, step=4, phase="forward", op="from_host") > 0   # the fetches
    for t in range(1, 5):
        for phase in ("forward", "backward", "step", "param_sync"):
            for op in ("to_host", "from_host"):
                assert r.comm.link_bytes(0, step=t, phase=phase, op=op) == \
                    sync.comm.link_bytes(0, step=t, phase=phase, op=op), (t, phase, op)
