"""Markdown tables of measured results, as pinned by the snapshots and shown in spec/.

Integers are printed exactly; floats at fixed significant digits (``format.sig`` with
``keep_zeros``), so a table is stable across runs and, for the integer columns, across torch
versions. Paper values appear only as the expected side, labelled with their claim id; stage
labels, formulas and claim ids come from the stage table (``theory.STAGES``).
"""
from __future__ import annotations

from fractions import Fraction

from ..paper import theory
from .format import fmt_delta, markdown, max_delta, sig


def _sig(x, digits: int = 4) -> str:
    """spec/'s number style: ``format.sig`` keeping the digits, so a column reads at one precision."""
    return sig(x, digits, keep_zeros=True)


def _label(r) -> str:
    extra = " (all-reduce)" if r.config.stage == 1 and r.config.zero1_comm == "all_reduce" else ""
    return f"{r.config.label}{extra}"


def memory_table(results) -> str:
    """Per-rank model states per stage: measured (ledger), the paper's formula, their ratio."""
    rows = []
    for r in results:
        s = theory.stage(r.config.stage)
        formula = theory.model_state_bytes(s.index, r.psi_held, r.config.n_d)
        rows.append([_label(r), s.partitioned, f"{r.model_states(0):,}",
                     f"{s.formula} = {int(formula):,} ({s.memory_claim})",
                     _sig(Fraction(r.model_states(0)) / formula),
                     f"{r.memory[0].peak['activations']:,}"])
    return markdown(["stage", "partitioned", "model states /GPU (B)", "paper formula (B)", "ratio",
                     "activations peak /GPU (B)"], rows)


def comm_table(results, step: int = 2) -> str:
    """Elements each rank sends per step, in Ψ units and split by collective, and the count."""
    rows = []
    for r in results:
        psi = r.psi_held
        by_op = r.comm.by_op(0, step=step)
        split = ", ".join(f"{op} {_sig(Fraction(v, psi))}Ψ" for op, v in sorted(by_op.items()))
        expected = theory.comm_elements(r.config.stage, psi, r.config.n_d, r.config.zero1_comm)
        rows.append([_label(r), f"{r.comm.elements(0, step=step):,}",
                     f"{_sig(Fraction(r.comm.elements(0, step=step), psi))}Ψ",
                     f"{_sig(expected / psi)}Ψ", split or "—", r.comm.count(0, step=step)])
    return markdown(["stage", "elements /step /GPU", "in Ψ", "ring model (C21–C24)", "by collective",
                     "collectives /step"], rows)


def equivalence_table(results) -> str:
    """Loss per step of every stage, and the largest difference from stage 0 (P1)."""
    base = results[0]
    rows = []
    for r in results:
        dl = max(abs(a - b) for a, b in zip(r.losses, base.losses))
        rows.append([_label(r), " ".join(_sig(x, 6) for x in r.losses), fmt_delta(dl),
                     fmt_delta(max_delta(r.master, base.master))])
    return markdown(["stage", "loss at steps 1…", "max Δloss vs DP", "max Δmaster vs DP"], rows)


def flops_table(results) -> str:
    """FLOPs per GPU per step (torch's FLOP formulas, runtime/opcount.py) and elements the
    optimizer step touched."""
    rows = [[_label(r), f"{r.ranks[0].flops[0]['forward']:,}", f"{r.ranks[0].flops[0]['backward']:,}",
             f"{r.ranks[0].optim_elements[0]:,}"] for r in results]
    return markdown(["stage", "forward FLOPs /GPU", "backward FLOPs /GPU", "optimizer elements /GPU"], rows)


def _table1_header() -> list[str]:
    return ["N_d"] + [f"{m} {theory.stage(s).label}" for m in theory.TABLE1_PSI for s in (1, 2, 3)]


def table1_md() -> str:
    """The paper's Table 1 recomputed from theory.py (GB = 1e9 B), 4 significant digits."""
    rows = []
    for n in theory.TABLE1_ND:
        row = [n]
        for psi in theory.TABLE1_PSI.values():
            row += [_sig(v) for v in theory.table1(Fraction(psi), n).values()]
        rows.append(row)
    return markdown(_table1_header(), rows)


def table2_md() -> str:
    """The paper's Table 2 (theoretical max Ψ on 32 GB GPUs, N_d = 64) recomputed (C17)."""
    rows = [[m, 64 * m] + [f"{_sig(v / 10**9)}B" for v in theory.table2_row(m).values()]
            for m in theory.TABLE2_MP]
    return markdown(["MP", "GPUs"] + [s.label for s in theory.STAGES], rows)


def measured_table1_md(bytes_at_round_psi) -> str:
    """Table 1 measured: ``bytes_at_round_psi(model, stage, n_d)`` (bytes per padded parameter
    from the meta ledger, times the paper's round Ψ) in GB; bold where a stage first fits 32 GB."""
    cols = [(m, s) for m in theory.TABLE1_PSI for s in (1, 2, 3)]
    cells = {(m, s, n): bytes_at_round_psi(m, s, n) for m, s in cols for n in theory.TABLE1_ND}
    rows = [[n] + [_sig(cells[m, s, n] / theory.GB, 6) for m, s in cols] for n in theory.TABLE1_ND]
    first_fit = [next((r for r, n in enumerate(theory.TABLE1_ND) if cells[m, s, n] <= theory.V100_BYTES),
                      None) for m, s in cols]
    return markdown(_table1_header(), rows, {(r, 1 + j) for j, r in enumerate(first_fit) if r is not None})


def scale_table(results, capacity: int | None = None) -> str:
    """Figure 1 measured on meta tensors (``training.scale.measure_stages``): rank 0's model states,
    peak activations, comm per step (in Ψ = real parameters) and collectives, per stage. With a
    GPU's ``capacity`` (bytes): also the highest peak of any rank (its device ledger's peak total)
    and whether it fits, ``<=`` as the paper's memory fits."""
    rows = []
    zero_r = any(r.config.n_m > 1 or r.config.checkpoint_activations for r in results.values())
    for s, r in results.items():
        comm, states = r.comm_elements(0), r.model_states(0)
        row = [theory.stage(s).label, f"{r.psi_padded:,}", f"{states:,}", f"{states / 1e9:,.2f}",
               f"{r.memory(0).peak['activations']:,}", f"{comm:,}", f"{comm / r.psi:.4f}",
               r.collectives(0), ", ".join(str(c.rep) for c in r.classes)]
        if zero_r:   # with MP or checkpointing: checkpoints, and traffic per group
            led = r.comm_ledger([0])
            row[5:7] = [f"{led.elements(0, group=g):,}" for g in (("world", "dp")[r.config.n_m > 1],
                                                               "mp")]
            row[7:7] = [f"{r.memory(0).peak['checkpoints']:,}",
                        f"{led.link_bytes(0, group='host'):,}"]
        if capacity is not None:
            peak = max(c.memory.peak_total for c in r.classes)
            row += [f"{peak:,}", "yes" if peak <= capacity else "no"]
        rows.append(row)
    head = ["stage", "Ψ_padded", "model states /GPU (B)", "GB", "activations /GPU (B)",
            "comm /step /GPU (elements)", "comm in Ψ", "collectives /step", "representative ranks"]
    if zero_r:
        head[5:7] = ["DP elements /step /GPU", "MP elements /step /GPU"]
        head[7:7] = ["checkpoints /GPU (B)", "host link /step (B)"]
    if capacity is not None:
        head += ["peak /GPU (B)", f"fits {capacity / 1e9:g} GB?"]
    return markdown(head, rows)
