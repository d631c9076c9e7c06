"""Will it fit, and what will it cost on the wire? The paper's closed forms for any Ψ, N_d and GPU.

Every number here comes from :mod:`zerospec.paper.theory` (memory C6–C9, communication C21–C24, maximum
model size C17) or from the named estimators of :mod:`zerospec.paper.estimators`; nothing is re-derived.
Model states only: activations, temporary buffers and fragmentation (C1's residual states) are not in
these figures, which is why the paper's measured maxima are ~0.82 of the theoretical ones (C18).
"""
from __future__ import annotations

import re
from fractions import Fraction

from ..paper import theory
from ..paper.estimators import ESTIMATOR_NAMES, estimators
from ..render.format import Table, fmt_bytes, fmt_count, fmt_psi, fmt_seconds, sig
from .limits import check_bytes, check_count, check_gpus

_NUM = r"([+-]?[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)"   # signed, so "-5" is "must be > 0"
_COUNT_SUFFIX = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9, "T": 10**12}
_BYTE_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "PB": 10**15,
               "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
_BIT_UNITS = {"BPS": 1, "KBPS": 10**3, "MBPS": 10**6, "GBPS": 10**9, "TBPS": 10**12,
              "KBIT/S": 10**3, "MBIT/S": 10**6, "GBIT/S": 10**9, "TBIT/S": 10**12}


# -- parsing (errors name the bad value and what is accepted) -----------------------------------------
def parse_count(text: str) -> int:
    """A parameter count: ``7.5e9``, ``7.5B``, ``175M``, ``1T`` (decimal suffixes K, M, B/G, T)."""
    m = re.fullmatch(_NUM + r"\s*([KMBGT]?)", str(text).strip(), re.IGNORECASE)
    if not m:
        raise ValueError(f"cannot read parameter count {text!r}; accepted: a number with an optional "
                         f"suffix K, M, B or T, e.g. 7.5e9, 7.5B, 175M")
    value = Fraction(m.group(1)) * _COUNT_SUFFIX[m.group(2).upper()]
    if value < 1:
        raise ValueError(f"parameter count must be >= 1, got {text!r}")
    return check_count(int(value), text)


def parse_bytes(text: str) -> int:
    """A memory size with its unit: ``32GB`` (decimal, as the paper), ``80GiB``, ``512MB``."""
    m = re.fullmatch(_NUM + r"\s*([A-Za-z]+)", str(text).strip())
    unit = m.group(2).upper() if m else None
    if not m or unit not in _BYTE_UNITS:
        raise ValueError(f"cannot read memory size {text!r}; accepted: a number with a unit "
                         f"B, KB, MB, GB, TB (decimal) or KiB, MiB, GiB, TiB, e.g. 32GB")
    value = Fraction(m.group(1)) * _BYTE_UNITS[unit]
    if value <= 0:
        raise ValueError(f"memory size must be > 0, got {text!r}")
    return check_bytes(int(value), text)


def parse_bandwidth(text: str) -> Fraction:
    """Bytes per second from ``50GB/s``, ``25GiB/s`` or bits: ``400Gbps``, ``100Gbit/s``."""
    s = str(text).strip()
    m = re.fullmatch(_NUM + r"\s*([A-Za-z/]+)", s)
    if m:
        unit = m.group(2)
        if unit.upper().endswith("/S") and unit[:-2].upper() in _BYTE_UNITS and unit[-3] == "B":
            value = Fraction(m.group(1)) * _BYTE_UNITS[unit[:-2].upper()]
        elif unit.upper() in _BIT_UNITS and unit[-3 if unit.endswith("ps") else -5] == "b":
            value = Fraction(m.group(1)) * _BIT_UNITS[unit.upper()] / 8
        else:
            value = None
        if value is not None:
            if value <= 0:
                raise ValueError(f"bandwidth must be > 0, got {text!r}")
            return value
    raise ValueError(f"cannot read bandwidth {text!r}; accepted: bytes per second such as 50GB/s, "
                     f"25GiB/s, or bits per second such as 400Gbps, 100Gbit/s")


def parse_list(text: str, parse, what: str) -> list:
    items = [t for t in str(text).split(",") if t.strip()]
    if not items:
        raise ValueError(f"empty {what} list {text!r}")
    return [parse(t) for t in items]


def parse_gpus(text: str, what: str = "GPU count N_d") -> int:
    """A data-parallel degree N_d (or, named by ``what``, another degree): an integer >= 1."""
    try:
        n = int(str(text).strip())
    except ValueError:
        raise ValueError(f"cannot read {what} {text!r}; accepted: an integer >= 1") from None
    if n < 1:
        raise ValueError(f"{what} must be >= 1, got {text!r}")
    return check_gpus(n, text, what)


def parse_mp(text: str) -> int:
    """A model-parallel degree N_m (Table 2's MP column): an integer >= 1."""
    return parse_gpus(text, "model-parallel degree N_m")


def parse_stage(text: str) -> int:
    t = str(text).strip().lower().removeprefix("zero-").removeprefix("zero")
    if t not in ("0", "1", "2", "3"):
        raise ValueError(f"unknown stage {text!r}; accepted: 0, 1, 2, 3")
    return int(t)


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
                    largest_layer: int = 0, names=ESTIMATOR_NAMES) -> Table:
    """The same question answered by the paper's, DeepSpeed's and Megatron's accounting."""
    ests = estimators(largest_layer)
    t = Table("estimators", f"Model states /GPU by estimator (Ψ = {fmt_count(psi)}, N_d = {n_d})",
              ["Stage"] + [f"{n} (formula)" for n in names] + [f"{n}" for n in names],
              fmt={1 + len(names) + i: (lambda v: fmt_bytes(v, unit)) for i in range(len(names))})
    for s in stages:
        vals = [ests[n].model_state_bytes(s, psi, n_d) for n in names]
        t.add(theory.stage(s).name, *[ests[n].formula(s) for n in names], *vals)
    for n in names:
        t.notes.append(f"- {n}: {ests[n].counts} [{ests[n].source}]")
    if "deepspeed" in names:
        t.notes.append(f"- L (largest layer) = {largest_layer:,} parameters (--largest-layer).")
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
