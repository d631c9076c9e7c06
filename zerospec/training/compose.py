"""One rank put together for training: its groups (from the run's mesh), its stage class with
the features in front in zero/hooks.COMPOSITION's order, restored from a checkpoint if asked, and
what the step drives (the updater, the fetcher, the block runner). training/step.py runs it.
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch

from .sections import ac_mode
from ..comm.mesh import Mesh
from ..model import gpt, megatron
from ..model.megatron import TensorParallel
from ..offload import with_offload
from ..optim.loss_scale import LossScaler
from ..optim.update import Reach, Updater
from ..runtime.context import GroupView
from ..zero import EXACT_STAGES, STAGES
from ..zero.exact import with_exact
from ..zero import fsdp2
from ..zero.fetch import ParamFetcher
from ..zero.fsdp2 import FSDP2Parameters
from ..zero.fsdp2_offload import CPUOffloaded
from ..zero.hpz import with_hpz
from ..zero.mics import with_mics
from ..zero.stage3_deepspeed import DeepSpeedParameters, reused_within
from ..zero.zeropp import with_zeropp
from ..zero_r import Partitioned, block_runner, buffers, count
from ..zero_r.defrag import Contiguous, GradientSlot

if TYPE_CHECKING:
    from .config import TrainConfig


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
    kwargs.update(_feature_groups(cfg, mesh, ctx.rank))
    # ZeRO-R's C_B; under qgZ buckets of whole units, each reduced through the stage's hooks
    kwargs["buckets"] = buffers.for_rank(dp_ctx, units, cfg.bucket_elements, whole_units=cfg.qgz)
    with ctx.phase("setup"):
        if cfg.contiguous_gradients:   # M_D for gradients: one slot for every unit's gradient
            kwargs["grad_buffer"] = GradientSlot(ctx.memory, units, cfg.policy.dtype)
        stage = cls(dp_ctx, units, init, cfg.adam, cfg.policy, **kwargs)
        if cfg.qgz and kwargs["buckets"] is not None:
            kwargs["buckets"].stage = stage   # zero_r/unit_buckets.py: the stage's hooks reduce
        if resume is not None:
            resume.restore(stage, mp.index if mp is not None else 0)   # this MP index's slices
    meta = resume.meta if resume is not None else {}
    scaler = cfg.loss_scale and LossScaler(cfg.loss_scale, **(meta.get("scaler") or {}))
    reach = mp and Reach.model_parallel(stage, _one_copy(ctx, mesh), mp.comm, mp.index,
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
    inside that, with its replication group's interconnect), the MP group (None without MP) and
    this rank's initial weights (its MP index's); every group the mesh's (see :func:`rank_main`)."""
    dp, mp = ctx, None
    if cfg.n_m > 1:
        grid = mesh.grid
        dp_comm, mp_comm = ctx.comm.split(grid)
        dp, mp, init = GroupView(ctx, dp_comm), TensorParallel(mp_comm), init[grid.mp_index(ctx.rank)]
    if cfg.shard_group is not None:   # MiCS: the stage sees its partition group (zero/mics.py)
        dp = GroupView(ctx, ctx.comm.subgroup(mesh.group("shard", ctx.rank)))
        dp.replicas = ctx.comm.subgroup(mesh.group("replica", ctx.rank))
    return dp, mp, init


def _one_copy(ctx, mesh: Mesh):
    """The ranks that hold one copy of the model states between them (norms and overflow votes
    sum over them): every rank, or with MiCS the p·N_m GPUs of the rank's partition groups."""
    group = mesh.one_copy(ctx.rank)
    return ctx.comm if group is None else ctx.comm.subgroup(group)


def _feature_groups(cfg: TrainConfig, mesh: Mesh, rank: int) -> dict:
    """The stage's keyword arguments that are groups, the mesh's for ``rank``: hpZ's secondary
    partition, qgZ's local and global all-to-all groups."""
    kw = {}
    if cfg.hpz > 1:
        kw["hpz_group"] = mesh.group("hpz", rank)
    if cfg.qgz:
        kw["qgz_groups"] = (mesh.group("local", rank), mesh.group("global", rank))
    return kw


