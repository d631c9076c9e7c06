"""Run a ZeRO stage: ``train(cfg)`` on virtual GPUs (threads), ``train_processes(cfg)`` on real
processes (torch.distributed). Both run the same per-rank step (:mod:`.step`) and return the same
:class:`~zerospec.training.result.Result`, built by :func:`~.result.build_result`.
"""
from __future__ import annotations

import time

import torch

from ..cluster.processes import launch, new_context
from ..cluster.threads import VirtualCluster, torch_threads
from ..comm.groups import Nodes
from ..comm.ledger import CommLedger
from ..model import gpt, megatron
from ..model.data import BigramData
from ..offload import check_checkpointable
from . import checkpoint, combine
from .config import TrainConfig
from .result import Result, build_result
from .resume import check as resume_check
from .step import rank_main


def initial_weights(cfg: TrainConfig, units) -> list:
    """Each unit's initial fp32 weights (padded flat vectors); with model parallelism
    (``cfg.n_m`` > 1), one such list per MP index: Megatron's slices of the same model."""
    if cfg.device == "meta":
        one = [torch.empty(u.padded, device="meta") for u in units]
        return one if cfg.n_m == 1 else [one] * cfg.n_m
    params = gpt.init_params(cfg.model, cfg.seed, cfg.tiles)
    if cfg.n_m == 1:
        return [u.flatten(params[u.name]) for u in units]
    return [[u.flatten(part[u.name]) for u in units]
            for part in (megatron.shard(cfg.model, params, cfg.n_m, j) for j in range(cfg.n_m))]


def make_batches(cfg: TrainConfig):
    T = cfg.model.block_size
    if cfg.device == "meta":
        # inputs and targets are two tensors, as on a real device: the loss saves the targets
        # for backward, so one shared storage would hide 8 bytes per token of activations
        return [tuple(torch.empty(cfg.batch, T, dtype=torch.long, device="meta") for _ in range(2))
                ] * cfg.steps
    data = BigramData(cfg.model.vocab_size, T, cfg.seed)
    return [data.batch(s, cfg.batch) for s in range(cfg.steps)]


def train(cfg: TrainConfig, *, cluster: VirtualCluster | None = None, on_step=None,
          resume: checkpoint.TrainState | None = None, save: dict | None = None,
          keep_state: bool = False) -> Result:
    """Run ``cfg.steps`` steps of ZeRO stage ``cfg.stage`` on ``cfg.n_d`` virtual GPUs.

    ``on_step(step, stage)`` is called on every rank after each step (``stage.ctx.rank`` says
    which): progress bars, weight snapshots. ``resume``: continue from a checkpoint (a
    ``checkpoint.load(dir, n_ranks=cfg.n_d)``, or ``Result.state()``) with steps ``step+1 …
    cfg.steps``; ``save={step: dir}`` writes a sharded checkpoint after those steps;
    ``keep_state`` keeps the final state for ``Result.state()``."""
    check_checkpointable(cfg, save, resume)
    units = cfg.units()
    cluster = cluster or VirtualCluster(cfg.n_ranks, device=cfg.device, timeout=cfg.timeout,
                                        gpus_per_node=cfg.gpus_per_node)
    if cluster.n_ranks != cfg.n_ranks:
        raise ValueError(f"cluster has {cluster.n_ranks} ranks but config says "
                         f"n_d × n_m = {cfg.n_d} × {cfg.n_m} = {cfg.n_ranks}")
    if cluster.gpus_per_node != cfg.gpus_per_node:
        raise ValueError(f"cluster has gpus_per_node={cluster.gpus_per_node} but config says "
                         f"gpus_per_node={cfg.gpus_per_node}")
    combine.check(cfg, ("checkpoints",) if resume is not None or save or keep_state else ())
    if resume is not None:
        resume_check(cfg, resume)
    # the host side (initial weights, batches, the result's masters) on the ranks' thread count
    # too: its ops are elementwise copies and draws, whose values do not depend on the thread
    # count, and a second OpenMP thread spins against whatever else runs (10× the CPU of this
    # setup beside another busy process: docs/performance.md)
    with torch_threads(cluster.torch_threads):
        init, batches = initial_weights(cfg, units), make_batches(cfg)
        t0 = time.perf_counter()
        outs = cluster.run(rank_main, cfg, units, init, batches, on_step, resume, save, keep_state)
        wall = time.perf_counter() - t0
        result = build_result(cfg, outs, cluster.memory, cluster.comm_ledger, wall,
                              [ctx.timeline.events for ctx in cluster.contexts])
    result.host = [ctx.host for ctx in cluster.contexts]
    result.nvme = [ctx.nvme for ctx in cluster.contexts]
    return result


