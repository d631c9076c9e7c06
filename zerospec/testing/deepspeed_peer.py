"""DeepSpeed, the paper's reference implementation, as a peer: ZeRO-1/2/3 on the current process group.

Optional (``pip install -e ".[peers]"``); DeepSpeed runs on CPU with ``DS_ACCELERATOR=cpu``, set
here before its import, and JIT-builds a small op on its first engine start (cached after).

The peer trains :class:`~zerospec.testing.oracles.GPT` (zerospec's model, init, data and Adam
hyper-parameters, fp32) with ``deepspeed.initialize`` and a client optimizer: torch.optim.Adam, or
:class:`~zerospec.testing.oracles.ZerospecAdam` so that only the engines differ. Two settings:

* ``"default"``: DeepSpeed's defaults (what a user gets);
* ``"paper"``: the settings under which DeepSpeed moves the paper's volumes (spec/deepspeed.md):
  ZeRO-1/2 ``use_multi_rank_bucket_allreduce: false``; ZeRO-3 persistence threshold, max reuse
  distance and prefetch bucket size all 0.

ZeRO-3 always runs with ``memory_efficient_linear: false``: DeepSpeed's memory-efficient linear
computes ``F.linear`` as a matmul and a separate bias add, which rounds differently.

:func:`run_deepspeed` returns per-step losses, full weights and DeepSpeed's comms-logger records per
phase, normalised to the paper's volume (:func:`ds_volume`), as
:func:`~zerospec.testing.oracles.run_peer` does. ``cfg.precision`` "bf16" turns on DeepSpeed's bf16
(the module computes in bf16). :func:`reduced_gradients` reads out, exactly, the step-1 gradient
each engine reduced and every rank's local one: at N > 2 the engines add the ranks' values in
different orders (spec/deepspeed.md).
"""
from __future__ import annotations

import contextlib
import dataclasses
import os

import torch
import torch.distributed as dist

from ..model.data import BigramData
from ..optim.adam import reference_optimizer
from .oracles import GPT, OPTIMIZERS, ZerospecAdam, mean_losses, zerospec_row

SETTINGS = ("default", "paper")
OFFLOAD = "offload"   # a third setting: DeepSpeed's defaults with offload_optimizer on the CPU
OFFLOAD_PARAMS = "offload_params"   # ZeRO-3, and offload_param on the CPU too (ZeRO-Infinity)
OFFLOAD_NVME = "offload_nvme"       # ZeRO-3, optimizer and parameters on NVMe (cfg.nvme_path)
OFFLOADS = (OFFLOAD, OFFLOAD_PARAMS, OFFLOAD_NVME)
PRECISIONS = ("fp32", "bf16")
# DeepSpeed's comms-logger names -> the Interconnect's (what each op is, whatever DeepSpeed calls it)
DS_OPS = {"all_gather_into_tensor": "all_gather", "allgather_fn": "all_gather",
          "all_gather": "all_gather", "all_gather_coalesced": "all_gather",
          "reduce_scatter_tensor": "reduce_scatter", "reduce_scatter_fn": "reduce_scatter",
          "reduce_scatter": "reduce_scatter", "reduce_scatter_coalesced": "reduce_scatter",
          "all_reduce": "all_reduce", "all_reduce_coalesced": "all_reduce",
          "inference_all_reduce": "all_reduce", "broadcast": "broadcast", "barrier": "barrier"}


