"""``zerospec plan``'s three modes, each its own parser: the closed-form tables (the default),
``--deepspeed-config DS.JSON`` and ``--explain`` (also named: ``zerospec plan tables|deepspeed|
explain``). The mode flag picks the parser; an option of another mode is argparse's error, which
names the mode that takes it. zerospec/cli/plan.py runs the mode chosen.
"""
from __future__ import annotations

from . import argtypes as T

MODES = {"tables": "the closed forms: per-GPU model states, fit, comm and time per stage; the "
                   "paper's Tables 1 and 2; the largest model per stage",
         "deepspeed": "what a DeepSpeed config's ZeRO settings imply (closed form), and with "
                      "--preset one step of that model measured on meta tensors under them",
         "explain": "one step of a model on meta tensors: why it fits or not, and what would"}
# how a command line names each mode (`zerospec plan MODE` too), and how it gets to it
MODE_NAME = {"tables": "`zerospec plan` without a mode flag",
             "deepspeed": "`zerospec plan --deepspeed-config`", "explain": "`zerospec plan --explain`"}
TO = {"tables": "drop --explain", "deepspeed": "add --deepspeed-config DS.JSON",
      "explain": "add --explain"}


def add_modes(p) -> None:
    """plan's parser ``p`` with its three modes, each a parser of its own options."""
    modes = p.add_subparsers(dest="mode", metavar="MODE", required=True, parser_class=type(p))
    others = ("Modes: the closed-form tables (this one, the default), --deepspeed-config DS.JSON "
              "and --explain; `zerospec plan --explain --help` lists the explain mode's options.")
    made = {name: modes.add_parser(name, help=what, description=f"zerospec plan: {what}. " + (
        others if name == "tables" else f"Its mode flag: {MODE_NAME[name]}."))
        for name, what in MODES.items()}
    for name, m in made.items():
        T.accept_negative_values(m)
        _sizes(m, name)
    _tables(made["tables"])
    _deepspeed(made["deepspeed"])
    _explain(made["explain"])
    p.parse_known_args = _mode_first(p.parse_known_args, made)


def _mode_first(parse, parsers: dict):
    """``parse_known_args`` of plan's parser with the mode named first: ``--explain`` anywhere is
    the explain mode, ``--deepspeed-config`` the deepspeed mode, neither the tables (``--help``
    too: the default mode's, naming the others); an option of another mode is one error naming
    where it belongs."""
    def parse_known_args(args=None, namespace=None):
        args = list(args or [])
        if not (args and args[0] in MODES):
            mode = ("explain" if "--explain" in args else "deepspeed" if any(
                a.split("=")[0] == "--deepspeed-config" for a in args) else "tables")
            args = [mode, *(a for a in args if a != "--explain")]
        ns, extras = parse(args, namespace)
        flags = [a.split("=")[0] for a in extras if a.startswith("--")]
        if flags:
            raise T.UsageError(_not_taken(ns.mode, flags, parsers))
        return ns, extras
    return parse_known_args


def _not_taken(mode: str, flags: list[str], parsers: dict) -> str:
    """The error for ``flags`` given to ``mode``: the modes whose parsers take them, and how to
    get there."""
    where = [m for m, q in parsers.items() if m != mode and all(
        f in q._option_string_actions for f in flags)]
    what = ", ".join(flags)
    if not where:
        return f"{MODE_NAME[mode]} does not take {what}: no mode of plan takes them together"
    return (f"{MODE_NAME[mode]} does not take {what}, {'an option' if len(flags) == 1 else 'options'}"
            f" of {' and '.join(MODE_NAME[m] for m in where)}: "
            f"{' or '.join(TO[m] for m in where)}")


def _sizes(p, mode: str) -> None:
    """The options every mode takes: the GPUs, their memory and links, the stages, the units."""
    from ..paper.estimators import ESTIMATOR_NAMES
    from ..render.format import FORMATS
    one = " (one value)" if mode == "explain" else ""
    p.add_argument("--gpus", type=T.list_of(T.P.parse_gpus, "GPU count"), default=None,
                   help=f"data-parallel GPUs N_d; a comma list is allowed{one} (default 64; with "
                        f"--table1 1,4,16,64,256,1024)")
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
                   help=f"comma list of stages 0-3{one} (default all)")
    p.add_argument("--estimator", type=T.choice_list(ESTIMATOR_NAMES, "estimator"),
                   default=list(ESTIMATOR_NAMES),
                   help=f"comma list of {', '.join(ESTIMATOR_NAMES)} (default all, side by side)")
    p.add_argument("--largest-layer", type=T.layer_count, default=0,
                   help="parameters of the largest layer, for DeepSpeed's ZeRO-3 gather buffer "
                        "(default 0: not counted)")
    p.add_argument("--units", choices=("GB", "GiB"), default="GB", help="GB = 10^9 B (default), GiB = 2^30 B")
    p.add_argument("--format", choices=FORMATS, default="markdown", help="default markdown")


