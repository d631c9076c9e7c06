"""Markdown tables for the robustness pages (loss scaling, clipping, accumulation, checkpoints,
determinism), pinned by snapshots in tests/claims/__snapshots__/ and shown verbatim in spec/.

Integers exactly; Δ columns through ``format.fmt_delta``: "0" means bit-identical
(``torch.equal``), never "small".
"""
from __future__ import annotations

import torch

from .format import fmt_delta, markdown, max_delta


def _steps(xs, fmt) -> str:
    return " ".join(fmt(x) for x in xs)


def _step_comm(r, step: int, **where) -> tuple[int, int]:
    recs = r.comm.records(0, step=step, **where)
    return len(recs), sum(x.elements_sent for x in recs)


def loss_scale_table(results) -> str:
    """Per stage: the scale each step used, which steps every rank skipped, the overflow vote."""
    dp = results[0]
    rows = []
    for r in results:
        votes = [x for x in r.comm.records(0, step=1, phase="step", op="all_reduce") if x.numel == 1]
        skipped = [s for s, flags in enumerate(zip(*(
            [rep.skipped for rep in o.reports] for o in r.ranks)), 1) if any(flags)]
        agree = all([rep.skipped for rep in o.reports] == r.skipped for o in r.ranks)
        rows.append([r.config.label, _steps(r.loss_scales, lambda x: f"{x:g}"),
                     ", ".join(map(str, skipped)) + (" (every rank)" if agree else " (ranks DISAGREE)"),
                     len(votes), _steps(r.losses, lambda x: f"{x:.6f}"),
                     fmt_delta(max_delta(r.master, dp.master))])
    return markdown(["stage", "loss scale at steps 1…", "skipped steps", "overflow votes /step",
                     "loss at steps 1…", "max Δmaster vs DP"], rows)


def clip_table(results, unsharded: list[float]) -> str:
    """Per run: the pre-clip norm per step; first row: math.fsum over DP's full gradient."""
    dp = results[0]
    rows = [["math.fsum of DP's full gradient (exact, rounded once)",
             _steps(unsharded, lambda x: f"{x:.7f}"), "–", "–"]]
    for r in results:
        votes = [x for x in r.comm.records(0, step=1, phase="step") if x.dtype == torch.int64]
        rows.append([f"{r.config.label}, N={r.config.n_d}", _steps(r.grad_norms, lambda x: f"{x:.7f}"),
                     len(votes), fmt_delta(max_delta(r.master, dp.master))])
    return markdown(["norm from", "pre-clip ‖g‖ at steps 1…", "norm all-reduces /step",
                     "max Δmaster vs first run"], rows)


def accumulation_table(results) -> str:
    """Per (stage, G): model states, gradient reductions per step (count, elements, bytes), all
    traffic per step, and the difference from DP at the same G."""
    dp = {r.config.grad_accum_steps: r for r in results if r.config.stage == 0}
    rows = []
    for r in results:
        g = r.config.grad_accum_steps
        grad = [x for x in r.comm.records(0, step=2) if x.op in ("all_reduce", "reduce_scatter")]
        n_all, el_all = _step_comm(r, 2)
        rows.append([r.config.label, g, f"{r.model_states(0):,}", len(grad),
                     f"{sum(x.elements_sent for x in grad):,}", f"{sum(x.bytes_sent for x in grad):,}",
                     n_all, f"{el_all:,}", fmt_delta(max_delta(r.master, dp[g].master))])
    return markdown(["stage", "G", "model states /GPU (B)", "grad reductions /step", "grad elements /step",
                     "grad bytes /step", "collectives /step", "elements /step", "max Δmaster vs DP"], rows)


def checkpoint_table(rows: list[dict]) -> str:
    """Continuations of one checkpoint: each row a (stage, M, G) with its comparisons."""
    out = []
    for x in rows:
        out.append([x["stage"], x["m"], x["g"], x["micro"], "yes" if x["same_set"] else "no",
                    fmt_delta(x["vs_memory"]), fmt_delta(x["vs_original"])])
    return markdown(["continued as", "M ranks", "G", "micro-batch rows", "same micro-batches as N run",
                     "max Δmaster vs in-memory resume at M", "max Δmaster vs uninterrupted N run"], out)


def checkpoint_files_table(files: list[tuple[str, int]]) -> str:
    """Per rank file: real elements and their tensor bytes (fp16 param + fp32 master, m, v)."""
    rows = [[name, f"{n:,}", f"{14 * n:,}"] for name, n in files]
    total = sum(n for _, n in files)
    rows.append(["all files", f"{total:,} (= Ψ)", f"{14 * total:,} (= 14Ψ)"])
    return markdown(["file", "real elements", "tensor bytes (2 + 4 + 4 + 4 per element)"], rows)


def determinism_table(rows: list[tuple[str, str, float, float]]) -> str:
    """Runs of one config under different rank schedules: the largest differences from the first."""
    return markdown(["config: schedule", "order ranks finished step 1", "max Δmaster vs first run",
                     "max Δloss"], [[a, b, fmt_delta(c), fmt_delta(d)] for a, b, c, d in rows])
