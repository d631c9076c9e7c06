"""Will it fit, and what will it cost on the wire? The paper's closed forms for any Ψ, N_d and GPU.

Every number here comes from :mod:`zerospec.paper.theory` (memory C6–C9, communication C21–C24, maximum
model size C17) or from the named estimators of :mod:`zerospec.paper.estimators`; nothing is re-derived.
Model states only: activations, temporary buffers and fragmentation (C1's residual states) are not in
these figures, which is why the paper's measured maxima are ~0.82 of the theoretical ones (C18).
"""
from __future__ import annotations

from fractions import Fraction

from ..paper import theory
from ..paper.estimators import ESTIMATOR_NAMES, estimators
from ..render.format import Table, fmt_bytes, fmt_count, fmt_psi, fmt_seconds, sig

# -- tables -------------------------------------------------------------------------------------------
def comm_seconds(elements, bandwidth) -> Fraction:
    """Seconds to move ``elements`` fp16 elements (2 bytes each, C20) at ``bandwidth`` bytes/s."""
    return Fraction(elements) * theory.FP16 / Fraction(bandwidth)


def plan_table(psi, n_d: int, gpu_bytes: int, bandwidth, stages=(0, 1, 2, 3), unit: str = "GB",
               name: str = "plan") -> Table:
    """Per-GPU model states, fit, comm volume and time per step, one row per stage."""
    t = Table(name, f"Ψ = {fmt_count(psi)} parameters on N_d = {n_d} GPUs "
              f"({fmt_bytes(gpu_bytes, unit)} each, {fmt_bytes(bandwidth, unit)}/s)",
              ["Stage", "Partitioned", "Formula", "Model states /GPU", f"Fits {fmt_bytes(gpu_bytes, unit)}?",
               "Comm /step /GPU", "Comm bytes (fp16)", f"Time @ {fmt_bytes(bandwidth, unit)}/s"],
              fmt={3: lambda v: fmt_bytes(v, unit), 5: fmt_psi, 6: lambda v: fmt_bytes(v, unit),
                   7: lambda v: fmt_seconds(float(v))})
    for s in stages:
        mem = theory.model_state_bytes(s, psi, n_d)
        elems = theory.comm_elements(s, psi, n_d)
        st = theory.stage(s)
        t.add(st.name, st.partitioned, st.formula, mem, mem <= gpu_bytes,
              elems / Fraction(psi), elems * theory.FP16, comm_seconds(elems, bandwidth))
    ar = theory.comm_elements(1, psi, n_d, "all_reduce")
    t.notes.append(f"Memory: C6–C9. Comm: ring model, each reduce-scatter or all-gather moves "
                   f"(N−1)/N·Ψ per GPU (C21); 2Ψ for DP, P_os, P_os+g (C21–C23), 3Ψ for P_os+g+p "
                   f"(C24). A ZeRO-1 that all-reduces the gradients then all-gathers the parameters "
                   f"moves {fmt_psi(ar / Fraction(psi))} = {fmt_bytes(ar * theory.FP16, unit)}, "
                   f"{fmt_seconds(float(comm_seconds(ar, bandwidth)))} (C23).")
    t.notes.append("Model states only; activations and buffers come on top (C1).")
    return t


