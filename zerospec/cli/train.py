"""``zerospec train``: one ZeRO stage, on the virtual cluster or on real processes.

    python -m zerospec train --backend sim --stage 3 --ranks 4              # threads, simulated wire
    python -m zerospec train --backend torch --stage 3 --ranks 4            # 4 local gloo processes
    torchrun --nproc-per-node 4 -m zerospec train --backend torch --stage 3 # torchrun's processes

The same config prints the same table on either backend (losses per step, traffic per rank), so a
user can put the simulator next to the real engine. Under torchrun the world size comes from
torchrun (``--ranks``, if given, must agree) and the usual rendezvous flags work across machines;
NCCL is used when CUDA is available, gloo otherwise.
"""
from __future__ import annotations

import dataclasses
import datetime
import os

from .argtypes import UsageError

BACKENDS = ("sim", "torch")
MODELS = ("small", "odd")


HELP = ("train one ZeRO stage on the simulator or on real processes (torch.distributed), and print "
        "losses and traffic")


# the section options `zerospec train` takes, by group (flags: zerospec/training/sections.py)
GROUPS = {None: ("n_m", "precision", "zero1_comm", "flavour"),
          "nodes and ZeRO++'s hpZ (spec/nodes.md)": (
              "gpus_per_node", "hpz", "shard_group", "qwz", "qgz", "quant_group_size"),
          "surviving real conditions (spec/loss_scaling.md, clipping.md, accumulation.md)": (
              "loss_scale", "clip_grad_norm", "grad_accum_steps"),
          "ZeRO-Offload (spec/offload.md)": (
              "offload_optimizer", "offload_mode", "offload_params", "offload_partition",
              "offload_buffer_elements", "offload_prefetch", "nvme_path", "tiles", "dpu"),
          "ZeRO-R (spec/activations.md)": (
              "checkpoint_activations", "activation_checkpointing", "partition_activations",
              "cpu_checkpointing",
              "contiguous_checkpoints", "contiguous_gradients", "stage3_persistence_threshold",
              "stage3_max_reuse_distance", "bucket_elements")}


def add_parser(sub) -> None:
    from . import argtypes as T
    from .options import add_attention, add_flags
    p = sub.add_parser("train", description=__doc__.splitlines()[0].replace("``", ""), help=HELP)
    p.add_argument("--backend", choices=BACKENDS, default="sim",
                   help="sim: virtual GPUs as threads; torch: real processes (default sim)")
    p.add_argument("--stage", type=int, choices=(0, 1, 2, 3), default=3, help="ZeRO stage, default 3")
    p.add_argument("--ranks", type=int, default=None,
                   help="GPUs N = N_d × N_m (default 4; under torchrun: its world size)")
    p.add_argument("--steps", type=int, default=5, help="training steps, default 5")
    p.add_argument("--model", choices=MODELS, default="small", help="tiny GPT preset, default small")
    add_attention(p)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=T.positive_float, default=120.0,
                   help="seconds a collective may wait before every rank fails, default 120")
    p.add_argument("--format", choices=("table", "json"), default="table",
                   help="json: the configuration, each step's loss as an exact float (float.hex), "
                        "the ledgers' totals and a sha256 of the final fp32 masters; default table")
    p.add_argument("--save", default=None, metavar="DIR",
                   help="write the run's checkpoint files to DIR after the last step")
    p.add_argument("--resume", default=None, metavar="DIR",
                   help="continue from the checkpoint in DIR up to --steps")
    for title, names in GROUPS.items():
        add_flags(p if title is None else p.add_argument_group(title), names)


def _config(args, n_ranks: int):
    from ..model import gpt
    from ..training.config import TrainConfig
    from .options import given
    mp = args.n_m or 1
    if n_ranks % mp:
        raise UsageError(f"--ranks {n_ranks} must be a multiple of --mp {mp} "
                         f"(N = N_d × N_m)")
    options = given(args, [n for names in GROUPS.values() for n in names])
    model = {"small": gpt.SMALL, "odd": gpt.ODD}[args.model]
    if args.attention is not None:
        model = dataclasses.replace(model, attention=args.attention)
    return TrainConfig.of(stage=args.stage, n_d=n_ranks // mp, model=model,
                          steps=args.steps, seed=args.seed, timeout=args.timeout, **options)


