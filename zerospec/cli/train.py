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


def add_parser(sub) -> None:
    from . import argtypes as T
    from ..optim.precision import POLICIES
    from ..paper.theory import ZERO1_COMM
    p = sub.add_parser("train", description=__doc__.splitlines()[0].replace("``", ""), help=HELP)
    p.add_argument("--backend", choices=BACKENDS, default="sim",
                   help="sim: virtual GPUs as threads; torch: real processes (default sim)")
    p.add_argument("--stage", type=int, choices=(0, 1, 2, 3), default=3, help="ZeRO stage, default 3")
    p.add_argument("--ranks", type=int, default=None,
                   help="GPUs N = N_d × N_m (default 4; under torchrun: its world size)")
    p.add_argument("--mp", type=T.positive_int, default=1, metavar="N_M",
                   help="model-parallel degree N_m: Megatron-LM slicing inside groups of N_M "
                        "neighbouring ranks, ZeRO over the other N/N_M (spec/model_parallel.md; "
                        "default 1)")
    p.add_argument("--steps", type=int, default=5, help="training steps, default 5")
    p.add_argument("--precision", choices=tuple(POLICIES), default="fp16", help="default fp16")
    p.add_argument("--model", choices=MODELS, default="small", help="tiny GPT preset, default small")
    p.add_argument("--attention", choices=("eager", "sdpa"), default="eager",
                   help="attention kernel: eager (written out, default) or sdpa (saves only q, k, "
                        "v, the output and a log-sum-exp per row; same values, spec/models.md)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--zero1-comm", choices=ZERO1_COMM, default="reduce_scatter",
                   help="stage 1 gradient sync (default reduce_scatter)")
    p.add_argument("--timeout", type=T.positive_float, default=120.0,
                   help="seconds a collective may wait before every rank fails, default 120")
    nodes = p.add_argument_group("nodes and ZeRO++'s hpZ (spec/nodes.md)")
    nodes.add_argument("--gpus-per-node", type=T.positive_int, default=None, metavar="G",
                       help="ranks sit on nodes of G GPUs (rank r on node r // G); default: one node")
    nodes.add_argument("--hpz", type=T.positive_int, default=1, metavar="H",
                       help="zero_hpz_partition_size: stage 3's backward all-gather inside H ranks "
                            "of a node (H must divide G); default 1, off")
    nodes.add_argument("--shard-group", type=T.positive_int, default=None, metavar="P",
                       help="MiCS / FSDP2's HSDP (spec/mics.md): shard stages 1-3 over groups of P "
                            "consecutive ranks (P must divide the ranks), replicate across groups; "
                            "default: shard over every rank")
    nodes.add_argument("--qwz", action="store_true",
                       help="zero_quantized_weights: stage 3's weight all-gathers as int8 "
                            "(spec/zeropp.md; approximate)")
    nodes.add_argument("--qgz", action="store_true",
                       help="zero_quantized_gradients: stage 3's gradient reduce-scatter as an "
                            "int4 all-to-all, inside the node then across (approximate)")
    nodes.add_argument("--quant-group-size", type=T.positive_int, default=None, metavar="G_Q",
                       help="elements per quantization scale; default DeepSpeed's (up to 8000)")
    r = p.add_argument_group("surviving real conditions (spec/loss_scaling.md, clipping.md, "
                             "accumulation.md)")
    r.add_argument("--loss-scale", type=T.positive_float, default=None, metavar="INIT",
                   help="dynamic fp16 loss scaling from this initial scale, e.g. 65536 "
                        "(GradScaler's rules; default off)")
    r.add_argument("--clip-grad-norm", type=T.positive_float, default=None, metavar="MAX",
                   help="clip the global gradient norm to MAX (default off)")
    r.add_argument("--grad-accum", type=T.positive_int, default=1, metavar="G",
                   help="micro-batches per optimizer step, summed exactly (default 1)")
    o = p.add_argument_group("ZeRO-Offload (spec/offload.md)")
    o.add_argument("--offload-optimizer", choices=("cpu", "nvme"), default=None,
                   help="fp32 master, momentum, variance and Adam on the host (nvme: the states "
                        "in swap files between steps); needs --stage 2 or 3; default off")
    o.add_argument("--offload-mode", choices=("paper", "deepspeed"), default="paper",
                   help="paper: fp16 gradients down (4 bytes per parameter per step over PCIe); "
                        "deepspeed: fp32 gradients down (6); default paper")
    o.add_argument("--offload-params", choices=("cpu", "nvme"), default=None,
                   help="ZeRO-Infinity's parameter offload: stage 3's fp16 chunks on the host "
                        "(cpu) or in NVMe swap files (nvme), fetched NVMe -> host -> device for "
                        "each use; needs --stage 3 and --offload-optimizer")
    o.add_argument("--offload-partition", choices=("bandwidth", "owner"), default="bandwidth",
                   help="where offloaded parameters live: bandwidth (C-I8: every rank 1/N, "
                        "each PCIe link 1/N per fetch, then an all-gather) or owner (the "
                        "baseline: one rank holds each unit, its link carries all, then a "
                        "broadcast); default bandwidth")
    o.add_argument("--offload-buffer-elements", type=int, default=None, metavar="N",
                   help="with --offload-params nvme: read parameters through one host buffer of N "
                        "elements (at least the largest unit a rank reads); default a buffer "
                        "per fetch")
    o.add_argument("--offload-prefetch", action="store_true",
                   help="C-I8's prefetcher for offloaded parameters (bandwidth partition): before "
                        "operator i, read i+3 from NVMe, copy i+2 up, all-gather i+1")
    o.add_argument("--nvme-path", default=None, metavar="DIR",
                   help="an existing directory for the NVMe tier's swap files (default: a "
                        "temporary one)")
    o.add_argument("--tiles", type=int, default=1, metavar="T",
                   help="memory-centric tiling (C-I3): each block's MLP weights as T units along "
                        "d_ff, each gathered just before its slice of the MLP and freed after "
                        "(T must divide d_ff; not with --mp or --checkpoint-activations); "
                        "default 1: off")
    o.add_argument("--dpu", type=int, default=0, metavar="N",
                   help="one-step delayed parameter update from step N (approximate, B8); "
                        "default 0: off")
    z = p.add_argument_group("ZeRO-R (spec/activations.md)")
    z.add_argument("--checkpoint-activations", type=int, default=0, metavar="K",
                   help="activation checkpointing: keep the input of every K-th transformer block, "
                        "recompute the rest in backward (1: one checkpoint per block; "
                        "default 0: off)")
    z.add_argument("--partition-activations", action="store_true",
                   help="P_a: keep 1/N_m of each checkpoint per MP rank, all-gathered before the "
                        "recompute (needs --mp >= 2 and --checkpoint-activations)")
    z.add_argument("--cpu-checkpointing", action="store_true",
                   help="P_a+cpu: keep the partitioned checkpoints in host memory "
                        "(needs --partition-activations)")
    z.add_argument("--contiguous-checkpoints", action="store_true",
                   help="M_D: copy the checkpoints into one buffer per step (spec/allocator.md)")
    z.add_argument("--contiguous-gradients", action="store_true",
                   help="M_D for gradients: stages 2–3 write every unit's gradient into one "
                        "slot allocated once")
    z.add_argument("--bucket-size", type=_bucket_size, default=None, metavar="B|model",
                   help="reduce gradients (and stage 1/2's parameter gathers) through buckets of "
                        "at most B elements (C_B, spec/buffers.md); 'model': one fp32 buffer of "
                        "the whole model (C29's naive buffer); default: one collective per unit")


