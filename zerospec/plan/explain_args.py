"""``zerospec plan --explain`` from the command line's arguments: the one step to explain, its
settings (a DeepSpeed config's, the nodes and ZeRO++ / MiCS flags), and the tables it prints.

Nodes: ``--gpus-per-node G`` places rank r on node r // G. Without it, ``--machine`` gives its
node's GPUs per node when the step's N = N_d × N_m GPUs fill more than one node (a machine is a
node, repeated; a step on N <= G GPUs sits in one node either way), and a G that does not divide
N is refused. With nodes, the explanation adds the bytes inside vs across nodes per collective
(zerospec/plan/nodes.py).
"""
from __future__ import annotations

# plan's flags for the step's nodes, ZeRO++ and MiCS: (flag, measure()'s keyword)
STEP_FLAGS = (("--gpus-per-node", "gpus_per_node"), ("--hpz", "hpz"), ("--qwz", "qwz"),
              ("--qgz", "qgz"), ("--shard-group", "shard_group"),
              ("--quant-group-size", "quant_group_size"),
              ("--offload-optimizer", "offload_optimizer"), ("--offload-mode", "offload_mode"),
              ("--offload-params", "offload_params"))


def add_arguments(p, T) -> None:
    """plan's --gpus-per-node, --hpz, --qwz, --qgz, --quant-group-size, --shard-group,
    --offload-optimizer, --offload-mode, --offload-params."""
    step = " (with --explain, or --deepspeed-config and --preset: the step measured)"
    p.add_argument("--gpus-per-node", type=T.positive_int, default=None, metavar="G",
                   help="GPUs per node, rank r on node r // G: adds bytes inside vs across nodes "
                        "per collective" + step + "; default --machine's when N exceeds a node, "
                        "else one node")
    p.add_argument("--hpz", type=T.positive_int, default=None, metavar="H",
                   help="ZeRO++'s hpZ at stage 3 (zero_hpz_partition_size; H must divide G)" + step)
    p.add_argument("--qwz", action="store_true", default=None,
                   help="ZeRO++'s qwZ at stage 3: int8 weight all-gathers" + step)
    p.add_argument("--qgz", action="store_true", default=None,
                   help="ZeRO++'s qgZ at stage 3: an int4 all-to-all gradient reduction" + step)
    p.add_argument("--quant-group-size", type=T.positive_int, default=None, metavar="G_Q",
                   help="elements per qwZ/qgZ scale (default DeepSpeed's choice)" + step)
    p.add_argument("--shard-group", type=T.positive_int, default=None, metavar="P",
                   help="MiCS / FSDP2's HSDP: shard over groups of P GPUs (P must divide N_d), "
                        "replicate across them" + step)
    p.add_argument("--offload-optimizer", choices=("cpu", "nvme"), default=None,
                   help="ZeRO-Offload at stage 2 or 3: fp32 states and Adam on the host (cpu) or "
                        "in NVMe files (nvme); adds the host, NVMe and PCIe bytes" + step)
    p.add_argument("--offload-mode", choices=("paper", "deepspeed"), default=None,
                   help="with --offload-optimizer: fp16 (paper) or fp32 (deepspeed) gradients "
                        "down; default paper, a --deepspeed-config's: deepspeed" + step)
    p.add_argument("--offload-params", choices=("cpu", "nvme"), default=None,
                   help="ZeRO-Infinity at stage 3: fp16 parameter partitions on the host or "
                        "NVMe, fetched for each use; needs --offload-optimizer" + step)


def given_flags(args) -> list[str]:
    return [flag for flag, key in STEP_FLAGS if getattr(args, key) is not None]


def node_settings(args, n_ranks: int, machine_key, machine) -> tuple[dict, list[str]]:
    """measure()'s keywords from the nodes / ZeRO++ / MiCS flags for a step on ``n_ranks`` GPUs,
    and a note saying where the GPUs per node came from."""
    kw = {key: getattr(args, key) for _, key in STEP_FLAGS if getattr(args, key) is not None}
    notes = []
    if "gpus_per_node" in kw:
        notes.append(f"Nodes: {kw['gpus_per_node']} GPUs each (--gpus-per-node).")
    elif machine is not None and n_ranks > machine.gpus_per_node:
        g = machine.gpus_per_node
        if n_ranks % g:
            raise ValueError(f"--gpus {n_ranks} does not fill whole {g}-GPU nodes of --machine "
                             f"{machine_key}; accepted: a multiple of {g}, or --gpus-per-node G "
                             f"dividing {n_ranks}")
        kw["gpus_per_node"] = g
        notes.append(f"Nodes: {g} GPUs each, --machine {machine_key}'s ({n_ranks // g} nodes; "
                     f"--gpus-per-node overrides).")
    return kw, notes


def _one(values, flag: str, default=None):
    """The single value of a comma-list option (--explain runs one step)."""
    if values is None:
        if default is None:
            raise ValueError(f"--explain needs {flag} (one value)")
        return default
    if len(values) != 1:
        raise ValueError(f"--explain runs one step: give one {flag}, got {len(values)}")
    return values[0]


def explain_tables(args, machine) -> list:
    """`plan --explain`'s tables (:func:`explain_run`)."""
    return explain_run(args, machine)[0]


