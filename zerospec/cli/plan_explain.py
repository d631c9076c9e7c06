"""``zerospec plan --explain`` from the command line's arguments: the one step to explain, its
settings (a DeepSpeed config's, the nodes and ZeRO++ / MiCS flags), and the tables it prints.

Nodes: ``--gpus-per-node G`` places rank r on node r // G. Without it, ``--machine`` gives its
node's GPUs per node when the step's N = N_d × N_m GPUs fill more than one node (a machine is a
node, repeated; a step on N <= G GPUs sits in one node either way), and a G that does not divide
N is refused. With nodes, the explanation adds the bytes inside vs across nodes per collective
(zerospec/plan/nodes.py).
"""
from __future__ import annotations

# the section options of plan's step: activation checkpointing, nodes, ZeRO++, MiCS, offload,
# precision and stage 3's flavour (flags declared in zerospec/training/sections.py, added by
# zerospec/cli/plan.py)
STEP_OPTIONS = ("activation_checkpointing", "gpus_per_node", "hpz", "qwz", "qgz", "shard_group",
                "quant_group_size", "offload_optimizer", "offload_mode", "offload_params",
                "precision", "flavour")


def node_settings(args, n_ranks: int, machine_key, machine) -> tuple[dict, list[str]]:
    """measure()'s keywords from the nodes / ZeRO++ / MiCS flags for a step on ``n_ranks`` GPUs,
    and a note saying where the GPUs per node came from."""
    kw = {key: getattr(args, key) for key in STEP_OPTIONS if getattr(args, key) is not None}
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
    from ..plan import explain as E
    if (args.preset is None) == (args.hf_config is None):
        raise ValueError("--explain needs one model: --preset NAME (`zerospec scale --list` lists "
                         "them) or --hf-config CONFIG.JSON, with one --gpus and one --stage")
    ds, ckpt = args.deepspeed_config, args.checkpoint_activations or 0
    # whether the step keeps checkpoints, by Megatron's segments or a torchtitan mode: DeepSpeed's
    # activation keys act on either (the run itself keeps the one rule it was given)
    has_ckpt = ckpt or int(getattr(args, "activation_checkpointing", "none") not in (None, "none"))
    not_modelled = {}
    gpus, n_m = _one(args.gpus, "--gpus", 64), _one(args.mp, "--mp", 1)
    stage = _one(args.stage, "--stage", None if ds is None else ds.stage)
    if gpus % n_m:
        raise ValueError(f"--gpus {gpus} must be a multiple of --mp {n_m} (N = N_d × N_m)")
    flags, node_notes = node_settings(args, gpus, args.machine, machine.m)
    micro, settings, notes, pinned = args.micro_batch, dict(flags), [], {}
    if ds is not None:
        from ..plan.deepspeed import config_kwargs, merge
        from ..model.presets import preset as _preset
        hidden = (args.hf_config[1] if args.hf_config else _preset(args.preset).model).n_embd
        ds = ds.resolve(hidden, micro)     # "auto" as transformers' Trainer fills it
        if stage != ds.stage:
            raise ValueError(f"--stage {stage} contradicts {ds.path}'s zero_optimization.stage "
                             f"{ds.stage}; drop one")
        settings, left = config_kwargs(ds, gpus // n_m, has_ckpt, flags.get("gpus_per_node"))
        settings = merge(ds, settings, flags)
        if micro is not None and micro != settings["micro_batch"]:
            raise ValueError(f"--micro-batch {micro} contradicts {ds.path}'s micro-batch "
                             f"{settings['micro_batch']} per GPU; drop one")
        micro = settings.pop("micro_batch")
        if settings.get("offload_optimizer"):   # refused before the step if they cannot hold it
            import dataclasses
            from ..model.presets import preset
            from ..plan.offload import config_pinned
            m = args.hf_config[1] if args.hf_config else preset(args.preset).model
            m = dataclasses.replace(m, block_size=args.seq or m.block_size)
            pinned = config_pinned(ds, m, stage, gpus // n_m, n_m)
        notes = [f"From {ds.path}: " + ", ".join(f"{k}={v}" for k, v in settings.items()) + ".",
                 *([f"\"auto\" resolved: " + "; ".join(f"{k}: {v}" for k, v in ds.resolved) + "."]
                   if ds.resolved else []),
                 "Not modelled: " + ("; ".join(left) or "nothing") + "."]
        not_modelled[ds.path] = list(left)
    if settings.get("offload_mode") is not None and not settings.get("offload_optimizer"):
        raise ValueError(f"--offload-mode {settings['offload_mode']} says which gradients "
                         f"ZeRO-Offload sends down; it needs --offload-optimizer cpu or nvme")
    name, model = args.preset, None
    if args.hf_config is not None:
        name, model = args.hf_config
        notes += _hf_notes(args.hf_config)
        not_modelled[name] = [f"{k} ({why})" for k, why in args.hf_config.not_modelled]
    where = (machine.key if machine.m is not None and not args.gpu_mem_given else
             "--gpu-mem" if args.gpu_mem_given else "the default 32 GB (no --machine)")
    ex = E.explain(name, stage, gpus, args.gpu_mem, where, seq=args.seq, micro_batch=micro or 1,
                   checkpoint_activations=ckpt, n_m=n_m, model=model, settings=settings,
                   notes=tuple(node_notes + notes), attention=args.attention,
                   expandable_segments=args.expandable_segments)
    ex.not_modelled = not_modelled
    out = E.tables(ex, args.units, args.largest_layer or None)
    nodes = None
    if ex.result.config.gpus_per_node:
        from ..plan.nodes import node_bytes, node_table
        nodes = node_bytes(ex.result)
        out.append(node_table(nodes, f"Bytes inside vs across nodes per collective, node 0: "
                                     f"{E._setting(ex)} (measured on meta)", args.units))
    offload = ex.result.config.offload_optimizer is not None
    if offload:
        from ..plan.offload import offload_bytes, offload_table
        out.append(offload_table(offload_bytes(ex.result), f"Tiers and links, rank 0: "
                                 f"{E._setting(ex)} (measured on meta)", pinned, args.units))
    if args.out is not None:
        from ..plan.explain_figure import save
        out[0].notes.append(f"Memory over the step: {save(ex, args.out)}.")
        if nodes is not None:
            from ..plan.nodes import save as save_nodes
            from ..plan.nodes import run_label
            svg = save_nodes({run_label(ex.result.config): nodes}, args.out,
                             f"{name}, N = {gpus}: bytes node 0 sends per step")
            out[-1 - offload].notes.append(f"Drawn: {svg}.")
        if offload:
            from ..plan.offload import run_label, save as save_links
            svg = save_links({run_label(ex.result.config): offload_bytes(ex.result)}, args.out,
                             f"{name}, N = {gpus}: bytes rank 0 moves per step")
            out[-1].notes.append(f"Drawn: {svg}.")
    if args.fit:
        from ..plan.explain_fit import fit_table
        out.append(fit_table(ex, args.units))
    from ..plan.suggest import suggestion_table, suggestions, summary
    items = suggestions(ex, config_given=ds is not None)
    if items:
        out.insert(1, suggestion_table(items, ex, args.units))
    return out, summary(ex, items)


def _hf_notes(c) -> list[str]:
    """What a config.json left to transformers' defaults, and every key not modelled, with why."""
    out = []
    if getattr(c, "defaulted", ()):
        out.append(f"From {c.name}: absent, transformers' defaults: "
                   + ", ".join(f"{k} = {v}" for k, v in c.defaulted) + ".")
    if getattr(c, "not_modelled", ()):
        out.append(f"Not modelled from {c.name}: "
                   + "; ".join(f"{k} ({why})" for k, why in c.not_modelled) + ".")
    return out
