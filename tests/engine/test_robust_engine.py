"""The robustness mechanisms on real processes: 4 gloo ranks equal the simulator bit for bit.

At N = 4 gloo's ring adds ranks in an order of its own, so the plain fp16 step only matches the
simulator within a derived tolerance (test_parity.py). With exact gradient sums (fp64 sums of fp16
values), the integer-binned norm and a max vote, no result depends on the order in which any
backend adds: the same bits by construction, loss scaling, an injected overflow and clipping
included (spec/accumulation.md, spec/clipping.md).
"""
from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

from tests.support.runs import stage_id, train_with
from zerospec.cluster.processes import launch
from zerospec.model.gpt import ODD
from zerospec.optim.loss_scale import LossScale
from zerospec.testing.faults import train_rank_with_overflow
from zerospec.training import checkpoint
from zerospec.training.config import TrainConfig
from zerospec.training.sections import BatchOptions, MeshOptions, OptimOptions
from zerospec.training.run import assemble, train, train_processes

CFGS = [TrainConfig(stage=s, n_d=4, model=ODD, steps=3, timeout=60,
                    optim=OptimOptions(clip_grad_norm=0.5,
                                       loss_scale=LossScale(init_scale=2.0 ** 10, growth_interval=2)),
                    batching=BatchOptions(exact_grads=True))
        for s in range(4)]
OVERFLOW = (2, 1)   # (step, rank): rank 1's gradient gets an inf at step 2


@functools.cache
def _gloo():
    """The four configs in one launch of 4 gloo processes; the hook is entered inside rank 1's
    process (a patch in this process would not reach the forkserver's children)."""
    per_rank = launch(train_rank_with_overflow, 4, CFGS, *OVERFLOW, timeout=60)
    return [assemble(cfg, [per_rank[r][k] for r in range(4)]) for k, cfg in enumerate(CFGS)]


@pytest.mark.parametrize("stage", range(4), ids=stage_id)
@pytest.mark.claim("P6")
def test_exact_sums_make_four_gloo_processes_equal_the_simulator(stage):
    """Scaler, overflow on rank 1, clipping, exact sums: gloo's weights, losses, norms equal the simulator's."""
    ours, sim = _gloo()[stage], train_with(CFGS[stage], OVERFLOW)
    assert all(torch.equal(ours.master[k], sim.master[k]) for k in sim.master)
    assert ours.losses == sim.losses and ours.skipped == sim.skipped == [False, True, False]
    assert [repr(x) for x in ours.grad_norms] == [repr(x) for x in sim.grad_norms]


def test_a_checkpoint_moves_between_processes_and_the_simulator(tmp_path):
    """Saved by 4 gloo processes after step 2, the run continues on the simulator, and back: the
    same bits as the uninterrupted run (exact sums make gloo's order irrelevant)."""
    cfg = TrainConfig(stage=3, n_d=4, model=ODD, steps=4, timeout=60,
                      batching=BatchOptions(exact_grads=True))
    first = dataclasses.replace(cfg, steps=2)
    whole = train(cfg)
    train_processes(first, save={2: tmp_path / "gloo"})
    train(first, save={2: tmp_path / "sim"})
    on_sim = train(cfg, resume=checkpoint.load(tmp_path / "gloo", n_ranks=4, model=ODD))
    on_gloo = train_processes(cfg, resume=checkpoint.load(tmp_path / "sim", n_ranks=4, model=ODD))
    for after in (on_sim, on_gloo):
        assert after.losses == whole.losses[2:]
        assert all(torch.equal(after.master[k], whole.master[k]) for k in whole.master)


@pytest.mark.parametrize("call,message", [
    (lambda c: train_processes([c, dataclasses.replace(c, n_d=2)]), "configs must share one number of ranks"),
    (lambda c: train_processes([c, c], save={1: "x"}), "resume and save take a single config"),
    (lambda c: train_processes(dataclasses.replace(c, device="meta")),
     "meta tensors with torch.distributed processes is refused: real processes run real tensors"),
])
def test_train_processes_refuses_what_it_cannot_run_before_starting_any(call, message):
    """Bad arguments are named before a process starts."""
    with pytest.raises(ValueError, match=message):
        call(TrainConfig(stage=0, n_d=4, model=ODD, steps=1))


@pytest.mark.slow   # one launch of 4 gloo processes, ~10 s
def test_the_grid_s_vote_norm_and_checkpoint_work_on_gloo_processes(tmp_path):
    """2 × 2 grid on gloo (MP subgroups), scaler, clipping, exact sums: the simulator's bits
    (norms, scales, weights); its checkpoint continues on the simulator at N_d = 1, bit for bit."""
    from tests.claims.test_model_parallel import MP_ODD
    cfg = TrainConfig(stage=3, n_d=2, model=MP_ODD, steps=4, timeout=60,
                      optim=OptimOptions(clip_grad_norm=0.5,
                                         loss_scale=LossScale(init_scale=2.0 ** 8, growth_interval=1)),
                      batching=BatchOptions(global_batch=4, grad_accum_steps=2),
                      mesh=MeshOptions(n_m=2))
    ours, sim = train_processes(cfg, save={2: tmp_path / "gloo"}), train(cfg)
    assert ours.losses == sim.losses and ours.loss_scales == sim.loss_scales
    assert [repr(x) for x in ours.grad_norms] == [repr(x) for x in sim.grad_norms]
    assert all(torch.equal(ours.master[k], sim.master[k]) for k in sim.master)
    after = train(cfg.replace(n_d=1, grad_accum_steps=4),
                  resume=checkpoint.load(tmp_path / "gloo", n_ranks=1, model=MP_ODD))
    assert after.losses == sim.losses[2:]
    assert all(torch.equal(after.master[k], sim.master[k]) for k in sim.master)