def explain_run(args, machine) -> tuple[list, dict]:
    """`plan --explain`: one meta step of --preset or --hf-config, explained against the GPU's
    memory; a --deepspeed-config sets the stage, micro-batch, precision and buffers it can, the
    nodes and ZeRO++ / MiCS flags the rest. Returns the tables and the summary a script reads
    (zerospec/plan/suggest.py), whose suggestions, when the step does not fit, are a table too."""
    from . import explain as E
    if (args.preset is None) == (args.hf_config is None):
        raise ValueError("--explain needs one model: --preset NAME (`zerospec scale --list` lists "
                         "them) or --hf-config CONFIG.JSON, with one --gpus and one --stage")
    other = [f for f, v in (("--table1", args.table1), ("--table2", args.table2),
                            ("--max-model", args.max_model), ("--params", args.params)) if v]
    if other:
        raise ValueError(f"--explain runs one step of its model; it does not take {', '.join(other)}")
    ds, ckpt = args.deepspeed_config, args.checkpoint_activations or 0
    not_modelled = {}
    gpus, n_m = _one(args.gpus, "--gpus", 64), _one(args.mp, "--mp", 1)
    stage = _one(args.stage, "--stage", None if ds is None else ds.stage)
    if gpus % n_m:
        raise ValueError(f"--gpus {gpus} must be a multiple of --mp {n_m} (N = N_d × N_m)")
    flags, node_notes = node_settings(args, gpus, args.machine, machine.m)
    micro, settings, notes, pinned = args.micro_batch, dict(flags), [], {}
    if ds is not None:
        from .deepspeed import config_kwargs, merge
        if stage != ds.stage:
            raise ValueError(f"--stage {stage} contradicts {ds.path}'s zero_optimization.stage "
                             f"{ds.stage}; drop one")
        settings, left = config_kwargs(ds, gpus // n_m, n_m, ckpt, flags.get("gpus_per_node"))
        settings = merge(ds, settings, flags)
        if micro is not None and micro != settings["micro_batch"]:
            raise ValueError(f"--micro-batch {micro} contradicts {ds.path}'s micro-batch "
                             f"{settings['micro_batch']} per GPU; drop one")
        micro = settings.pop("micro_batch")
        if settings.get("offload_optimizer"):   # refused before the step if they cannot hold it
            import dataclasses
            from ..model.presets import preset
            from .offload import config_pinned
            m = args.hf_config[1] if args.hf_config else preset(args.preset).model
            m = dataclasses.replace(m, block_size=args.seq or m.block_size)
            pinned = config_pinned(ds, m, stage, gpus // n_m, n_m)
        notes = [f"From {ds.path}: " + ", ".join(f"{k}={v}" for k, v in settings.items()) + ".",
                 "Not modelled: " + ("; ".join(left) or "nothing") + "."]
        not_modelled[ds.path] = list(left)
    name, model = args.preset, None
    if args.hf_config is not None:
        name, model = args.hf_config[:2]
        # a reader that lists the keys it does not model hands them on as a third item
        if len(args.hf_config) > 2:
            not_modelled[name] = list(args.hf_config[2])
    where = (machine.key if machine.m is not None and not args.gpu_mem_given else
             "--gpu-mem" if args.gpu_mem_given else "the default 32 GB (no --machine)")
    ex = E.explain(name, stage, gpus, args.gpu_mem, where, seq=args.seq, micro_batch=micro or 1,
                   checkpoint_activations=ckpt, n_m=n_m, model=model, settings=settings,
                   notes=tuple(node_notes + notes), attention=args.attention)
    ex.not_modelled = not_modelled
    out = E.tables(ex, args.units, args.largest_layer or None)
    nodes = None
    if ex.result.config.gpus_per_node:
        from .nodes import node_bytes, node_table
        nodes = node_bytes(ex.result)
        out.append(node_table(nodes, f"Bytes inside vs across nodes per collective, node 0: "
                                     f"{E._setting(ex)} (measured on meta)", args.units))
    offload = ex.result.config.offload_optimizer is not None
    if offload:
        from .offload import offload_bytes, offload_table
        out.append(offload_table(offload_bytes(ex.result), f"Tiers and links, rank 0: "
                                 f"{E._setting(ex)} (measured on meta)", pinned, args.units))
    if args.out is not None:
        from .explain_figure import save
        out[0].notes.append(f"Memory over the step: {save(ex, args.out)}.")
        if nodes is not None:
            from .nodes import save as save_nodes
            from .nodes import run_label
            svg = save_nodes({run_label(ex.result.config): nodes}, args.out,
                             f"{name}, N = {gpus}: bytes node 0 sends per step")
            out[-1 - offload].notes.append(f"Drawn: {svg}.")
        if offload:
            from .offload import run_label, save as save_links
            svg = save_links({run_label(ex.result.config): offload_bytes(ex.result)}, args.out,
                             f"{name}, N = {gpus}: bytes rank 0 moves per step")
            out[-1].notes.append(f"Drawn: {svg}.")
    if args.fit:
        from .fit import fit_table
        out.append(fit_table(ex, args.units))
    from .suggest import suggestion_table, suggestions, summary
    items = suggestions(ex, config_given=ds is not None)
    if items:
        out.insert(1, suggestion_table(items, ex, args.units))
    return out, summary(ex, items)
