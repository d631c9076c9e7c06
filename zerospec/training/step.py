"""One rank's training run: the per-rank narrative step every engine executes.

:func:`rank_main` builds the rank (:func:`build_rank`: groups, stage, updater, fetcher, how
checkpoints are kept), then runs :func:`train_step` once per step, whose phases (PHASES) read in
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
from ..model import gpt
from ..optim.loss_scale import LossScaler
from .resume import meta as resume_meta
from .sections import ac_mode
from ..optim.update import Reach, StepReport, Updater
from ..offload import check_checkpointable, with_offload
from ..zero import EXACT_STAGES, STAGES
from ..zero.stage3_deepspeed import DeepSpeedParameters, reused_within
from ..zero.exact import with_exact
from ..zero import fsdp2
from ..zero.fsdp2 import FSDP2Parameters
from ..zero.hpz import with_hpz
from ..zero.mics import with_mics
from ..zero.zeropp import with_zeropp
from ..zero.fetch import ParamFetcher
from ..comm.groups import Group, make_within, mics_groups, replica_group, shard_group, within
from ..comm.mesh import Mesh
from ..model import megatron
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
    (evaluation/timing.py); the ops seen are added to ``ops``. ``FlopCounterMode`` itself is not
    entered: on top of the counter it would slow a paper-scale meta step for the same totals."""
    if not enabled:
        yield None
        return
    oc = OpCounter()
    with flop_oracle(oc), oc:
        yield oc
    ops.update(oc.ops)


@dataclasses.dataclass
class Rank:
    """One rank, built for training by :func:`build_rank`: its stage and what the step drives."""
    ctx: object                     # the rank's own context: ledgers, phases, timeline
    dp_ctx: object                  # what the stage sees: ``ctx``, or its DP group's GroupView
    stage: object                   # the ZeRO stage (zero/): states, grad_sync, param_sync
    updater: Updater                # the step: loss scaling, clipping, Adam
    fetcher: ParamFetcher           # parameters in, gradients out, for every stage alike
    blocks: object                  # gpt.forward's run_blocks: activation checkpointing (zero_r/)
    master: list[tuple[slice, torch.Tensor]]   # the rank's fp32 master shards
    model_states: int               # bytes right after setup, before the fetcher is made
    first_step: int                 # 1, or the step after the resumed checkpoint's
    mp: object = None               # the MP group (model/megatron.TensorParallel), None without MP


def build_rank(ctx, cfg: TrainConfig, units, init, resume=None) -> Rank:
    """Set up one rank for :func:`rank_main`: its groups, how checkpoints are kept (P_a, M_D),
    its stage (restored from ``resume``, a checkpoint.TrainState, if given), the updater, the
    fetcher and the block runner."""
    mesh = Mesh.of(cfg)
    mesh.make(ctx.comm)                   # every group of the run, once, in the mesh's order
    dp_ctx, mp, init = _groups(ctx, cfg, mesh, init)
    keep = _checkpoint_keeper(ctx, cfg, mp)
    cls, kwargs = _stage_class(cfg, units)
    kwargs["buckets"] = buffers.for_rank(dp_ctx, units, cfg.bucket_elements)   # ZeRO-R's C_B
    with ctx.phase("setup"):
        if cfg.contiguous_gradients:   # M_D for gradients: one slot for every unit's gradient
            kwargs["grad_buffer"] = GradientSlot(ctx.memory, units, cfg.policy.dtype)
        stage = cls(dp_ctx, units, init, cfg.adam, cfg.policy, **kwargs)
        if resume is not None:
            resume.restore(stage, mp.index if mp is not None else 0)   # this MP index's slices
    meta = resume.meta if resume is not None else {}
    scaler = cfg.loss_scale and LossScaler(cfg.loss_scale, **(meta.get("scaler") or {}))
    reach = mp and Reach.model_parallel(stage, _one_copy(ctx, cfg), mp.comm, mp.index,
                                        megatron.replicated)
    updater = Updater(stage, cfg.clip_grad_norm, scaler, meta.get("optim_step", 0), reach)
    master, model_states = stage.owned_master(), ctx.memory.model_states()
    fetcher = ParamFetcher(stage, cfg.compute_dtype)
    kind, k = ac_mode(cfg.activation_checkpointing)     # torchtitan's modes (zero_r/selective.py)
    blocks = block_runner(cfg.segment_blocks, fetcher, mp, keep, k if kind == "selective-layer" else 0,
                          kind == "selective-op")
    return Rank(ctx, dp_ctx, stage, updater, fetcher, blocks, master, model_states,
                meta.get("step", 0) + 1, mp)


def _groups(ctx, cfg: TrainConfig, mesh: Mesh, init):
    """The context the stage sees (its DP group's view with N_m > 1; MiCS: its partition group's
    inside that), the MP group (None without MP) and this rank's initial weights (its MP index's);
    see :func:`rank_main`."""
    dp, mp = ctx, None
    if cfg.n_m > 1:
        grid = mesh.grid
        dp_comm, mp_comm = ctx.comm.split(grid)
        dp, mp, init = GroupView(ctx, dp_comm), TensorParallel(mp_comm), init[grid.mp_index(ctx.rank)]
        dp.siblings = [grid.dp_group(j) for j in range(cfg.n_m)]   # every MP index's DP group
    if cfg.shard_group is not None:   # MiCS: the stage sees its partition group (zero/mics.py)
        dp = _mics_view(ctx, dp, cfg.shard_group)
    return dp, mp, init