def _checkpoint_keeper(ctx, cfg: TrainConfig, mp):
    """How a checkpoint is kept between forward and backward (zero_r/): None: whole, on the
    device; ZeRO-R's P_a over the MP group, or over a group of one without MP (the whole
    checkpoint, as DeepSpeed's mp_size 1); on the host with cpu_checkpointing (P_a+cpu; without
    P_a the whole checkpoint); M_D's contiguous buffer, of P_a's parts if any."""
    part = mp if cfg.partition_activations else None      # None: a group of one
    if cfg.contiguous_checkpoints and not cfg.cpu_checkpointing:   # M_D (P_a+cpu: none on device)
        kind, k = ac_mode(cfg.activation_checkpointing)   # a selective mode's blocks, if any
        n = count(cfg.segment_blocks, cfg.model.n_layer, k if kind == "selective-layer" else 0,
                  kind == "selective-op")
        return Contiguous(ctx.memory, n, part)
    if cfg.partition_activations or cfg.cpu_checkpointing:
        return Partitioned(ctx.comm, part, cfg.cpu_checkpointing, ctx.host)
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
        # hpZ: its integer reshard_after_forward on the blocks it reshards (zero/fsdp2.py)
        # --offload-prefetch: its explicit forward prefetch, one group ahead (zero/fsdp2.py)
        cls, kwargs = FSDP2Parameters, {"root": root, "keep": keep, "hpz": cfg.hpz,
                                        "prefetch": cfg.offload_prefetch}
        if cfg.offload_optimizer == "cpu":   # FSDP2's CPUOffloadPolicy (zero/fsdp2_offload.py):
            cls = CPUOffloaded               # --offload-params cpu is the same run
    if cfg.exact:
        kwargs["grad_accum_steps"] = cfg.grad_accum_steps
    if cfg.qwz or cfg.qgz:   # ZeRO++'s qwZ/qgZ: quantized collectives (zero/zeropp.py); the
        # FSDP2 flavour takes them as its custom comms (zero/fsdp2_quant.py)
        cls = with_zeropp(cls) if cfg.flavour != "fsdp2" else cls
        kwargs.update(qwz=cfg.qwz, qgz=cfg.qgz, quant_group_size=cfg.quant_group_size,
                      gpus_per_node=cfg.gpus_per_node and cfg.gpus_per_node // cfg.n_m)   # DP ranks
    if cfg.offload_optimizer and cfg.flavour != "fsdp2":   # ZeRO-Offload: states and Adam on
        # the host (zerospec/offload/); the FSDP2 flavour's is its own policy (above)
        cls = with_offload(cls, params=cfg.offload_params is not None)
        kwargs.update(offload=cfg.offload_optimizer, offload_mode=cfg.offload_mode,
                      nvme_path=cfg.nvme_path)
        if cfg.offload_params:   # ZeRO-Infinity: the fp16 parameters too (offload/params.py)
            kwargs.update(offload_params=cfg.offload_params,
                          offload_partition=cfg.offload_partition,
                          offload_buffer_elements=cfg.offload_buffer_elements,
                          offload_prefetch=cfg.offload_prefetch)
    if cfg.hpz > 1 and cfg.flavour != "fsdp2":   # ZeRO++'s hpZ: backward gathers inside the
        # node (zero/hpz.py), in front of ZeRO-Infinity's fetch, whose forward gathers it keeps
        # shards of (on the host); its group: the mesh's (_feature_groups); the FSDP2 flavour
        # takes h itself (above)
        cls, kwargs["hpz_on_host"] = with_hpz(cls), cfg.offload_params == "cpu"
    if cfg.shard_group is not None:   # MiCS: a replicated partition group (zero/mics.py)
        cls = with_mics(cls)
    return cls, kwargs