# -- training on processes ------------------------------------------------------------------------
def train_rank(ctx, cfgs, resume=None, save=None) -> list[dict]:
    """In one rank's process: train each config in turn (fresh ledgers after the first)."""
    outs = []
    for k, cfg in enumerate(cfgs):
        if cfg.n_ranks != ctx.n_ranks:
            raise ValueError(f"config n_d × n_m = {cfg.n_d} × {cfg.n_m} but the process group has "
                             f"{ctx.n_ranks} ranks")
        ctx = ctx if k == 0 else new_context()
        ctx.comm.ledger.nodes = Nodes(cfg.n_ranks, cfg.gpus_per_node)   # links of its bookings
        units = cfg.units()
        t0 = time.perf_counter()
        out = rank_main(ctx, cfg, units, initial_weights(cfg, units), make_batches(cfg),
                        resume=resume, save=save)
        outs.append({"out": out, "records": ctx.comm.ledger.records(ctx.rank), "memory": ctx.memory,
                     "host": ctx.host, "nvme": ctx.nvme,
                     "timeline": ctx.timeline.events, "seconds": time.perf_counter() - t0})
    return outs


def assemble(cfg: TrainConfig, per_rank: list[dict]) -> Result:
    """The Result of a run on processes, from what each rank's :func:`train_rank` returned."""
    comm = CommLedger(cfg.n_ranks, cfg.gpus_per_node)
    for r, x in enumerate(per_rank):   # each process booked only its own rank's records
        comm.adopt(r, x["records"])
    result = build_result(cfg, [x["out"] for x in per_rank], [x["memory"] for x in per_rank], comm,
                          max(x["seconds"] for x in per_rank), [x["timeline"] for x in per_rank])
    result.host = [x["host"] for x in per_rank]
    result.nvme = [x["nvme"] for x in per_rank]
    return result


def train_processes(cfgs, *, backend: str = "gloo", resume=None, save: dict | None = None,
                    **launch_kw):
    """``train(cfg)`` on ``cfg.n_d`` real processes: a Result, or a list for a list of configs
    (run one after another in the same processes, which saves the start-up). ``resume`` and
    ``save`` are ``train()``'s (a checkpoint to continue from; ``{step: directory}`` to write),
    for a single config: a checkpoint written here resumes on the simulator and vice versa."""
    single = not isinstance(cfgs, (list, tuple))
    cfgs = [cfgs] if single else list(cfgs)
    if not cfgs or len({c.n_ranks for c in cfgs}) != 1:
        raise ValueError(f"configs must share one number of ranks n_d × n_m, got "
                         f"{[c.n_ranks for c in cfgs]}")
    if (resume is not None or save) and len(cfgs) != 1:
        raise ValueError(f"resume and save take a single config, got {len(cfgs)}")
    check_checkpointable(cfgs[0], save, resume)
    for c in cfgs:   # the table's pairs with real processes (and checkpoint files)
        combine.check(c, ("torch", "checkpoints") if resume is not None or save else ("torch",))
    if resume is not None:
        resume_check(cfgs[0], resume)     # here, not in every process: one clear error
    launch_kw.setdefault("timeout", max(c.timeout for c in cfgs))
    per_rank = launch(train_rank, cfgs[0].n_ranks, cfgs, resume, save, backend=backend, **launch_kw)
    results = [assemble(cfg, [per_rank[r][k] for r in range(cfg.n_ranks)])
               for k, cfg in enumerate(cfgs)]
    return results[0] if single else results

