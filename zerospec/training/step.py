"""One rank's training run: the per-rank narrative step every engine executes.

The virtual cluster runs :func:`rank_main` on a thread per rank, the torch.distributed engine on
a process per rank, and the meta-tensor scale mode on one representative rank per padding class —
the same function each time, which is what lets their ledgers be compared with ``==``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import time
from collections import Counter
from typing import TYPE_CHECKING

import torch

from . import checkpoint
from ..model import gpt
from ..optim.loss_scale import LossScaler
from .resume import meta as resume_meta
from ..optim.update import Updater
from ..zero import EXACT_STAGES, STAGES
from ..zero.ds3 import DeepSpeedParameters, reused_within
from ..zero.fetch import ParamFetcher
from ..comm.groups import Grid
from ..model.megatron import TensorParallel
from ..runtime.context import GroupView
from ..runtime.opcount import OpCounter
from ..zero_r import Partitioned, block_runner, buffers, segments
from ..zero_r.defrag import Contiguous, GradientSlot

if TYPE_CHECKING:
    from .config import TrainConfig

PHASES = ("forward", "backward", "grad_sync", "step", "param_sync")


@dataclasses.dataclass
class RankOutput:
    losses: list[torch.Tensor]
    master: list[tuple[slice, torch.Tensor]]
    model_states: int                       # bytes right after setup
    flops: list[dict[str, int]]             # per step: forward, backward
    optim_elements: list[int]               # per step
    seconds: dict[str, float]               # per phase, summed over steps (own compute + collectives)
    step_end: list[float] = dataclasses.field(default_factory=list)  # perf_counter: setup, step 1, …
    micro_losses: list[list[torch.Tensor]] = dataclasses.field(default_factory=list)  # [step][k]
    reports: list = dataclasses.field(default_factory=list)  # per step: update.StepReport
    state: dict | None = None               # train(keep_state=True): this rank's checkpoint pieces
    ops: list[dict[str, Counter]] = dataclasses.field(default_factory=list)  # count_flops: per step,
    #                                       forward/backward: runtime.opcount.Op -> calls


def flop_oracle(counter: OpCounter):
    """What runs beneath each counted phase's ``counter``: nothing. A seam: the tests put torch's
    ``FlopCounterMode`` there, below the counter, which then decomposes and counts every op as it
    does alone, and compare its total with ``counter.flops`` when the phase ends
    (zerospec/testing/flops.py)."""
    return contextlib.nullcontext()


@contextlib.contextmanager
def _flops(enabled: bool, ops: Counter):
    """An OpCounter over the block: each op's FLOPs (torch's ``flop_registry``, applied by
    ``FlopCounterMode``'s rule) and bytes, for the FLOP totals and the per-op roofline
    (report/timing.py); the ops seen are added to ``ops``. ``FlopCounterMode`` itself is not
    entered: on top of the counter it took Table 4's 100B meta step (a checkpoint per block) from
    3.1 to 6.9 s, for the same totals (docs/performance.md)."""
    if not enabled:
        yield None
        return
    oc = OpCounter()
    with flop_oracle(oc), oc:
        yield oc
    ops.update(oc.ops)


def rank_main(ctx, cfg: TrainConfig, units, init, batches, on_step=None, resume=None, save=None,
               keep_state=False) -> RankOutput:
    """One rank's run. ``on_step(step, stage)``, if given, is called after each step (the
    engine tests snapshot weights there to compare them with torch's own implementations);
    ``resume``: a checkpoint.TrainState to start from; ``save``: {step: directory}.
    ``init``: each unit's initial fp32 weights; with model parallelism (``cfg.n_m`` > 1), one
    such list per MP index (:func:`zerospec.training.run.initial_weights`).

    With N_m > 1 the rank sits on the N_d × N_m grid (comm/groups.py): the ZeRO stage sees its
    DP group only (a :class:`GroupView`: same stage code, sharding over N_d), the model its MP
    group (Megatron's operators), and both MP ranks of a replica read the same micro-batch."""
    dp_ctx, mp, keep = ctx, None, None
    if cfg.n_m > 1:
        grid = Grid(cfg.n_d, cfg.n_m)
        dp_comm, mp_comm = ctx.comm.split(grid)
        dp_ctx, mp = GroupView(ctx, dp_comm), TensorParallel(mp_comm)
        init = init[grid.mp_index(ctx.rank)]
        if cfg.partition_activations:
            keep = Partitioned(mp, cfg.cpu_checkpointing, ctx.host)
    if cfg.contiguous_checkpoints and not cfg.cpu_checkpointing:   # M_D (P_a+cpu: none on device)
        keep = Contiguous(ctx.memory, len(segments(cfg.checkpoint_activations, cfg.model.n_layer)),
                          mp if cfg.partition_activations else None)
    cls = EXACT_STAGES[cfg.stage] if cfg.exact else STAGES[cfg.stage]
    kwargs = {"zero1_comm": cfg.zero1_comm} if cfg.stage == 1 else {}
    if cfg.stage3_persistence_threshold or cfg.stage3_max_reuse_distance:   # DeepSpeed's ZeRO-3
        cls = DeepSpeedParameters
        kwargs = {"persistence_threshold": cfg.stage3_persistence_threshold,
                  "keep": reused_within(gpt.fetch_order(cfg.model), units,
                                        cfg.stage3_max_reuse_distance)
                  if cfg.stage3_max_reuse_distance else frozenset()}
    if cfg.exact:
        kwargs["grad_accum_steps"] = cfg.grad_accum_steps
    kwargs["buckets"] = buffers.for_rank(dp_ctx, units, cfg.bucket_elements)   # ZeRO-R's C_B
    with ctx.phase("setup"):
        if cfg.contiguous_gradients:   # M_D for gradients: one slot for every unit's gradient
            kwargs["grad_buffer"] = GradientSlot(ctx.memory, units, cfg.policy.dtype)
        stage = cls(dp_ctx, units, init, cfg.adam, cfg.policy, **kwargs)
        if resume is not None:
            resume.restore(stage)
    meta = resume.meta if resume is not None else {}
    scaler = cfg.loss_scale and LossScaler(cfg.loss_scale, **(meta.get("scaler") or {}))
    updater = Updater(stage, cfg.clip_grad_norm, scaler, meta.get("optim_step", 0))
    out = RankOutput([], stage.owned_master(), ctx.memory.model_states(), [], [],
                     {p: 0.0 for p in PHASES})
    fetcher = ParamFetcher(stage, cfg.compute_dtype)
    blocks = block_runner(cfg.checkpoint_activations, fetcher, mp, keep)   # zero_r/
    out.step_end.append(time.perf_counter())
    G = cfg.grad_accum_steps

    @contextlib.contextmanager
    def phase(name):
        t0 = time.perf_counter()
        with ctx.phase(name):
            yield
        out.seconds[name] += time.perf_counter() - t0

    for step in range(meta.get("step", 0) + 1, cfg.steps + 1):
        ctx.step = step
        idx, tgt = (b.to(ctx.device) for b in batches[step - 1])
        stage.zero_grad()
        flops, micro = {"forward": 0, "backward": 0}, []
        ops = {"forward": Counter(), "backward": Counter()}
        for k in range(G):      # micro-batch k of rank r: rows (k·N + r)·mb …, mb = batch/(N·G)
            fetcher.begin_step()
            fetcher.grad_scale = updater.scale
            with phase("forward"), _flops(cfg.count_flops, ops["forward"]) as oc:
                with fetcher.hooks():
                    loss = gpt.forward(cfg.model, micro_batch(idx, dp_ctx.rank, cfg.n_d, k, G),
                                       micro_batch(tgt, dp_ctx.rank, cfg.n_d, k, G), fetcher.fetch,
                                       blocks)
                fetcher.end_forward()
            flops["forward"] += oc.flops if oc is not None else 0
            with phase("backward"), _flops(cfg.count_flops, ops["backward"]) as oc:
                loss.backward()
                fetcher.check_complete()
            flops["backward"] += oc.flops if oc is not None else 0
            micro.append(loss.detach())
        with phase("grad_sync"):
            stage.reduce_gradients()
        with phase("step"):
            report = updater.step()
        with phase("param_sync"):
            if not report.skipped:   # skipped: the parameters did not change
                stage.sync_params()
        out.losses.append(micro[0] if G == 1 else torch.stack(micro).mean())
        out.micro_losses.append(micro)
        out.reports.append(report)
        out.flops.append(flops)
        if cfg.count_flops:
            out.ops.append(ops)
        out.optim_elements.append(stage.optim_elements if not report.skipped else 0)
        out.step_end.append(time.perf_counter())
        if save and step in save:
            checkpoint.save_from_rank(ctx, stage, save[step], cfg.model.unit_spec(),
                                      resume_meta(cfg, step, updater))
        if on_step is not None:
            on_step(step, stage)
    if keep_state:
        out.state = {"pieces": checkpoint.rank_pieces(stage), "meta": resume_meta(cfg, ctx.step, updater)}
    return out


def micro_batch(batch: torch.Tensor, rank: int, n_d: int, k: int, g: int) -> torch.Tensor:
    """Rank ``rank``'s k-th micro-batch: the global micro-batch index is k·N + rank, so the set of
    micro-batches of a step depends only on N·G (G = 1: BigramData.shard's rows).

    A copy, not a view: a rank holds only its own tokens. (A view would keep the whole global
    batch's storage alive, and the activation ledger, which counts storages, would charge every
    rank for every rank's token ids.)"""
    mb = batch.shape[0] // (n_d * g)
    m = k * n_d + rank
    return batch[m * mb:(m + 1) * mb].clone()
