"""``zerospec scale``: measure a paper-size model on meta tensors (one step per stage) as a table.

    python -m zerospec scale --preset 7.5B --gpus 64 --stages 0,1,2,3
    python -m zerospec scale --layers 48 --hidden 1600 --heads 16 --gpus 1024
    python -m zerospec scale --list
"""
from __future__ import annotations

from .argtypes import UsageError


def _usage(message: str) -> Exception:
    return UsageError(message)


HELP = ("measure per-GPU model states and traffic of a paper-size model on meta tensors (no memory "
        "needed)")


def add_parser(sub) -> None:
    from . import argtypes as T
    p = sub.add_parser("scale", description=__doc__.splitlines()[0].replace("``", ""), help=HELP)
    p.add_argument("--preset", default=None, help="a model from zerospec.model.presets (see --list); "
                                                  "default 7.5B unless --layers/--hidden are given")
    p.add_argument("--gpus", type=T.positive_int, default=64,
                   help="GPUs N = N_d × N_m, default 64 (N_d = N without --mp)")
    p.add_argument("--mp", type=T.positive_int, default=1, metavar="N_M",
                   help="model-parallel degree N_m (spec/model_parallel.md), default 1")
    p.add_argument("--checkpoint-activations", type=int, default=0, metavar="K",
                   help="a checkpoint every K blocks (default 0: off)")
    p.add_argument("--partition-activations", action="store_true",
                   help="P_a: 1/N_m of each checkpoint per MP rank (needs --mp >= 2 and K >= 1)")
    p.add_argument("--cpu-checkpointing", action="store_true",
                   help="P_a+cpu: the partitioned checkpoints in host memory")
    p.add_argument("--stages", default="0,1,2,3", help="comma-separated ZeRO stages, default 0,1,2,3")
    p.add_argument("--micro-batch", type=T.positive_int, default=1, help="sequences per GPU, default 1")
    p.add_argument("--zero1-comm", default="reduce_scatter", help="stage 1 gradient sync: "
                   "reduce_scatter (2Ψ, default) or all_reduce (3Ψ)")
    for flag, what in (("layers", "transformer blocks"), ("hidden", "width d"), ("heads", "heads"),
                       ("vocab", "vocabulary (default 50257)"),
                       ("seq", "sequence length (default 1024)")):
        p.add_argument(f"--{flag}", type=T.positive_int, default=None, help=f"custom model: {what}")
    p.add_argument("--machine", type=T.machine, default=None,
                   help=T.machine_help("adds each stage's peak bytes per GPU and whether they fit "
                                       "its GPU's memory"))
    p.add_argument("--list", action="store_true", help="list the presets with their exact Ψ")
    p.add_argument("--gpus-per-node", type=T.positive_int, default=None, metavar="G",
                   help="GPUs per node (rank r on node r // G): adds what leaves node 0 per step "
                        "(spec/nodes.md); default: one node")
    p.add_argument("--hpz", type=T.positive_int, default=1, metavar="H",
                   help="ZeRO++'s hpZ for stage 3 (zero_hpz_partition_size; H must divide G), "
                        "default 1: off")
    p.add_argument("--shard-group", type=T.positive_int, default=None, metavar="P",
                   help="MiCS / FSDP2's HSDP for stages 1-3 (spec/mics.md): shard over groups of P "
                        "ranks (P must divide the data-parallel GPUs), replicate across them")
    p.add_argument("--qwz", action="store_true",
                   help="ZeRO++'s qwZ for stage 3: int8 weight all-gathers (spec/zeropp.md)")
    p.add_argument("--qgz", action="store_true",
                   help="ZeRO++'s qgZ for stage 3: an int4 all-to-all gradient reduction")
    p.add_argument("--quant-group-size", type=T.positive_int, default=None, metavar="G_Q",
                   help="elements per qwZ/qgZ scale (default: DeepSpeed's choice)")
    p.add_argument("--offload-optimizer", choices=("cpu", "nvme"), default=None,
                   help="ZeRO-Offload for stages 2-3 (spec/offload.md): adds each stage's host, "
                        "NVMe and per-link bytes per step")
    p.add_argument("--offload-mode", choices=("paper", "deepspeed"), default="paper",
                   help="with --offload-optimizer: fp16 (paper, default) or fp32 (deepspeed) "
                        "gradients down")
    p.add_argument("--offload-params", choices=("cpu", "nvme"), default=None,
                   help="ZeRO-Infinity for stage 3: parameter partitions on the host or NVMe")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="with --gpus-per-node: write DIR/node_bytes.svg (and .png), node 0's bytes "
                        "inside vs across nodes per collective, a bar per stage measured; with "
                        "--offload-optimizer: DIR/link_bytes.svg, rank 0's bytes per link and "
                        "direction per step, each stage with and without offload")


