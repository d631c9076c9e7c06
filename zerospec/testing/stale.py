"""The reference for DPU (B8): synchronous training whose gradients are taken at parameters one
step stale, built without the DPU code path so that the test is not that code compared with itself.

Step k computes its gradient at the parameters the device had at the start of step k − 1 (for
k > N; at the current ones for k ≤ N) and applies the update at once, with the plain stage (no
offload, no deferral): the parameters are set back for FWD-BWD, and the step's param_sync
refreshes them from the masters, which never saw the stale copy (a step skipped for an
overflow has no param_sync: the parameters are put back as they were before the set-back). A DPU
run applies update k one step later, so its masters after step t equal this run's after step
t − 1 (t ≥ N) and its losses equal this run's at every step (tests/claims/test_offload.py,
tests/claims/test_offload_dpu.py).
"""
from __future__ import annotations

import dataclasses

from ..cluster.threads import VirtualCluster
from ..training.result import build_result
from ..training.run import initial_weights, make_batches
from ..training.compose import build_rank
from ..training.step import PHASES, RankOutput, train_step


def _stale_rank(ctx, cfg, units, init, batches, warmup: int, on_step) -> RankOutput:
    rank = build_rank(ctx, cfg, units, init)
    out = RankOutput([], rank.master, rank.model_states, [], [], {p: 0.0 for p in PHASES})
    params = rank.stage.param16
    before = None          # the fp16 parameters at the start of the previous step
    for step in range(1, cfg.steps + 1):
        ctx.step = step
        now = [p.clone() for p in params]
        if step > warmup:  # one step stale: the parameters before the last update
            for p, q in zip(params, before):
                p.copy_(q)
        idx, tgt = batches[step - 1]
        train_step(rank, cfg, idx, tgt, out)
        if out.reports[-1].skipped:   # an overflow: no param_sync, the parameters are as they were
            for p, q in zip(params, now):
                p.copy_(q)
        before = now
        if on_step is not None:
            on_step(step, rank.stage)
    return out


def train_stale(cfg, warmup: int, on_step=None):
    """``cfg`` (dpu and offload ignored: the plain stage runs) trained with gradients one step
    stale after ``warmup`` steps: the Result, as :func:`zerospec.training.run.train` gives."""
    if warmup < 1:
        raise ValueError(f"warmup must be >= 1, got {warmup!r}")
    cfg = cfg.replace(dpu=0, offload_optimizer=None, offload_mode="paper", nvme_path=None)
    units = cfg.units()
    cluster = VirtualCluster(cfg.n_ranks, timeout=cfg.timeout)
    outs = cluster.run(_stale_rank, cfg, units, initial_weights(cfg, units), make_batches(cfg),
                       warmup, on_step)
    return build_result(cfg, outs, cluster.memory, cluster.comm_ledger, 0.0,
                        [c.timeline.events for c in cluster.contexts])