def _bucket_size(text: str):
    """``--bucket-size``: an integer >= 1, or ``model``."""
    import argparse
    if text == "model":
        return text
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1 or 'model', got {text!r}")
    return n


def _config(args, n_ranks: int):
    from ..model import gpt
    from ..optim.loss_scale import LossScale
    from ..training.config import TrainConfig
    if n_ranks % args.mp:
        raise UsageError(f"--ranks {n_ranks} must be a multiple of --mp {args.mp} "
                         f"(N = N_d × N_m)")
    scale = LossScale(init_scale=args.loss_scale) if args.loss_scale is not None else None
    return TrainConfig(stage=args.stage, n_d=n_ranks // args.mp, n_m=args.mp,
                       partition_activations=args.partition_activations,
                       cpu_checkpointing=args.cpu_checkpointing,
                       contiguous_checkpoints=args.contiguous_checkpoints,
                       contiguous_gradients=args.contiguous_gradients,
                       model=dataclasses.replace({"small": gpt.SMALL, "odd": gpt.ODD}[args.model],
                                                 attention=args.attention),
                       steps=args.steps, seed=args.seed, zero1_comm=args.zero1_comm,
                       precision=args.precision, timeout=args.timeout, loss_scale=scale,
                       clip_grad_norm=args.clip_grad_norm, grad_accum_steps=args.grad_accum,
                       checkpoint_activations=args.checkpoint_activations,
                       bucket_elements=args.bucket_size,
                       gpus_per_node=args.gpus_per_node, hpz=args.hpz,
                       offload_optimizer=args.offload_optimizer, offload_mode=args.offload_mode,
                       offload_params=args.offload_params, nvme_path=args.nvme_path,
                       offload_partition=args.offload_partition,
                       offload_buffer_elements=args.offload_buffer_elements,
                       offload_prefetch=args.offload_prefetch,
                       dpu=args.dpu,
                       shard_group=args.shard_group, qwz=args.qwz, qgz=args.qgz,
                       quant_group_size=args.quant_group_size, tiles=args.tiles)


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
        extra += [("elements leaving node 0", lambda s: f"{comm.crossing(0, step=s + 1):,}")]
        if cfg.qwz or cfg.qgz:   # int8, packed int4 and fp32 scales: bytes are the measure
            extra += [("bytes leaving node 0", lambda s: f"{comm.crossing_bytes(0, step=s + 1):,}")]
    if cfg.n_m > 1:   # each group's traffic on its own (MP inside a node, DP across)
        extra = [("MP elements", lambda s: f"{comm.elements(0, step=s + 1, group='mp'):,}"),
                 ("host link bytes", lambda s: f"{comm.link_bytes(0, step=s + 1, group='host'):,}"),
                 *extra]
    if cfg.offload_optimizer:   # ZeRO-Offload's PCIe (and NVMe) copies, apart from collectives
        links = ("host", "nvme") if "nvme" in (cfg.offload_optimizer, cfg.offload_params) \
            else ("host",)
        extra += [(f"{k} link bytes", lambda s, k=k: f"{comm.link_bytes(0, step=s + 1, group=k):,}")
                  for k in links]
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
             + (", P_a+cpu" if cfg.cpu_checkpointing else ", P_a" if cfg.partition_activations else "")
             + (f", {cfg.n_ranks // cfg.gpus_per_node} nodes × {cfg.gpus_per_node} GPUs"
                if cfg.gpus_per_node else "") + (f", hpZ h = {cfg.hpz}" if cfg.hpz > 1 else "")
             + (f", optimizer offloaded to {cfg.offload_optimizer} ({cfg.offload_mode})"
                if cfg.offload_optimizer else "")
             + (f", parameters offloaded to {cfg.offload_params} ({cfg.offload_partition} "
                f"partition{', prefetch' if cfg.offload_prefetch else ''})" if cfg.offload_params
                else "") + (f", DPU from step {cfg.dpu}" if cfg.dpu else "")
             + (f", MiCS partition groups of {cfg.shard_group}" if cfg.shard_group else "")
             + (", qwZ" if cfg.qwz else "") + (", qgZ" if cfg.qgz else ""),
             f"model states on rank 0: {result.model_states(0):,} B"
             + (f"; activation checkpoints: {result.memory[0].peak['checkpoints']:,} B on the "
                f"device at the peak" if cfg.checkpoint_activations else ""), "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in range(1, cfg.steps + 1):
        recs = comm.records(0, step=s, group=own)
        n = len(recs) if cfg.offload_optimizer else len(comm.records(0, step=s))   # not copies
        cells = [str(s), f"{result.losses[s - 1]:.6f}", str(n),
                 f"{sum(r.elements_sent for r in recs):,}", f"{sum(r.wire_elements_sent for r in recs):,}",
                 *(cell(s - 1) for _, cell in extra)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run(args) -> int:
    if args.steps < 1:
        raise UsageError(f"--steps must be >= 1, got {args.steps}")
    if args.ranks is not None and args.ranks < 1:
        raise UsageError(f"--ranks must be >= 1, got {args.ranks}")
    if args.backend == "sim":
        from ..training.run import train
        print(summary(train(_config(args, args.ranks or 4)), "sim"))
        return 0
    if "WORLD_SIZE" in os.environ and "RANK" in os.environ:
        return _run_torchrun(args)
    from ..training.run import train_processes
    print(summary(train_processes(_config(args, args.ranks or 4)), "torch (gloo, local processes)"))
    return 0


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
        mine, = tr.train_rank(ctx, [cfg])
        # reporting only: gathered outside the Interconnect, so the ledger does not count it
        mine = _to_cpu(mine)
        every = [None] * world
        dist.gather_object(mine, every if ctx.rank == 0 else None, dst=0)
        if ctx.rank == 0:
            backend = f"torch ({dist.get_backend()}, torchrun)"
            print(summary(tr.assemble(cfg, every), backend))
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