def available() -> str | None:
    """None if DeepSpeed imports, else why not (the reason tests skip with)."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    try:
        import deepspeed  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any import failure means "no peer"
        return f"DeepSpeed is not importable ({type(exc).__name__}: {exc}); pip install -e '.[peers]'"
    return None


def ds_config(stage: int, cfg, settings: str = "default", comms: bool = True) -> dict:
    """DeepSpeed's JSON config for ZeRO-``stage`` on zerospec's ``cfg`` (fp32 or bf16, no clipping)."""
    if stage not in (1, 2, 3):
        raise ValueError(f"DeepSpeed peer stage must be 1, 2 or 3, got {stage!r}")
    if cfg.precision not in PRECISIONS:
        raise ValueError(f"DeepSpeed peer precision must be one of {PRECISIONS}, got {cfg.precision!r}")
    if settings not in (*SETTINGS, *OFFLOADS):
        raise ValueError(f"settings must be one of {(*SETTINGS, *OFFLOADS)}, got {settings!r}")
    zero: dict = {"stage": stage}
    if stage == 3:
        zero["memory_efficient_linear"] = False   # same F.linear as zerospec (module docstring)
        if getattr(cfg, "hpz", 1) > 1:   # ZeRO++'s hpZ (zerospec/zero/hpz.py, spec/mics.md)
            zero["zero_hpz_partition_size"] = cfg.hpz
    if settings == "paper":
        if stage in (1, 2):
            zero["use_multi_rank_bucket_allreduce"] = False   # reduce-scatter, not all-reduce
        else:   # nothing kept whole, nothing kept gathered from forward to backward
            zero.update(stage3_param_persistence_threshold=0, stage3_max_reuse_distance=0,
                        stage3_prefetch_bucket_size=0)
    if settings in OFFLOADS:   # ZeRO-Offload: fp32 partitions and the optimizer step on the CPU
        if stage not in (2, 3) or (settings != OFFLOAD and stage != 3):
            raise ValueError(f"DeepSpeed's {settings} needs stage "
                             f"{'2 or 3' if settings == OFFLOAD else 3}, got {stage!r}")
        if settings == OFFLOAD_NVME:   # ZeRO-Infinity's NVMe tier: DeepSpeed's async_io op
            where = {"device": "nvme", "nvme_path": str(cfg.nvme_path)}
            zero["offload_optimizer"] = dict(where)
            zero["offload_param"] = dict(where)
        else:
            zero["offload_optimizer"] = {"device": "cpu"}
            if settings == OFFLOAD_PARAMS:
                zero["offload_param"] = {"device": "cpu"}
    # bf16: DeepSpeed casts the module to bf16 and computes in it (fp32 master weights in ZeRO)
    bf16 = {"bf16": {"enabled": True}} if cfg.precision == "bf16" else {}
    return {**bf16, "train_micro_batch_size_per_gpu": cfg.batch // cfg.n_d,
            "gradient_accumulation_steps": 1, "zero_optimization": zero,
            "zero_allow_untested_optimizer": True, "gradient_clipping": 0.0,
            # the client optimizer (zerospec's Adam arithmetic) also under offload: only the
            # engines differ, not DeepSpeedCPUAdam's fused arithmetic
            **({"zero_force_ds_cpu_optimizer": False} if settings in OFFLOADS else {}),
            "steps_per_print": 2**31 - 1,
            "comms_logger": {"enabled": comms, "prof_all": True, "verbose": False}}


class GradientProbe(torch.optim.Optimizer):
    """An "optimizer" that sets each parameter to its gradient: after one step an engine's weights
    are the reduced gradient it handed its optimizer, in the model's layout (DeepSpeed's own
    partition bookkeeping and gathers do the mapping, bit for bit)."""

    def __init__(self, params):
        super().__init__(params, {})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.copy_(p.grad)


PEER_OPTIMIZERS = (*OPTIMIZERS, "probe")


def build(stage: int, cfg, optimizer: str = "torch", settings: str = "default", comms: bool = True):
    """DeepSpeed's engine for ZeRO-``stage`` around zerospec's model and init, on this group."""
    if optimizer not in PEER_OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {PEER_OPTIMIZERS}, got {optimizer!r}")
    reason = available()
    if reason:
        raise RuntimeError(reason)
    import deepspeed
    # DeepSpeed reads its rank from the environment a launcher would set; this rank process is ours
    rank, n = dist.get_rank(), dist.get_world_size()
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(n), LOCAL_WORLD_SIZE=str(n))
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)  # reuses our group
    model = GPT.from_init(cfg.model, cfg.seed)
    params = list(model.parameters())
    opt = (reference_optimizer(params, cfg.adam) if optimizer == "torch"
           else GradientProbe(params) if optimizer == "probe" else ZerospecAdam(params, cfg.adam))
    engine, *_ = deepspeed.initialize(model=model, optimizer=opt,
                                      config=ds_config(stage, cfg, settings, comms))
    return engine


def full_weights(engine) -> dict[str, torch.Tensor]:
    """Every weight, whole, "unit/param" → tensor (ZeRO-3 gathers its partitions: a collective)."""
    import deepspeed
    module = engine.module
    named = module.unit_params()
    with deepspeed.zero.GatheredParameters(list(named.values()), modifier_rank=None):
        return {k: p.detach().clone() for k, p in named.items()}


def _take_comms() -> list[tuple[str, int, int]]:
    """(op, recorded bytes, count) logged since the last call, and a fresh log."""
    from deepspeed.comm.comm import comms_logger
    out = [(DS_OPS.get(name, name), size, rec[0])
           for name, sizes in comms_logger.comms_dict.items() for size, rec in sizes.items()]
    comms_logger.comms_dict = {}
    return sorted(out)


# what one collective of full size S adds to the paper's per-step volume: a reduce-scatter, reduce,
# all-gather or broadcast of S counts S, an all-reduce 2S (per rank the ring moves (N-1)/N of it)
VOLUME = {"reduce_scatter": 1, "reduce": 1, "all_gather": 1, "broadcast": 1, "all_reduce": 2,
          "barrier": 0}


def full_numel(op: str, recorded: int, n: int, itemsize: int = 4) -> int:
    """S of one DeepSpeed op from its logged size, which is the op's *input* in bytes: the shard
    for all-gather (S = n × it), the whole S for reduce-scatter, reduce and all-reduce."""
    return recorded // itemsize * (n if op == "all_gather" else 1)


def volume(op: str, numel: int) -> int:
    """Elements of the paper's per-step volume that one ``op`` of full size ``numel`` moves."""
    if op not in VOLUME:
        raise ValueError(f"unknown collective {op!r}; accepted: {', '.join(VOLUME)}")
    return VOLUME[op] * numel


