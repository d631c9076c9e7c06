"""One rank's training run: the per-rank narrative step every engine executes.

:func:`rank_main` builds the rank (training/compose.py's :func:`build_rank`: groups, stage,
updater, fetcher, how checkpoints are kept), then runs :func:`train_step` once per step, whose phases (PHASES) read in
the order they run.

The virtual cluster runs :func:`rank_main` on a thread per rank, the torch.distributed engine on
a process per rank, and the meta-tensor scale mode on one representative rank per padding class —
the same function each time, which is what lets their ledgers be compared with ``==``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from collections import Counter
from typing import TYPE_CHECKING

import torch

from . import checkpoint
from .compose import Rank, build_rank
from .resume import meta as resume_meta
from ..comm.mesh import Mesh
from ..model import gpt
from ..offload import check_checkpointable
from ..optim.update import StepReport
from ..runtime.opcount import OpCounter

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
    (evaluation/timing.py); the ops seen are added to ``ops``. ``FlopCounterMode`` itself is not
    entered: on top of the counter it would slow a paper-scale meta step for the same totals."""
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
    check_checkpointable(cfg, save, resume)
    rank = build_rank(ctx, cfg, units, init, resume)
    out = RankOutput([], rank.master, rank.model_states, [], [], {p: 0.0 for p in PHASES})
    out.step_end.append(time.perf_counter())
    for step in range(rank.first_step, cfg.steps + 1):
        ctx.step = step
        idx, tgt = (b.to(ctx.device) for b in batches[step - 1])
        train_step(rank, cfg, idx, tgt, out)
        if save and step in save:
            checkpoint.save_from_rank(ctx, rank.stage, save[step],
                                      checkpoint.unit_spec(cfg.model, cfg.n_m, cfg.tiles),
                                      resume_meta(cfg, step, rank.updater), cfg.n_m)
        if on_step is not None:
            on_step(step, rank.stage)
    out.master = rank.stage.owned_master()   # the same tensors, or (NVMe) read from their files
    if keep_state:
        out.state = {"pieces": checkpoint.rank_pieces(rank.stage, checkpoint.mp_prefix(
                         cfg.n_m, Mesh.of(cfg).grid.mp_index(ctx.rank))),
                     "meta": resume_meta(cfg, ctx.step, rank.updater)}
    return out


def train_step(rank: Rank, cfg: TrainConfig, idx: torch.Tensor, tgt: torch.Tensor,
               out: RankOutput) -> None:
    """One step on the global batch ``idx`` → ``tgt``, in PHASES order: forward and backward of
    each of the G micro-batches, then grad_sync, step and param_sync; its results go to ``out``."""
    # r: the rank's DP index (rank = dp_index · N_m + mp_index), whichever group its stage sees
    stage, fetcher, G, r = rank.stage, rank.fetcher, cfg.grad_accum_steps, rank.ctx.rank // cfg.n_m
    phase = functools.partial(_timed, rank.ctx, out.seconds)
    flops, micro = {"forward": 0, "backward": 0}, []
    ops = {"forward": Counter(), "backward": Counter()}
    delayed = cfg.dpu and rank.ctx.step > cfg.dpu   # B8: the pending update, before FWD-BWD
    if delayed:   # on a GPU the host runs it while FWD-BWD use the parameters it has not updated
        # its overflow vote first, as DeepSpeed decides before its CPU step (stage_1_and_2.py:
        # step → check_overflow → _update_scale): the scale it sets is this step's backward's
        with phase("step"):
            report = rank.updater.step()
    stage.zero_grad()   # after the delayed update, which reads the previous step's sums
    for k in range(G):      # micro-batch k of rank r: rows (k·N + r)·mb …, mb = batch/(N·G)
        fetcher.begin_step()
        fetcher.grad_scale = rank.updater.scale
        with phase("forward"), _flops(cfg.count_flops, ops["forward"]) as oc:
            with fetcher.hooks():
                loss = gpt.forward(cfg.model, micro_batch(idx, r, cfg.n_d, k, G),
                                   micro_batch(tgt, r, cfg.n_d, k, G), fetcher.fetch, rank.blocks,
                                   rank.mp, cfg.tiles)
            fetcher.end_forward()
        flops["forward"] += oc.flops if oc is not None else 0
        with phase("backward"), _flops(cfg.count_flops, ops["backward"]) as oc:
            # rounded accumulation (the FSDP2 flavour's) averages through the loss, as torchtitan
            # does (rescale_accumulated_loss); exact sums divide by N·G once, at the end
            (loss / G if G > 1 and not cfg.exact else loss).backward()
            fetcher.check_complete()
        flops["backward"] += oc.flops if oc is not None else 0
        micro.append(loss.detach())
    with phase("grad_sync"):
        stage.reduce_gradients()
    if cfg.dpu and rank.ctx.step == cfg.dpu:   # B8's step N: gradients down, the update waits
        report = StepReport(True, rank.updater.scale, None, deferred=True)
    elif not delayed:
        with phase("step"):
            report = rank.updater.step()
    with phase("param_sync"):
        if not report.skipped:   # skipped: the parameters did not change
            stage.sync_params()
    _record(out, micro, report, flops, ops if cfg.count_flops else None,
            stage.optim_elements if not report.skipped else 0)


@contextlib.contextmanager
def _timed(ctx, seconds: dict[str, float], name: str):
    """Phase ``name`` of the rank's context, its wall time added to ``seconds[name]``."""
    t0 = time.perf_counter()
    with ctx.phase(name):
        yield
    seconds[name] += time.perf_counter() - t0


def _record(out: RankOutput, micro, report, flops, ops, optim_elements: int) -> None:
    """A step's results; ``ops``: None unless FLOPs were counted."""
    out.losses.append(micro[0] if len(micro) == 1 else torch.stack(micro).mean())
    out.micro_losses.append(micro)
    out.reports.append(report)
    out.flops.append(flops)
    if ops is not None:
        out.ops.append(ops)
    out.optim_elements.append(optim_elements)
    out.step_end.append(time.perf_counter())


def micro_batch(batch: torch.Tensor, rank: int, n_d: int, k: int, g: int) -> torch.Tensor:
    """Rank ``rank``'s k-th micro-batch: the global micro-batch index is k·N + rank, so the set of
    micro-batches of a step depends only on N·G (G = 1: BigramData.shard's rows).

    A copy, not a view: a rank holds only its own tokens. (A view would keep the whole global
    batch's storage alive, and the activation ledger, which counts storages, would charge every
    rank for every rank's token ids.)"""
    mb = batch.shape[0] // (n_d * g)
    m = k * n_d + rank
    return batch[m * mb:(m + 1) * mb].clone()
