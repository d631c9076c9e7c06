"""``zerospec plan``: will it fit, and what will it cost on the wire? Closed forms for any model."""
from __future__ import annotations

import argparse
import sys

from . import argtypes as T


HELP = ("per-GPU model states, fit, comm and time per stage for any Ψ and N; the paper's Table 1 "
        "and 2")


def add_parser(sub) -> None:
    from ..paper.estimators import ESTIMATOR_NAMES
    from ..render.format import FORMATS
    p = sub.add_parser("plan", help=HELP,
                       description=__doc__.splitlines()[0])
    T.accept_negative_values(p)
    p.add_argument("--params", type=T.list_of(T.P.parse_count, "parameter count"), default=None,
                   help="Ψ, e.g. 7.5e9 or 7.5B; a comma list is allowed (default 7.5e9; with "
                        "--table1 the paper's 7.5B,128B,1T)")
    p.add_argument("--gpus", type=T.list_of(T.P.parse_gpus, "GPU count"), default=None,
                   help="data-parallel GPUs N_d; a comma list is allowed (default 64; with --table1 "
                        "1,4,16,64,256,1024)")
    p.add_argument("--machine", type=T.machine, default=None,
                   help=T.machine_help("sets --gpu-mem to its GPU's memory and --bandwidth to the "
                                       "link a ring of N_d GPUs takes (NVLink inside a node, one "
                                       "NIC across nodes); an explicit --gpu-mem/--bandwidth wins"))
    p.add_argument("--gpu-mem", type=T.memory, default=None,
                   help="memory per GPU with its unit: 32GB (default without --machine, decimal as "
                        "the paper), 80GiB")
    p.add_argument("--bandwidth", type=T.bandwidth, default=None,
                   help="per-GPU bandwidth: 50GB/s (default without --machine), 25GiB/s, 400Gbps")
    p.add_argument("--stage", type=T.list_of(T.P.parse_stage, "stage"), default=None,
                   help="comma list of stages 0-3 (default all)")
    p.add_argument("--estimator", type=T.choice_list(ESTIMATOR_NAMES, "estimator"),
                   default=list(ESTIMATOR_NAMES),
                   help=f"comma list of {', '.join(ESTIMATOR_NAMES)} (default all, side by side)")
    p.add_argument("--largest-layer", type=T.layer_count, default=0,
                   help="parameters of the largest layer, for DeepSpeed's ZeRO-3 gather buffer "
                        "(default 0: not counted)")
    p.add_argument("--deepspeed-config", type=T.deepspeed_config, default=None, metavar="DS.JSON",
                   help="a DeepSpeed config: what its ZeRO settings imply (closed form: traffic per "
                        "step, what stays whole) and its stage's memory, for --params (or --preset's "
                        "Ψ) and --gpus; with --explain, the step's stage, micro-batch, precision and "
                        "buffers; every key not modelled is listed")
    p.add_argument("--preset", choices=_presets(), default=None, metavar="NAME",
                   help="with --explain: the model to explain; with --deepspeed-config: also run "
                        "one step of this model (e.g. 1.5B, llama-3-8b, t4-100B-125x8192) on meta "
                        "tensors under the config's settings and print the measured memory and "
                        "traffic; the closed forms are then for its Ψ")
    p.add_argument("--explain", action="store_true",
                   help="with --preset, one --gpus and one --stage: run one step on meta tensors and "
                        "say why it fits or not: each phase's peak and the buffers that make it, "
                        "against the GPU's memory, beside the closed-form estimates")
    p.add_argument("--seq", type=T.positive_int, default=None,
                   help="with --explain: tokens per sequence (default and maximum: the preset's context)")
    p.add_argument("--micro-batch", type=T.positive_int, default=None,
                   help="with --explain: sequences per GPU (default: the --deepspeed-config's, else 1)")
    p.add_argument("--hf-config", type=T.hf_config, default=None, metavar="CONFIG.JSON",
                   help="with --explain: the model of a Hugging Face config.json (Llama, Mistral, "
                        "Qwen2, GPT-2) instead of --preset")
    p.add_argument("--out", type=T.out_dir, default=None, metavar="DIR",
                   help="with --explain: write DIR/explain_memory.svg, the memory over the step")
    p.add_argument("--expandable-segments", action="store_true",
                   help="with --explain: replay the step's allocations as PyTorch's caching "
                        "allocator does under PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
                        "(one growing segment per stream and pool; default off, as PyTorch's)")
    p.add_argument("--fit", action="store_true",
                   help="with --explain: also the largest micro-batch and sequence length that fit "
                        "(a search of meta steps)")
    from .plan_explain import STEP_OPTIONS
    from .options import add_attention, add_flags
    add_flags(p, ("checkpoint_activations",), " (with --explain)")
    add_attention(p)
    add_flags(p, STEP_OPTIONS, " (with --explain, or --deepspeed-config and --preset: the step "
                               "measured)")
    p.add_argument("--table1", action="store_true", help="print the paper's Table 1 layout (C15, C16)")
    p.add_argument("--table2", action="store_true", help="print the paper's Table 2 layout (C17)")
    p.add_argument("--mp", type=T.list_of(T.P.parse_mp, "MP degree"), default=None,
                   help="model-parallel degrees for --table2 (default 1,2,4,8,16)")
    p.add_argument("--max-model", action="store_true", help="the largest Ψ that fits, per stage")
    p.add_argument("--units", choices=("GB", "GiB"), default="GB", help="GB = 10^9 B (default), GiB = 2^30 B")
    p.add_argument("--format", choices=FORMATS, default="markdown", help="default markdown")


