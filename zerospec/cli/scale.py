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


# the section options `zerospec scale` takes (flags: zerospec/training/sections.py); hpZ, qwZ and
# qgZ apply to its stage-3 step, MiCS to stages 1-3
OPTIONS = ("n_m", "checkpoint_activations", "activation_checkpointing", "partition_activations",
           "cpu_checkpointing",
           "zero1_comm", "gpus_per_node", "hpz", "shard_group", "qwz", "qgz", "quant_group_size",
           "offload_optimizer", "offload_mode", "offload_params", "flavour")
STAGE3_ONLY = ("hpz", "qwz", "qgz", "quant_group_size", "flavour")
OFFLOAD = ("offload_optimizer", "offload_mode", "offload_params")


def add_parser(sub) -> None:
    from . import argtypes as T
    from .options import add_flags
    p = sub.add_parser("scale", description=__doc__.splitlines()[0].replace("``", ""), help=HELP)
    p.add_argument("--preset", default=None, help="a model from zerospec.model.presets (see --list); "
                                                  "default 7.5B unless --layers/--hidden are given")
    p.add_argument("--gpus", type=T.positive_int, default=64,
                   help="GPUs N = N_d × N_m, default 64 (N_d = N without --mp)")
    p.add_argument("--stages", default="0,1,2,3", help="comma-separated ZeRO stages, default 0,1,2,3")
    p.add_argument("--micro-batch", type=T.positive_int, default=1, help="sequences per GPU, default 1")
    for flag, what in (("layers", "transformer blocks"), ("hidden", "width d"), ("heads", "heads"),
                       ("vocab", "vocabulary (default 50257)"),
                       ("seq", "sequence length (default 1024)")):
        p.add_argument(f"--{flag}", type=T.positive_int, default=None, help=f"custom model: {what}")
    p.add_argument("--machine", type=T.machine, default=None,
                   help=T.machine_help("adds each stage's peak bytes per GPU and whether they fit "
                                       "its GPU's memory"))
    p.add_argument("--list", action="store_true", help="list the presets with their exact Ψ")
    add_flags(p, OPTIONS)
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
    from ..training.config import TrainConfig
    from ..training.scale import measure
    from ..model.megatron import psi_padding
    from .options import given
    if args.list:
        print(markdown(["preset", "layers", "hidden", "heads", "Ψ", "source"],
                       [[p.name, p.model.n_layer, p.model.n_embd, p.model.n_head, f"{p.psi:,}", p.source]
                        for p in PRESETS.values()]), end="")
        return 0
    stages = _stages(args.stages)
    name, model = _model(args)
    mp = args.n_m or 1
    if args.gpus % mp:
        raise _usage(f"--gpus {args.gpus} must be a multiple of --mp {mp} (N = N_d × N_m)")
    n_d = args.gpus // mp
    opts = given(args, OPTIONS)
    off = args.offload_optimizer is not None or args.offload_params is not None
    if off and any(s < 2 for s in stages):
        raise _usage(f"--offload-optimizer (ZeRO-Offload) is built on stages 2 and 3; got --stages "
                     f"{args.stages} (accepted: 2, 3 or 2,3)")
    if args.out is not None and args.gpus_per_node is None and not off:
        raise _usage("--out draws the bytes inside vs across nodes: add --gpus-per-node G (or the "
                     "bytes per link with offload: add --offload-optimizer cpu|nvme)")

    def step(s: int, offload: bool = True):
        drop = (STAGE3_ONLY if s != 3 else ()) + (("shard_group",) if s == 0 else ()) + \
            (() if offload else OFFLOAD + STAGE3_ONLY + ("shard_group",))
        kw = {k: v for k, v in opts.items() if k not in drop}
        return measure(TrainConfig.of(model=model, stage=s, n_d=n_d, **kw),
                       micro_batch=args.micro_batch)
    results = {s: step(s) for s in stages}
    grid = f"N_d = {n_d}" + (f" × N_m = {mp} (Ψ per MP rank below, vocabulary padded to "
                             f"{model.padded_vocab(mp):,} rows: {psi_padding(model, mp):,} "
                             f"padding elements over the MP group, not in Ψ)" if mp > 1 else "")
    print(f"{name}: {model.n_layer} layers, hidden {model.n_embd}, {model.n_head} heads, vocab "
          f"{model.vocab_size}, seq {model.block_size}, {model.attention} attention; "
          f"Ψ = {model.psi:,}; {grid}; "
          f"measured on meta tensors, one step per stage "
          f"({sum(r.seconds for r in results.values()):.1f} s)\n")
    if args.machine is None:
        print(scale_table(results), end="")
        _crossing(results, args)
        _links(results, args, n_d, step, off)
        return 0
    from ..paper.hardware import MACHINES
    m = MACHINES[args.machine]
    print(scale_table(results, m.memory_bytes), end="")
    print(f"\nFits: the highest peak of any rank (its device ledger: model states, activations, "
          f"buffers; no allocator fragmentation) against {m.memory_bytes / 1e9:g} GB per GPU of "
          f"--machine {args.machine}, {m.name}.")
    _crossing(results, args)
    _links(results, args, n_d, step, off)
    return 0


def _links(results, args, n_d: int, step, off: bool) -> None:
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
        plain = {s: offload_bytes(step(s, offload=False)) for s in results}
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
              f"per GPU" if s == 3 and (args.hpz or 1) > 1 else ""
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