def _params(p) -> None:
    p.add_argument("--params", type=T.list_of(T.P.parse_count, "parameter count"), default=None,
                   help="Ψ, e.g. 7.5e9 or 7.5B; a comma list is allowed (default 7.5e9; with "
                        "--table1 the paper's 7.5B,128B,1T)")


def _tables(p) -> None:
    _params(p)
    p.add_argument("--table1", action="store_true", help="print the paper's Table 1 layout (C15, C16)")
    p.add_argument("--table2", action="store_true", help="print the paper's Table 2 layout (C17)")
    p.add_argument("--mp", type=T.list_of(T.P.parse_mp, "MP degree"), default=None,
                   help="model-parallel degrees for --table2 (default 1,2,4,8,16)")
    p.add_argument("--max-model", action="store_true", help="the largest Ψ that fits, per stage")


def _ds_config(p, required: bool, what: str) -> None:
    p.add_argument("--deepspeed-config", type=T.deepspeed_config, required=required,
                   default=None, metavar="DS.JSON", help=f"a DeepSpeed config: {what}; every key "
                                                         f"not modelled is listed")


def _deepspeed(p) -> None:
    from .plan_explain import STEP_OPTIONS
    from .options import add_flags
    _ds_config(p, True, "what its ZeRO settings imply (closed form: traffic per step, what stays "
                        "whole) and its stage's memory, for --params (or --preset's Ψ) and --gpus")
    _params(p)
    p.add_argument("--preset", choices=_presets(), default=None, metavar="NAME",
                   help="also run one step of this model (e.g. 1.5B, llama-3-8b, t4-100B-125x8192) "
                        "on meta tensors under the config's settings and print the measured memory "
                        "and traffic; the closed forms are then for its Ψ")
    p.add_argument("--micro-batch", type=T.positive_int, default=None,
                   help="with --preset: sequences per GPU of the step measured (default: the "
                        "config's)")
    add_flags(p, STEP_OPTIONS, " (with --preset: the step measured; --gpus-per-node also places "
                               "the closed form's GPUs in nodes)")


def _explain(p) -> None:
    from .plan_explain import STEP_OPTIONS
    from .options import add_attention, add_flags
    p.add_argument("--preset", choices=_presets(), default=None, metavar="NAME",
                   help="the model to explain (e.g. 1.5B, llama-3-8b, t4-100B-125x8192)")
    p.add_argument("--hf-config", type=T.hf_config, default=None, metavar="CONFIG.JSON",
                   help="the model of a Hugging Face config.json (Llama, Mistral, Qwen2, GPT-2) "
                        "instead of --preset")
    _ds_config(p, False, "the step's stage, micro-batch, precision and buffers")
    p.add_argument("--mp", type=T.list_of(T.P.parse_mp, "MP degree"), default=None,
                   help="the model-parallel degree of the step (one value, default 1)")
    p.add_argument("--seq", type=T.positive_int, default=None,
                   help="tokens per sequence (default and maximum: the model's context)")
    p.add_argument("--micro-batch", type=T.positive_int, default=None,
                   help="sequences per GPU (default: the --deepspeed-config's, else 1)")
    p.add_argument("--out", type=T.out_dir, default=None, metavar="DIR",
                   help="write DIR/explain_memory.svg, the memory over the step")
    p.add_argument("--expandable-segments", action="store_true",
                   help="replay the step's allocations as PyTorch's caching allocator does under "
                        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (one growing segment "
                        "per stream and pool; default off, as PyTorch's)")
    p.add_argument("--fit", action="store_true",
                   help="also the largest micro-batch and sequence length that fit (a search of "
                        "meta steps)")
    add_flags(p, ("checkpoint_activations",))
    add_attention(p)
    add_flags(p, STEP_OPTIONS)


def _presets() -> list[str]:
    from ..model.presets import PRESETS
    return list(PRESETS)