def summary(result, backend: str) -> str:
    """The table both backends print: per step, mean loss and rank 0's traffic."""
    cfg, comm = result.config, result.comm
    extra = []   # the robustness columns, only for the options that are on
    if cfg.loss_scale is not None:
        extra += [("loss scale", lambda s: f"{result.loss_scales[s]:g}"),
                  ("skipped", lambda s: "yes" if result.skipped[s] else "no")]
    if cfg.clip_grad_norm is not None:
        extra += [("grad norm", lambda s: f"{result.grad_norms[s]:.6g}")]
    if cfg.gpus_per_node:   # what crosses the network (spec/nodes.md)
        extra += [("elements leaving node 0", lambda s: f"{comm.crossing(0, step=first + s):,}")]
        if cfg.qwz or cfg.qgz:   # int8, packed int4 and fp32 scales: bytes are the measure
            extra += [("bytes leaving node 0", lambda s: f"{comm.crossing_bytes(0, step=first + s):,}")]
    if cfg.n_m > 1:   # each group's traffic on its own (MP inside a node, DP across)
        extra = [("MP elements", lambda s: f"{comm.elements(0, step=first + s, group='mp'):,}"),
                 ("host link bytes", lambda s: f"{comm.link_bytes(0, step=first + s, group='host'):,}"),
                 *extra]
    if cfg.offload_optimizer:   # ZeRO-Offload's PCIe (and NVMe) copies, apart from collectives
        links = ("host", "nvme") if "nvme" in (cfg.offload_optimizer, cfg.offload_params) \
            else ("host",)
        extra += [(f"{k} link bytes", lambda s, k=k: f"{comm.link_bytes(0, step=first + s, group=k):,}")
                  for k in links]
    first = cfg.steps - len(result.losses) + 1   # after --resume: the first step run
    sent = "DP elements sent (rank 0)" if cfg.n_m > 1 else "elements sent (rank 0)"
    head = ["step", "loss", "collectives", sent, "wire elements (rank 0)",
            *(name for name, _ in extra)]
    own = "dp" if cfg.n_m > 1 else "world" if cfg.offload_optimizer else None
    mp = f" × N_m = {cfg.n_m} (Ψ per MP rank)" if cfg.n_m > 1 else ""
    lines = [f"{cfg.label} (stage {cfg.stage}), N_d = {cfg.n_d}{mp}, Ψ = {result.psi:,}, "
             f"{cfg.precision}, backend {backend}"
             + (f", {cfg.model.attention} attention" if cfg.model.attention != "eager" else "")
             + (f", {cfg.grad_accum_steps} micro-batches per step" if cfg.grad_accum_steps > 1 else "")
             + (f", activation checkpoint every {cfg.checkpoint_activations} block(s)"
                if cfg.checkpoint_activations else "")
             + ((", P_a+cpu" if cfg.partition_activations else ", checkpoints on the host")
                if cfg.cpu_checkpointing else ", P_a" if cfg.partition_activations else "")
             + (f", {cfg.n_ranks // cfg.gpus_per_node} nodes × {cfg.gpus_per_node} GPUs"
                if cfg.gpus_per_node else "") + (f", hpZ h = {cfg.hpz}" if cfg.hpz > 1 else "")
             + (", FSDP2's CPUOffloadPolicy" if cfg.offload_optimizer and cfg.flavour == "fsdp2"
                else f", optimizer offloaded to {cfg.offload_optimizer} ({cfg.offload_mode})"
                if cfg.offload_optimizer else "")
             + (f", parameters offloaded to {cfg.offload_params} ({cfg.offload_partition} "
                f"partition{', prefetch' if cfg.offload_prefetch else ''})"
                if cfg.offload_params and cfg.flavour != "fsdp2" else "") + (f", DPU from step {cfg.dpu}" if cfg.dpu else "")
             + (f", MiCS partition groups of {cfg.shard_group}" if cfg.shard_group else "")
             + (", qwZ" if cfg.qwz else "") + (", qgZ" if cfg.qgz else ""),
             f"model states on rank 0: {result.model_states(0):,} B"
             + (f"; activation checkpoints: {result.memory[0].peak['checkpoints']:,} B on the "
                f"device at the peak" if cfg.checkpoint_activations else ""), "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for k, loss in enumerate(result.losses):
        s = first + k
        recs = comm.records(0, step=s, group=own)
        n = len(recs) if cfg.offload_optimizer else len(comm.records(0, step=s))   # not copies
        cells = [str(s), f"{loss:.6f}", str(n),
                 f"{sum(r.elements_sent for r in recs):,}", f"{sum(r.wire_elements_sent for r in recs):,}",
                 *(cell(k) for _, cell in extra)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run(args) -> int:
    if args.steps < 1:
        raise UsageError(f"--steps must be >= 1, got {args.steps}")
    if args.ranks is not None and args.ranks < 1:
        raise UsageError(f"--ranks must be >= 1, got {args.ranks}")
    if "WORLD_SIZE" in os.environ and "RANK" in os.environ and args.backend == "torch":
        return _run_torchrun(args)
    from ..training import run as tr
    cfg = _config(args, args.ranks or 4)
    kw = _checkpoints(args, cfg)
    if args.backend == "sim":
        _print(args, tr.train(cfg, **kw), "sim")
    else:
        _print(args, tr.train_processes(cfg, **kw), "torch (gloo, local processes)")
    return 0


def _checkpoints(args, cfg) -> dict:
    """``--save`` / ``--resume`` as train()'s ``save`` and ``resume`` (training/checkpoint.py)."""
    from ..training import checkpoint
    kw = {}
    if args.save is not None:
        kw["save"] = {cfg.steps: args.save}
    if args.resume is not None:
        kw["resume"] = checkpoint.load(args.resume, n_ranks=cfg.n_d)   # train() checks the layout
    return kw


def _print(args, result, backend: str) -> None:
    if args.format == "json":
        import json
        from ..training.record import record
        print(json.dumps(record(result), indent=1))
    else:
        print(summary(result, backend))


def _run_torchrun(args) -> int:
    """One of torchrun's processes: join its group, run this rank, rank 0 prints the table."""
    import torch
    import torch.distributed as dist

    from ..training import run as tr
    from ..comm.torch_dist import check_torch_version, rank_context
    check_torch_version()
    world = int(os.environ["WORLD_SIZE"])
    if args.ranks is not None and args.ranks != world:
        raise UsageError(f"--ranks {args.ranks} disagrees with torchrun's world size {world}")
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if cuda else "gloo",
                            timeout=datetime.timedelta(seconds=args.timeout))
    try:
        cfg = _config(args, world)
        ctx = rank_context(f"cuda:{torch.cuda.current_device()}" if cuda else "cpu",
                           store=dist.distributed_c10d._get_default_store())
        mine, = tr.train_rank(ctx, [cfg], **_checkpoints(args, cfg))
        # reporting only: gathered outside the Interconnect, so the ledger does not count it
        mine = _to_cpu(mine)
        every = [None] * world
        dist.gather_object(mine, every if ctx.rank == 0 else None, dst=0)
        if ctx.rank == 0:
            backend = f"torch ({dist.get_backend()}, torchrun)"
            _print(args, tr.assemble(cfg, every), backend)
    finally:
        dist.destroy_process_group()
    return 0


def _to_cpu(x):
    import torch
    if isinstance(x, torch.Tensor):
        return x.cpu()
    if isinstance(x, dict):
        return {k: _to_cpu(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_to_cpu(v) for v in x)
    if hasattr(x, "__dataclass_fields__"):
        import dataclasses
        return dataclasses.replace(x, **{f: _to_cpu(getattr(x, f)) for f in x.__dataclass_fields__})
    return x