def _stages(text: str) -> tuple[int, ...]:
    try:
        stages = tuple(int(s) for s in text.split(","))
    except ValueError:
        stages = ()
    if not stages or any(s not in (0, 1, 2, 3) for s in stages):
        raise _usage(f"--stages must be a comma-separated list of 0, 1, 2, 3; got {text!r}")
    return stages


def _model(args):
    from ..model.gpt import GPTConfig
    from ..model.presets import GPT2_CONTEXT, GPT2_VOCAB, preset
    custom = [args.layers, args.hidden, args.heads, args.vocab, args.seq]
    if any(v is not None for v in custom):
        if args.preset is not None:
            raise _usage("give either --preset or --layers/--hidden/--heads/--vocab/--seq, not both")
        if args.layers is None or args.hidden is None:
            raise _usage("a custom model needs at least --layers and --hidden")
        heads = args.heads if args.heads is not None else max(1, args.hidden // 128)
        if args.hidden % heads:
            given = "--heads" if args.heads is not None else "heads (default: --hidden/128, GPT-2's head width)"
            raise _usage(f"--hidden {args.hidden} must be divisible by {given} {heads}: every head "
                         f"gets --hidden/heads dimensions")
        model = GPTConfig(vocab_size=GPT2_VOCAB if args.vocab is None else args.vocab,
                          block_size=GPT2_CONTEXT if args.seq is None else args.seq,
                          n_layer=args.layers, n_head=heads, n_embd=args.hidden)
        return f"custom {args.layers}×{args.hidden}", model
    p = preset(args.preset or "7.5B")
    return p.name, p.model


def run(args) -> int:
    from ..model.presets import PRESETS
    from ..render.format import markdown
    from ..render.spec_tables import scale_table
    from ..training.scale import measure
    from ..model.megatron import psi_padding
    if args.list:
        print(markdown(["preset", "layers", "hidden", "heads", "Ψ", "source"],
                       [[p.name, p.model.n_layer, p.model.n_embd, p.model.n_head, f"{p.psi:,}", p.source]
                        for p in PRESETS.values()]), end="")
        return 0
    stages = _stages(args.stages)
    name, model = _model(args)
    if args.gpus % args.mp:
        raise _usage(f"--gpus {args.gpus} must be a multiple of --mp {args.mp} (N = N_d × N_m)")
    n_d = args.gpus // args.mp
    kw = dict(micro_batch=args.micro_batch, zero1_comm=args.zero1_comm, n_m=args.mp,
              checkpoint_activations=args.checkpoint_activations,
              partition_activations=args.partition_activations,
              cpu_checkpointing=args.cpu_checkpointing, gpus_per_node=args.gpus_per_node)
    off = {} if args.offload_optimizer is None and args.offload_params is None else dict(
        offload_optimizer=args.offload_optimizer, offload_mode=args.offload_mode,
        offload_params=args.offload_params)
    if off and any(s < 2 for s in stages):
        raise _usage(f"--offload-optimizer (ZeRO-Offload) is built on stages 2 and 3; got --stages "
                     f"{args.stages} (accepted: 2, 3 or 2,3)")
    if args.out is not None and args.gpus_per_node is None and not off:
        raise _usage("--out draws the bytes inside vs across nodes: add --gpus-per-node G (or the "
                     "bytes per link with offload: add --offload-optimizer cpu|nvme)")
    zpp = dict(hpz=args.hpz, qwz=args.qwz, qgz=args.qgz, quant_group_size=args.quant_group_size)
    results = {s: measure(model, s, n_d, **(zpp if s == 3 else {}),
                          shard_group=args.shard_group if s else None, **kw, **off) for s in stages}
    grid = f"N_d = {n_d}" + (f" × N_m = {args.mp} (Ψ per MP rank below, vocabulary padded to "
                             f"{model.padded_vocab(args.mp):,} rows: {psi_padding(model, args.mp):,} "
                             f"padding elements over the MP group, not in Ψ)" if args.mp > 1 else "")
    print(f"{name}: {model.n_layer} layers, hidden {model.n_embd}, {model.n_head} heads, vocab "
          f"{model.vocab_size}, seq {model.block_size}, {model.attention} attention; "
          f"Ψ = {model.psi:,}; {grid}; "
          f"measured on meta tensors, one step per stage "
          f"({sum(r.seconds for r in results.values()):.1f} s)\n")
    if args.machine is None:
        print(scale_table(results), end="")
        _crossing(results, args)
        _links(results, args, model, n_d, kw, off)
        return 0
    from ..paper.hardware import MACHINES
    m = MACHINES[args.machine]
    print(scale_table(results, m.memory_bytes), end="")
    print(f"\nFits: the highest peak of any rank (its device ledger: model states, activations, "
          f"buffers; no allocator fragmentation) against {m.memory_bytes / 1e9:g} GB per GPU of "
          f"--machine {args.machine}, {m.name}.")
    _crossing(results, args)
    _links(results, args, model, n_d, kw, off)
    return 0


def _links(results, args, model, n_d: int, kw: dict, off: dict) -> None:
    """With offload: rank 0's tiers and links per stage (zerospec/plan/offload.py); with --out,
    DIR/link_bytes.svg, each stage measured without offload too."""
    if not off:
        return
    from ..plan.offload import LABELS, offload_bytes, run_label, save
    print("\nTiers and links (rank 0, one step; spec/offload.md)")
    runs = {}
    for s, r in results.items():
        ob = runs[run_label(r.config)] = offload_bytes(r)
        print(f"  stage {s}: device {ob.device_states:,} B of model states, host {ob.host_states:,}"
              f" B (peak {ob.host_peak:,}), NVMe {ob.nvme:,} B; per step "
              + ", ".join(f"{LABELS[op]} {ob.moved[op]:,} B" for op in list(LABELS)[1:]))
    if args.out is not None and args.gpus_per_node is None:
        from ..training.scale import measure
        plain = {s: offload_bytes(measure(model, s, n_d, **kw)) for s in results}
        runs = {f"ZeRO-{s}": ob for s, ob in plain.items()} | runs
        title = f"N_d = {n_d}: bytes rank 0 moves per step, per link and direction"
        print(f"\nDrawn: {save(runs, args.out, title)}")


def _crossing(results, args) -> None:
    """With --gpus-per-node: what leaves node 0 per step (its last GPU's sends, a flat ring)."""
    g = args.gpus_per_node
    if g is None:
        return
    print(f"\nAcross nodes ({args.gpus // g} nodes × {g} GPUs, a flat ring in rank order; "
          f"spec/nodes.md): elements leaving node 0 per step")
    for s, r in results.items():
        led = r.comm_ledger([g - 1])     # node 0's sends across leave from its last GPU
        psi = r.psi_padded
        hpz = f", hpZ h = {args.hpz}: secondary shards {r.memory(g - 1).peak['secondary16']:,} B " \
              f"per GPU" if s == 3 and args.hpz > 1 else ""
        quantized = s == 3 and (args.qwz or args.qgz)
        if quantized:   # qgZ sends from every GPU of the node; bytes, as int8/int4 travel
            led = r.comm_ledger(range(g))
            hpz += f"; {led.crossing_bytes(0):,} B = " \
                   f"{float(led.crossing_bytes(0) / (2 * psi)):.4f}Ψ in fp16 elements (bytes / 2)"
        print(f"  stage {s}: {led.crossing(0):,} ({float(led.crossing(0) / psi):.4f}Ψ){hpz}")
    if args.out is not None:
        from ..plan.nodes import node_bytes, run_label, save
        runs = {run_label(r.config): node_bytes(r) for r in results.values()}
        title = f"N = {args.gpus}, {args.gpus // g} nodes × {g} GPUs: bytes node 0 sends per step"
        print(f"\nDrawn: {save(runs, args.out, title)}")