def _presets() -> list[str]:
    from ..model.presets import PRESETS
    return list(PRESETS)


DEFAULT_GPU_MEM = 32 * 10**9       # the paper's V100 (Table 1)
DEFAULT_BANDWIDTH = 50 * 10**9


def run(args: argparse.Namespace) -> int:
    from ..plan import closed_form as plan
    from ..paper import theory
    from ..render.format import render
    tables = []
    largest = args.largest_layer
    machine = _resolve_machine(args)
    if args.explain:
        from .plan_explain import explain_run
        tables, summary = explain_run(args, machine)
        sys.stdout.write(render(tables, args.format, summary=summary))
        return 0
    measured = args.deepspeed_config is not None and args.preset is not None
    step_only = [f for f, v in (("--seq", args.seq),
                                ("--micro-batch", None if measured else args.micro_batch),
                                ("--checkpoint-activations", args.checkpoint_activations),
                                ("--attention", args.attention),
                                ("--hf-config", args.hf_config), ("--out", args.out),
                                ("--fit", args.fit),
                                ("--expandable-segments", args.expandable_segments)) if v]
    from .plan_explain import STEP_OPTIONS, node_settings
    from .options import flag
    flags = [flag(k) for k in STEP_OPTIONS if getattr(args, k) is not None]
    if args.deepspeed_config is not None and args.preset is None:   # the closed form's nodes (hpZ)
        flags = [f for f in flags if f != "--gpus-per-node"]
    if flags and (args.deepspeed_config is None or args.preset is None):
        raise ValueError(f"{', '.join(flags)} set(s) the step measured; add --explain and --preset "
                         f"(or --deepspeed-config and --preset)")
    if step_only:
        raise ValueError(f"{', '.join(step_only)} set(s) the step --explain runs; add --explain"
                         + ("" if args.preset or args.hf_config else
                            " and a model: --preset NAME or --hf-config CONFIG.JSON"))
    args.stage = args.stage or [0, 1, 2, 3]
    if args.table1:
        psis = args.params or list(theory.TABLE1_PSI.values())
        tables.append(machine.annotate(plan.table1(psis, args.gpus or list(theory.TABLE1_ND),
                                                   args.gpu_mem)))
    if args.table2:
        n_d = (args.gpus or [64])[0]
        tables.append(machine.annotate(plan.table2(args.mp or list(theory.TABLE2_MP), n_d,
                                                   args.gpu_mem)))
    if args.max_model:
        for n in args.gpus or [64]:
            tables.append(machine.annotate(plan.max_model_table(n, args.gpu_mem, args.stage,
                                                                largest, args.estimator)))
    if args.deepspeed_config is not None:
        ds = args.deepspeed_config
        from ..plan.deepspeed import deepspeed_measured_table, deepspeed_table
        if args.preset is not None:       # "auto" from the preset's hidden size, --micro-batch
            from ..model.presets import preset as _preset
            m = ds.train_micro_batch_size_per_gpu
            if args.micro_batch is not None and m is not None and m != args.micro_batch:
                raise ValueError(f"--micro-batch {args.micro_batch} contradicts {ds.path}'s "
                                 f"train_micro_batch_size_per_gpu {m}; drop one")
            ds = ds.resolve(_preset(args.preset).model.n_embd, args.micro_batch)
        else:
            ds = ds.resolve()
        if args.preset is not None and args.params is not None:
            raise ValueError("--preset sets Ψ (the model measured); drop --params, or drop --preset "
                             "for the closed forms of --params")
        for psi in _psis(args):
            for n in args.gpus or [64]:
                g = node_settings(args, n, args.machine, machine.m)[0].get("gpus_per_node")
                tables.append(deepspeed_table(ds, psi, n, g))
                L = largest or (_preset(args.preset).model.largest_module()
                                if args.preset is not None else 0)
                tables.append(plan.estimator_table(psi, n, args.gpu_mem, [ds.stage], args.units,
                                                   L, args.estimator, ds.precision))
        if args.preset is not None:   # the same settings on a real shape, measured on meta
            for n in args.gpus or [64]:
                extra, _ = node_settings(args, n, args.machine, machine.m)
                g = extra.pop("gpus_per_node", None)
                tables.append(deepspeed_measured_table(ds, args.preset, n, g, extra))
    elif args.preset is not None:
        raise ValueError("--preset is used with --deepspeed-config or --explain (the model a step "
                         "is measured on); for a preset alone see `zerospec scale --preset`")
    if not tables:
        for psi in args.params or [7_500_000_000]:
            for n in args.gpus or [64]:
                bw = machine.bandwidth(n)
                tables.append(plan.plan_table(psi, n, args.gpu_mem, bw, args.stage, args.units))
                machine.annotate(tables[-1], n)
                tables.append(plan.estimator_table(psi, n, args.gpu_mem, args.stage, args.units,
                                                   largest, args.estimator))
    sys.stdout.write(render(tables, args.format))
    return 0


