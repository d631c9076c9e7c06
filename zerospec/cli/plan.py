"""``zerospec plan``: will it fit, and what will it cost on the wire? Closed forms for any model.

Three modes (zerospec/cli/plan_modes.py: each its own parser): the closed-form tables, a
DeepSpeed config's, and ``--explain`` (zerospec/cli/plan_explain.py); :func:`run` runs the one
chosen."""
from __future__ import annotations

import argparse
import sys


HELP = ("per-GPU model states, fit, comm and time per stage for any Ψ and N; the paper's Table 1 "
        "and 2")


def add_parser(sub) -> None:
    from .plan_modes import add_modes
    add_modes(sub.add_parser("plan", help=HELP, description=HELP))


DEFAULT_GPU_MEM = 32 * 10**9       # the paper's V100 (Table 1)
DEFAULT_BANDWIDTH = 50 * 10**9


def run(args: argparse.Namespace) -> int:
    from ..render.format import render
    machine = _resolve_machine(args)
    if args.mode == "explain":
        from .plan_explain import explain_run
        tables, summary = explain_run(args, machine)
        sys.stdout.write(render(tables, args.format, summary=summary))
        return 0
    args.stage = args.stage or [0, 1, 2, 3]
    tables = (_deepspeed_tables if args.mode == "deepspeed" else _closed_form_tables)(args, machine)
    sys.stdout.write(render(tables, args.format))
    return 0


def _closed_form_tables(args: argparse.Namespace, machine) -> list:
    """The tables mode: Tables 1 and 2, the largest model, or (none asked) each Ψ × N's plan."""
    from ..plan import closed_form as plan
    from ..paper import theory
    tables = []
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
                                                                args.largest_layer, args.estimator)))
    if not tables:
        for psi in args.params or [7_500_000_000]:
            for n in args.gpus or [64]:
                bw = machine.bandwidth(n)
                tables.append(plan.plan_table(psi, n, args.gpu_mem, bw, args.stage, args.units))
                machine.annotate(tables[-1], n)
                tables.append(plan.estimator_table(psi, n, args.gpu_mem, args.stage, args.units,
                                                   args.largest_layer, args.estimator))
    return tables


def _deepspeed_tables(args: argparse.Namespace, machine) -> list:
    """The deepspeed mode: the config's closed form and estimates for each Ψ × N, and with
    --preset its step measured on meta."""
    from ..plan import closed_form as plan
    from ..plan.deepspeed import deepspeed_measured_table, deepspeed_table
    from .options import flag
    from .plan_explain import STEP_OPTIONS, node_settings
    ds, largest = args.deepspeed_config, args.largest_layer
    if args.preset is None:
        step = [flag(k) for k in STEP_OPTIONS if k != "gpus_per_node" and getattr(args, k) is not None]
        step += ["--micro-batch"] if args.micro_batch is not None else []
        if step:
            raise ValueError(f"{', '.join(step)} set(s) the step measured; add --preset NAME (the "
                             f"model measured)")
        ds = ds.resolve()
    else:                                 # "auto" from the preset's hidden size, --micro-batch
        from ..model.presets import preset as _preset
        m = ds.train_micro_batch_size_per_gpu
        if args.micro_batch is not None and m is not None and m != args.micro_batch:
            raise ValueError(f"--micro-batch {args.micro_batch} contradicts {ds.path}'s "
                             f"train_micro_batch_size_per_gpu {m}; drop one")
        ds = ds.resolve(_preset(args.preset).model.n_embd, args.micro_batch)
        if args.params is not None:
            raise ValueError("--preset sets Ψ (the model measured); drop --params, or drop --preset "
                             "for the closed forms of --params")
    tables = []
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
    return tables


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