def ds_volume(phases: dict, n: int) -> dict[str, int]:
    """Phase → elements of volume for one step of :func:`run_deepspeed`'s ``comms``."""
    return {ph: sum(volume(op, full_numel(op, size, n)) * c for op, size, c in ops)
            for ph, ops in phases.items()}


def ledger_volume(records, step: int) -> dict[str, int]:
    """The same for zerospec's ledger records of ``step``, phases grouped as DeepSpeed's."""
    from .oracles import PHASE_GROUP
    out = {"forward": 0, "backward": 0, "step": 0}
    for r in records:
        if r.step == step:
            out[PHASE_GROUP[r.phase]] += volume(r.op, r.numel)
    return out


def run_deepspeed(stage: int, cfg, *, optimizer: str = "torch", settings: str = "default",
                  weights: bool = True) -> dict:
    """Train DeepSpeed ZeRO-``stage`` for ``cfg.steps`` steps on this process group.

    Returns this rank's ``losses`` and, with ``weights``, the full weights after every step; without,
    ``comms``: per step, phase ("forward", "backward", "step") → sorted (op, recorded bytes, count).
    One or the other: gathering ZeRO-3's weights re-partitions the parameters DeepSpeed keeps whole
    (persistent ones), which the next forward would then gather again — traffic of ours, not its.
    """
    rank, n = dist.get_rank(), dist.get_world_size()
    if cfg.n_d != n:
        raise ValueError(f"config n_d={cfg.n_d} but the process group has {n} ranks")
    comms = not weights
    engine = build(stage, cfg, optimizer, settings, comms)
    data = BigramData(cfg.model.vocab_size, cfg.model.block_size, cfg.seed)
    out: dict = {"losses": [], "weights": [], "comms": [], "host": []}
    host = None
    if settings in OFFLOADS and settings != OFFLOAD_NVME:   # its host buffers' copies, per step
        from .deepspeed_host import HostCopies
        host = HostCopies(engine.optimizer)
    if comms:
        _take_comms()   # engine start-up (parameter broadcast, partitioning) is not a step
    for step in range(cfg.steps):
        idx, tgt = data.batch(step, cfg.batch)
        loss = engine(BigramData.shard(idx, rank, n), BigramData.shard(tgt, rank, n))
        fwd = _take_comms() if comms else None
        with host or contextlib.nullcontext():
            engine.backward(loss)
            bwd = _take_comms() if comms else None
            engine.step()
        if host is not None:
            out["host"].append(host.take())
        if comms:
            out["comms"].append({"forward": fwd, "backward": bwd, "step": _take_comms()})
        out["losses"].append(loss.detach().clone())
        if weights:
            out["weights"].append(full_weights(engine))
    return out


# -- zerospec next to DeepSpeed, in the same processes --------------------------------------------
def compare_rank(ctx, cfg, stages, *, runs=(("torch", "default"),), weights: bool = True) -> list[dict]:
    """For each stage: zerospec's run, then DeepSpeed's for each (optimizer, settings) of ``runs``
    (with weights, or with comms: :func:`run_deepspeed`)."""
    from ..cluster.processes import new_context
    from .oracles import zerospec_rank
    out = []
    for k, stage in enumerate(stages):
        c = dataclasses.replace(cfg, stage=stage)
        zs = zerospec_rank(ctx if k == 0 else new_context(), c, count=False, weights=weights)
        ds = {(o, s): run_deepspeed(stage, c, optimizer=o, settings=s, weights=weights) for o, s in runs}
        out.append({"stage": stage, "zerospec": zs, "deepspeed": ds})
    return out


