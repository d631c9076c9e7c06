"""Markdown tables of measured results, as pinned by the snapshots and shown in spec/.

Integers are printed exactly; floats at fixed significant digits (``sig``), so a table is stable
across runs and, for the integer columns, across torch versions. Paper values appear only as the
expected side, labelled with their claim id.
"""
from __future__ import annotations

from fractions import Fraction

import torch

from ..paper import theory

PARTITIONED = {0: "nothing", 1: "optimizer states", 2: "+ gradients", 3: "+ parameters"}
FORMULA = {0: "16Ψ", 1: "4Ψ+12Ψ/N", 2: "2Ψ+14Ψ/N", 3: "16Ψ/N"}
CLAIM = {0: "C6", 1: "C7", 2: "C8", 3: "C9"}


def sig(x, digits: int = 4) -> str:
    """``x`` at ``digits`` significant digits, without exponent for ordinary magnitudes."""
    x = float(x)
    if x == 0:
        return "0"
    if abs(x) < 1e-4:
        return f"{x:.{digits - 1}e}"
    if abs(x) >= 10 ** (digits - 1):
        return f"{x:.0f}"
    return f"{x:#.{digits}g}"


def md(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _label(r) -> str:
    extra = " (all-reduce)" if r.config.stage == 1 and r.config.zero1_comm == "all_reduce" else ""
    return f"{r.config.label}{extra}"


def memory_table(results) -> str:
    """Per-rank model states per stage: measured (ledger), the paper's formula, their ratio."""
    rows = []
    for r in results:
        s, n = r.config.stage, r.config.n_d
        formula = theory.model_state_bytes(s, r.psi_held, n)
        rows.append([_label(r), PARTITIONED[s], f"{r.model_states(0):,}",
                     f"{FORMULA[s]} = {int(formula):,} ({CLAIM[s]})",
                     sig(Fraction(r.model_states(0)) / formula),
                     f"{r.memory[0].peak['activations']:,}"])
    return md(["stage", "partitioned", "model states /GPU (B)", "paper formula (B)", "ratio",
               "activations peak /GPU (B)"], rows)


def comm_table(results, step: int = 2) -> str:
    """Elements each rank sends per step, in Ψ units and split by collective, and the count."""
    rows = []
    for r in results:
        psi = r.psi_held
        by_op = r.comm.by_op(0, step=step)
        split = ", ".join(f"{op} {sig(Fraction(v, psi))}Ψ" for op, v in sorted(by_op.items()))
        expected = theory.comm_elements(r.config.stage, psi, r.config.n_d, r.config.zero1_comm)
        rows.append([_label(r), f"{r.comm.elements(0, step=step):,}",
                     f"{sig(Fraction(r.comm.elements(0, step=step), psi))}Ψ",
                     f"{sig(expected / psi)}Ψ", split or "—", r.comm.count(0, step=step)])
    return md(["stage", "elements /step /GPU", "in Ψ", "ring model (C21–C24)", "by collective",
               "collectives /step"], rows)


def equivalence_table(results) -> str:
    """Loss per step of every stage, and the largest difference from stage 0 (P1)."""
    base = results[0]
    rows = []
    for r in results:
        dl = max(abs(a - b) for a, b in zip(r.losses, base.losses))
        dw = max(float((r.master[k] - base.master[k]).abs().max()) for k in base.master)
        rows.append([_label(r), " ".join(sig(x, 6) for x in r.losses), sig(dl), sig(dw)])
    return md(["stage", "loss at steps 1…", "max Δloss vs DP", "max Δmaster vs DP"], rows)


def flops_table(results) -> str:
    """FLOPs per GPU per step (FlopCounterMode) and elements the optimizer step touched."""
    rows = [[_label(r), f"{r.ranks[0].flops[0]['forward']:,}", f"{r.ranks[0].flops[0]['backward']:,}",
             f"{r.ranks[0].optim_elements[0]:,}"] for r in results]
    return md(["stage", "forward FLOPs /GPU", "backward FLOPs /GPU", "optimizer elements /GPU"], rows)


def table1_md() -> str:
    """The paper's Table 1 recomputed from theory.py (GB = 1e9 B), 3 significant digits."""
    header = ["N_d"] + [f"{m} {theory.STAGE_LABELS[s]}" for m in theory.TABLE1_PSI for s in (1, 2, 3)]
    rows = []
    for n in theory.TABLE1_ND:
        row = [n]
        for psi in theory.TABLE1_PSI.values():
            row += [sig(v, 4) for v in theory.table1(Fraction(psi), n).values()]
        rows.append(row)
    return md(header, rows)


def table2_md() -> str:
    """The paper's Table 2 (theoretical max Ψ on 32 GB GPUs, N_d = 64) recomputed (C17)."""
    rows = [[m, 64 * m] + [f"{sig(v / 10**9, 4)}B" for v in theory.table2_row(m).values()]
            for m in theory.TABLE2_MP]
    return md(["MP", "GPUs", "DP", "P_os", "P_os+g", "P_os+g+p"], rows)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def measured_table1_md(bytes_at_round_psi) -> str:
    """Table 1 measured: ``bytes_at_round_psi(model, stage, n_d)`` (bytes per padded parameter
    from the meta ledger, times the paper's round Ψ) in GB; bold where a stage first fits 32 GB."""
    header = ["N_d"] + [f"{m} {theory.STAGE_LABELS[s]}" for m in theory.TABLE1_PSI for s in (1, 2, 3)]
    cells = {(m, s, n): bytes_at_round_psi(m, s, n) for m in theory.TABLE1_PSI for s in (1, 2, 3)
             for n in theory.TABLE1_ND}
    first_fit = {(m, s): next((n for n in theory.TABLE1_ND if cells[m, s, n] <= theory.V100_BYTES), None)
                 for m in theory.TABLE1_PSI for s in (1, 2, 3)}
    rows = []
    for n in theory.TABLE1_ND:
        row = [n]
        for m in theory.TABLE1_PSI:
            for s in (1, 2, 3):
                text = sig(cells[m, s, n] / theory.GB, 6)
                row.append(f"**{text}**" if first_fit[m, s] == n else text)
        rows.append(row)
    return md(header, rows)