def _psis(args: argparse.Namespace) -> list[int]:
    """Ψ of the closed forms: --preset's own (the model measured below them), else --params."""
    if args.preset is not None:
        from ..model.presets import preset
        return [preset(args.preset).psi]
    return args.params or [7_500_000_000]


class _Sizes:
    """The GPU memory and per-GPU bandwidth a plan uses, and a note saying where they came from:
    an explicit --gpu-mem/--bandwidth, else --machine's, else the defaults."""

    def __init__(self, args: argparse.Namespace):
        from ..paper.hardware import MACHINES
        self.key, self.m = args.machine, MACHINES.get(args.machine)
        self.args = args

    def bandwidth(self, n_d: int):
        if self.args.bandwidth is not None:
            return self.args.bandwidth
        return DEFAULT_BANDWIDTH if self.m is None else self.m.ring_bytes_per_s(n_d)

    def annotate(self, table, n_d: int | None = None):
        """Append the note naming the machine and which values are its own (nothing without it)."""
        if self.m is None:
            return table
        from ..render.format import fmt_bytes
        a, m, u = self.args, self.m, self.args.units
        mem = (f"memory {fmt_bytes(a.gpu_mem, u)} per GPU from --gpu-mem (the machine's: "
               f"{fmt_bytes(m.memory_bytes, u)})" if a.gpu_mem_given else
               f"memory {fmt_bytes(m.memory_bytes, u)} per GPU (its datasheet)")
        note = f"Machine {self.key}, {m.name}: {mem}"
        if n_d is not None:
            ring = m.ring_bytes_per_s(n_d)
            link = (f"inside one {m.gpus_per_node}-GPU node: NVLink, per direction"
                    if n_d <= m.gpus_per_node else
                    f"leaves the {m.gpus_per_node}-GPU node: one NIC, "
                    f"{float(m.nic_bytes_per_s * 8 / 10**9):g} Gb/s")
            note += (f"; bandwidth {fmt_bytes(a.bandwidth, u)}/s from --bandwidth (the machine's: "
                     f"{fmt_bytes(ring, u)}/s)" if a.bandwidth is not None else
                     f"; bandwidth {fmt_bytes(ring, u)}/s per GPU (a ring of N_d = {n_d} GPUs "
                     f"{link})")
        table.notes.append(note + ".")
        return table


def _resolve_machine(args: argparse.Namespace) -> _Sizes:
    """Fill ``args.gpu_mem`` (explicit, else the machine's, else 32 GB) and return the sizes."""
    sizes = _Sizes(args)
    args.gpu_mem_given = args.gpu_mem is not None
    if args.gpu_mem is None:
        args.gpu_mem = DEFAULT_GPU_MEM if sizes.m is None else sizes.m.memory_bytes
    return sizes