def compare(cfg, stages=(1, 2, 3), *, optimizers=("torch",), settings=("default",), runs=None,
            weights: bool = True, **launch_kw) -> list[dict]:
    """Launch ``cfg.n_d`` gloo processes; one row per stage: zerospec's losses (mean over ranks),
    weights per step (or None) and ledger records per rank, and DeepSpeed's per (optimizer,
    settings) — every pair of ``optimizers`` × ``settings``, or the pairs ``runs`` — losses and
    weights per step, or (``weights=False``) comms per rank, step and phase."""
    from ..cluster.processes import launch
    runs = tuple(runs) if runs is not None else tuple((o, s) for o in optimizers for s in settings)
    per_rank = launch(compare_rank, cfg.n_d, cfg, list(stages), runs=runs, weights=weights,
                      timeout=cfg.timeout, **launch_kw)
    rows = []
    for k, stage in enumerate(stages):
        zs = [per_rank[r][k]["zerospec"] for r in range(cfg.n_d)]
        row = {**zerospec_row(cfg, stage, zs, weights), "deepspeed": {}}
        for key in runs:
            ds = [per_rank[r][k]["deepspeed"][key] for r in range(cfg.n_d)]
            row["deepspeed"][key] = {"losses": mean_losses(ds, cfg), "weights": ds[0]["weights"],
                                     "comms": [d["comms"] for d in ds],
                                     "host": [d["host"] for d in ds]}
        rows.append(row)
    return rows


# -- N > 2: which order each engine adds the ranks' gradients in ---------------------------------
def _local_gradients(cfg) -> dict[str, torch.Tensor]:
    """This rank's step-1 gradient, before any reduction (the same module, weights and shard as
    both engines use; bit-equal to theirs, as the N = 2 parity shows)."""
    rank, n = dist.get_rank(), dist.get_world_size()
    model = GPT.from_init(cfg.model, cfg.seed)
    idx, tgt = BigramData(cfg.model.vocab_size, cfg.model.block_size, cfg.seed).batch(0, cfg.batch)
    model(BigramData.shard(idx, rank, n), BigramData.shard(tgt, rank, n)).backward()
    return {k: p.grad.clone() for k, p in model.unit_params().items()}


def _zerospec_gradient(ctx, cfg) -> list:
    """zerospec's reduced step-1 gradient, this rank's owned shards: Adam with β1 = 0 leaves
    exp_avg = 0·0 + g·(1 − 0) = g exactly, so the optimizer state after step 1 *is* the gradient."""
    from ..training import run as train
    cfg = cfg.replace(steps=1, adam=dataclasses.replace(cfg.adam, beta1=0.0))
    units = cfg.units()
    got: list = []

    def on_step(step, stage):
        got.extend((sl, m.detach().clone()) for (sl, _), m in zip(stage.owned_master(), stage.exp_avg))
    out = train.rank_main(ctx, cfg, units, train.initial_weights(cfg, units), train.make_batches(cfg),
                          on_step)
    return {"weights": [got], "records": ctx.comm.ledger.records(ctx.rank), "losses": out.losses}


def gradients_rank(ctx, cfg, stages, settings=SETTINGS) -> dict:
    """Step 1 on this rank: the local gradient, and per stage the reduced gradient of zerospec and
    of DeepSpeed (per settings; :class:`GradientProbe`)."""
    from ..cluster.processes import new_context
    one = dataclasses.replace(cfg, steps=1)
    out = {"local": _local_gradients(one), "stages": []}
    for k, stage in enumerate(stages):
        c = dataclasses.replace(one, stage=stage)
        zs = _zerospec_gradient(ctx if k == 0 else new_context(), c)
        ds = {s: run_deepspeed(stage, c, optimizer="probe", settings=s)["weights"][0] for s in settings}
        out["stages"].append({"zerospec": zs, "deepspeed": ds})
    return out


def reduced_gradients(cfg, stages=(1, 2, 3), settings=SETTINGS, **launch_kw) -> dict:
    """Launch ``cfg.n_d`` gloo processes; return every rank's local step-1 gradient ("local": a list
    over ranks of "unit/param" → tensor) and, per stage, the mean gradient each engine reduced
    from them ("zerospec": "unit/param" → tensor; "deepspeed": settings → the same)."""
    from ..cluster.processes import launch
    per_rank = launch(gradients_rank, cfg.n_d, cfg, list(stages), tuple(settings),
                      timeout=cfg.timeout, **launch_kw)
    rows = {}
    for k, stage in enumerate(stages):
        zs = [per_rank[r]["stages"][k]["zerospec"] for r in range(cfg.n_d)]
        one = dataclasses.replace(cfg, steps=1)
        rows[stage] = {"zerospec": zerospec_row(one, stage, zs, True)["weights"][0],
                       "deepspeed": per_rank[0]["stages"][k]["deepspeed"]}
    return {"local": [per_rank[r]["local"] for r in range(cfg.n_d)], "stages": rows}