def _mics_view(ctx, dp, p: int) -> GroupView:
    """The rank seen through its partition group inside ``dp`` (its DP group's view, or the
    rank itself), with its replication group's interconnect."""
    make_within(dp, lambda n: mics_groups(n, p))
    parent = dp.comm.group
    view = GroupView(ctx, dp.comm.subgroup(within(parent, shard_group(dp.rank, p))))
    view.replicas = dp.comm.subgroup(within(parent, replica_group(dp.rank, p, dp.n_ranks)))
    view.siblings = [within(s, shard_group(r, p)) for s in getattr(dp, "siblings", [None])
                     for r in range(0, dp.n_ranks, p)]
    return view


def _one_copy(ctx, cfg: TrainConfig):
    """The ranks that hold one copy of the model states between them (norms and overflow votes
    sum over them): every rank, or with MiCS the p·N_m GPUs of the rank's partition groups."""
    if cfg.shard_group is None:
        return ctx.comm
    k = cfg.shard_group * cfg.n_m
    first = ctx.rank // k * k
    make = getattr(ctx.comm.backend, "new_groups", None)
    if make is not None:   # torch.distributed: every process makes every group, in order
        make([Group("shard", tuple(range(b, b + k))) for b in range(0, cfg.n_ranks, k)])
    return ctx.comm.subgroup(Group("shard", tuple(range(first, first + k))))


def _checkpoint_keeper(ctx, cfg: TrainConfig, mp):
    """How a checkpoint is kept between forward and backward (zero_r/): None: whole, on the
    device; ZeRO-R's P_a (P_a+cpu: on the host); M_D's contiguous buffer, of P_a's parts if any."""
    if cfg.contiguous_checkpoints and not cfg.cpu_checkpointing:   # M_D (P_a+cpu: none on device)
        return Contiguous(ctx.memory, len(segments(cfg.segment_blocks, cfg.model.n_layer)),
                          mp if cfg.partition_activations else None)
    if mp is not None and cfg.partition_activations:
        return Partitioned(mp, cfg.cpu_checkpointing, ctx.host)
    return None


def _stage_class(cfg: TrainConfig, units) -> tuple[type, dict]:
    """The stage's class and its keyword arguments but the buffers, which need the rank: the
    paper's stage wrapped in its features in zero/hooks.COMPOSITION's order, innermost first,
    each overriding only the named hooks (zero/hooks.StageHooks)."""
    cls = EXACT_STAGES[cfg.stage] if cfg.exact else STAGES[cfg.stage]
    kwargs = {"zero1_comm": cfg.zero1_comm} if cfg.stage == 1 else {}
    if cfg.stage3_persistence_threshold or cfg.stage3_max_reuse_distance:   # DeepSpeed's ZeRO-3
        cls = with_exact(DeepSpeedParameters) if cfg.exact else DeepSpeedParameters
        kwargs = {"persistence_threshold": cfg.stage3_persistence_threshold,
                  "keep": reused_within(gpt.fetch_order(cfg.model, cfg.tiles), units,
                                        cfg.stage3_max_reuse_distance)
                  if cfg.stage3_max_reuse_distance else frozenset()}
    if cfg.flavour == "fsdp2":   # FSDP2 as torchtitan runs it (zero/fsdp2.py)
        root, keep = fsdp2.groups(cfg.model, cfg.tiles)
        cls, kwargs = FSDP2Parameters, {"root": root, "keep": keep}
    if cfg.exact:
        kwargs["grad_accum_steps"] = cfg.grad_accum_steps
    if cfg.qwz or cfg.qgz:   # ZeRO++'s qwZ/qgZ: quantized collectives (zero/zeropp.py)
        cls = with_zeropp(cls)
        kwargs.update(qwz=cfg.qwz, qgz=cfg.qgz, quant_group_size=cfg.quant_group_size,
                      gpus_per_node=cfg.gpus_per_node and cfg.gpus_per_node // cfg.n_m)   # DP ranks
    if cfg.hpz > 1:   # ZeRO++'s hpZ: backward gathers inside the node (zero/hpz.py)
        cls, kwargs["hpz"] = with_hpz(cls), cfg.hpz
    if cfg.offload_optimizer:   # ZeRO-Offload: states and Adam on the host (zerospec/offload/)
        cls = with_offload(cls, params=cfg.offload_params is not None)
        kwargs.update(offload=cfg.offload_optimizer, offload_mode=cfg.offload_mode,
                      nvme_path=cfg.nvme_path)
        if cfg.offload_params:   # ZeRO-Infinity: the fp16 parameters too (offload/params.py)
            kwargs.update(offload_params=cfg.offload_params,
                          offload_partition=cfg.offload_partition,
                          offload_buffer_elements=cfg.offload_buffer_elements,
                          offload_prefetch=cfg.offload_prefetch)
    if cfg.shard_group is not None:   # MiCS: a replicated partition group (zero/mics.py)
        cls = with_mics(cls)
    return cls, kwargs


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
            loss.backward()
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