def estimator_table(psi, n_d: int, gpu_bytes: int, stages=(0, 1, 2, 3), unit: str = "GB",
                    largest_layer: int = 0, names=ESTIMATOR_NAMES, precision: str = "fp16") -> Table:
    """The same question answered by the paper's, DeepSpeed's and Megatron's accounting, for the
    run's ``precision`` (fp16, bf16 or fp32)."""
    ests = estimators(largest_layer, precision)
    t = Table("estimators", f"Model states /GPU by estimator (Ψ = {fmt_count(psi)}, N_d = {n_d}"
              + (f", {precision}" if precision != "fp16" else "") + ")",
              ["Stage"] + [f"{n} (formula)" for n in names] + [f"{n}" for n in names],
              fmt={1 + len(names) + i: (lambda v: fmt_bytes(v, unit)) for i in range(len(names))})
    for s in stages:
        vals = [ests[n].model_state_bytes(s, psi, n_d) for n in names]
        t.add(theory.stage(s).name, *[ests[n].formula(s) for n in names], *vals)
    for n in names:
        t.notes.append(f"- {n}: {ests[n].counts} [{ests[n].source}]")
    if "deepspeed" in names:
        t.notes.append(f"- L (largest layer) = {largest_layer:,} parameters (--largest-layer, or "
                       f"the preset's largest single module).")
    t.notes.append("- n/a (—): that tool has no formula for the stage.")
    return t


def table1(psis, n_ds, gpu_bytes: int = theory.V100_BYTES) -> Table:
    """The paper's Table 1 layout: per-device GB for P_os, P_os+g, P_os+g+p (C15, C16).

    Bold marks, per model and stage, the smallest N_d in the table whose cell fits ``gpu_bytes``
    (inclusive), as the paper's caption does for 32 GB V100s (C15).
    """
    cols = ["N_d"] + [f"{fmt_count(p)} {theory.stage(s).label}" for p in psis for s in (1, 2, 3)]
    t = Table("table1", "Table 1: per-device model-state memory (GB = 10^9 bytes)", cols,
              fmt={0: str, **{i: (lambda v: sig(v, 3)) for i in range(1, len(cols))}})
    for r, n in enumerate(n_ds):
        cells = []
        for p in psis:
            cells += [theory.model_state_bytes(s, Fraction(p), n) / theory.GB for s in (1, 2, 3)]
        t.add(n, *cells)
    for j, p in enumerate(psis):
        for k, s in enumerate((1, 2, 3)):
            fits = [r for r, n in enumerate(n_ds) if theory.model_state_bytes(s, Fraction(p), n) <= gpu_bytes]
            if fits:
                t.bold.add((fits[0], 1 + 3 * j + k))
    t.notes.append(f"Bold: the smallest N_d at which the stage fits {fmt_bytes(gpu_bytes)} (C15). "
                   f"Cells: 3 significant digits, half up; the paper rounds inconsistently (C16).")
    return t


def table2(n_ms, n_d: int = 64, gpu_bytes: int = theory.V100_BYTES) -> Table:
    """The paper's Table 2 layout: theoretical maximum model size per MP degree (C17)."""
    t = Table("table2", f"Table 2: maximum model size, {fmt_bytes(gpu_bytes)} per GPU, N_d = {n_d}",
              ["MP", "GPUs"] + [f"Theor. {s.label}" for s in theory.STAGES],
              fmt={0: str, 1: str, **{i: fmt_count for i in range(2, 6)}})
    for m in n_ms:
        row = theory.table2_row(m, n_d, gpu_bytes)
        t.add(m, m * n_d, *[row[s] for s in range(4)])
    t.notes.append("Exact values, 3 significant digits; the paper prints the MP = 1 value rounded to "
                   "0.1B times MP (C17), hence 121.6B where this shows 122B.")
    return t


def max_model_table(n_d: int, gpu_bytes: int, stages=(0, 1, 2, 3), largest_layer: int = 0,
                    names=ESTIMATOR_NAMES) -> Table:
    """The largest Ψ whose model states fit, per stage and estimator (C13, C17)."""
    ests = estimators(largest_layer)
    t = Table("max_model", f"Largest model that fits {fmt_bytes(gpu_bytes)} per GPU at N_d = {n_d}",
              ["Stage"] + list(names), fmt={i: fmt_count for i in range(1, 1 + len(names))})
    for s in stages:
        t.add(theory.stage(s).name, *[ests[n].max_params(s, gpu_bytes, n_d) for n in names])
    t.notes.append("Model states only (C17); the paper measured ~0.82 of this for P_os (C18).")
    return t
