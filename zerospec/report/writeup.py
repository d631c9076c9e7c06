"""The seed write-up's tables, filled from one report run's measurements (:mod:`zerospec.report.measure`).

Measured values come from the run's ledgers (memory, comm, FLOPs, timelines); the expected side comes
from :mod:`zerospec.paper.theory` and is labelled with its claim id. Tables are data
(:class:`~zerospec.render.format.Table`), rendered as Markdown, CSV or JSON.
"""
from __future__ import annotations

from fractions import Fraction

import torch

from ..paper import theory
from .choices import TABLES
from ..render.format import Table, fmt_int, fmt_mb, fmt_psi, fmt_ratio, fmt_seconds, max_delta, sig
from .measure import Measurements, Run
from ..plan.closed_form import plan_table

OPS = ("all_reduce", "reduce_scatter", "all_gather")


def _states(run: Run) -> int:
    """Per-GPU model states after set-up: the largest over ranks (the one that must fit)."""
    return max(o.model_states for o in run.result.ranks)


def mean_by_op(run: Run, step: int) -> dict[str, Fraction]:
    """Elements sent per GPU at ``step`` by collective, the mean over ranks (exact): every op in
    :data:`OPS` is present, 0 where the stage issues none (the comm table and figure read this)."""
    comm, n = run.result.comm, run.result.config.n_d
    out = {op: Fraction(0) for op in OPS}
    for r in range(n):
        for op, e in comm.by_op(r, step=step).items():
            out[op] = out.get(op, Fraction(0)) + Fraction(e, n)
    return out


def memory_table(m: Measurements) -> Table:
    n = m.config.ranks
    t = Table("memory", f"Per-GPU model states at N = {n} (measured vs paper formula, C6–C9)",
              ["Stage", "Partitioned", "Measured /GPU (B)", "Measured", "Paper formula", "Formula (B)",
               "Ratio"], fmt={2: fmt_int, 3: fmt_mb, 5: lambda v: fmt_int(v) if Fraction(v).denominator == 1
                              else f"{float(v):,.1f}", 6: fmt_ratio})
    for run in m.runs:
        s = theory.stage(run.stage)
        expected = theory.model_state_bytes(s.index, run.result.psi, n)
        measured = _states(run)
        t.add(run.label, s.partitioned, measured, measured, s.formula, expected,
              Fraction(measured) / expected)
    t.notes.append(f"Ψ = {m.runs[0].result.psi:,} parameters (padded to multiples of N: "
                   f"{m.runs[-1].result.psi_padded:,}); ratio ≠ 1 only where padding adds bytes.")
    return t


def comm_table(m: Measurements) -> Table:
    s_last = m.config.steps
    t = Table("comm", f"Communication per step per GPU (step {s_last}, elements, ring model; C21–C24)",
              ["Stage", "all-reduce", "reduce-scatter", "all-gather", "Total (elements)", "Measured",
               "Paper", "Collectives /step"],
              fmt={1: fmt_int, 2: fmt_int, 3: fmt_int, 4: fmt_int, 5: fmt_psi, 6: fmt_psi})
    for run in m.runs:
        res = run.result
        ops = mean_by_op(run, s_last)
        total = res.comm.mean_elements(step=s_last)
        expected = theory.comm_elements(run.stage, res.psi, res.config.n_d, res.config.zero1_comm)
        t.add(run.label, ops["all_reduce"], ops["reduce_scatter"], ops["all_gather"], total,
              total / res.psi, expected / res.psi, res.comm.count(0, step=s_last))
    t.notes.append("Elements sent per GPU (mean over ranks); fp16, so bytes = 2 × elements (C20). "
                   "Paper: 2Ψ(N−1)/N for DP, P_os, P_os+g (C21–C23); 3Ψ(N−1)/N for P_os+g+p and for "
                   "the all-reduce ZeRO-1 (C23, C24).")
    return t


def equivalence_table(m: Measurements) -> Table:
    steps = m.config.steps
    ref = next((r for r in m.runs if r.stage == 0), None)
    t = Table("equivalence", "Equivalence: same seed, same data, every stage (P1: ZeRO is exact DP)",
              ["Stage"] + [f"Loss @ step {s}" for s in range(1, steps + 1)]
              + ["Max |Δloss| vs ZeRO-0", "Max |Δmaster| vs ZeRO-0", "Bit-identical"],
              fmt={**{i: (lambda v: f"{v:.6f}") for i in range(1, steps + 1)},
                   steps + 1: lambda v: "0" if v == 0 else f"{v:.1e}",
                   steps + 2: lambda v: "0" if v == 0 else f"{v:.1e}"})
    for run in m.runs:
        res = run.result
        if ref is None or run is ref:
            t.add(run.label, *res.losses, None, None, None)
            continue
        dloss = max(abs(a - b) for a, b in zip(res.losses, ref.result.losses))
        dmaster = max_delta(res.master, ref.result.master)
        same = (all(torch.equal(res.master[k], ref.result.master[k]) for k in res.master)
                and all(torch.equal(a, b) for ra, rb in zip(res.rank_losses, ref.result.rank_losses)
                        for a, b in zip(ra, rb)))
        t.add(run.label, *res.losses, dloss, dmaster, same)
    if ref is None:
        t.notes.append("ZeRO-0 was not run (--stages), so there is no reference to compare with.")
    else:
        t.notes.append("Loss: mean over ranks, fp32 per rank. Master: final fp32 weights, all "
                       "parameters. Bit-identical: torch.equal on every rank's loss and every weight.")
    return t


def _flops_of(run: Run) -> list[tuple[int, int, int]]:
    """Per rank: (forward, backward, optimizer elements) of the FLOP-counting run's step."""
    return [(o.flops[-1]["forward"], o.flops[-1]["backward"], o.optim_elements[-1])
            for o in run.flops]


def flops_table(m: Measurements) -> Table:
    n, g = m.config.ranks, m.config.model
    tokens = m.config.micro_batch * g.block_size
    expected_fwd = theory.gpt_forward_flops(g.n_layer, g.n_embd, g.vocab_size, m.config.micro_batch,
                                            g.block_size)
    ref = next((r for r in m.runs if r.stage == 0), None)
    t = Table("flops", f"Compute per GPU per step ({tokens} tokens per GPU)",
              ["Stage", "Forward FLOPs", "Expected (matmul count)", "Backward FLOPs", "Backward / forward",
               "Forward / 2Ψ·tokens", "Same as ZeRO-0", "Optimizer elements", "Paper (Ψ or Ψ/N, C7)"],
              fmt={1: fmt_int, 2: fmt_int, 3: fmt_int, 4: fmt_ratio, 5: fmt_ratio, 7: fmt_int, 8: fmt_int})
    for run in m.runs:
        per_rank = _flops_of(run)
        fwd, bwd, opt = max(per_rank)
        same = None if ref is None else [f[:2] for f in per_rank] == [f[:2] for f in _flops_of(ref)]
        t.add(run.label, fwd, expected_fwd, bwd, Fraction(bwd, fwd) if fwd else None,
              Fraction(fwd) / theory.forward_flops(run.result.psi, tokens) if fwd else None, same,
              opt, theory.optimizer_elements(run.stage, run.result.psi, n))
    t.notes.append("Counted with torch's FLOP formulas (those of FlopCounterMode) in a one-step "
                   "run of the same configuration on meta tensors (counting slows every op, so it "
                   "is kept out of the timed run; FLOPs depend on shapes alone, not on values or "
                   "dtype, so meta counts what real tensors do, rank by rank: "
                   "tests/claims/test_compute.py); matmuls and attention count, lookups and "
                   "LayerNorm count 0. Expected: every matmul of the GPT at 2 FLOPs per "
                   "multiply-add (theory.gpt_forward_flops); 2Ψ per token forward, 4Ψ backward is "
                   "the dense-model rule (C-I5). ZeRO partitions state, never the math: forward and "
                   "backward match stage 0 exactly; only the optimizer step shrinks, to this rank's "
                   "1/N slice.")
    return t


def wallclock_table(m: Measurements) -> Table:
    s_last = m.config.steps
    t = Table("wallclock", f"Wall-clock per step (step {s_last})",
              ["Stage", "Serial step (measured)", "Parallel step (replayed)",
               "Collectives (data movement)", "Waiting at collectives (mean rank)", "Max rank compute",
               "Whole run (serial, all steps)"],
              fmt={i: fmt_seconds for i in range(1, 7)})
    for run in m.runs:
        rp = run.replay
        t.add(run.label, rp.serial_seconds, rp.seconds, rp.collective_seconds,
              sum(rp.wait) / len(rp.wait), max(rp.compute), run.result.wall_seconds)
    t.notes.append(f"Serial: the {m.config.ranks} virtual GPUs take turns on this machine's CPU, so a "
                   f"step costs the sum of every rank's work; parallel: the same measured events "
                   f"replayed as if each rank had its own device (zerospec.report.replay.parallel_time). "
                   f"Collectives: the simulator's data movement, one thread at a time copying all "
                   f"{m.config.ranks} ranks' buffers (a reduce-scatter that stages 2 and 3 post "
                   f"inside backward is summed as each rank posts, and its last poster records "
                   f"the whole), so pessimistic for a real interconnect. "
                   f"Threads are not GPUs: this shows synchronisation structure, not throughput — "
                   f"see the scaled table for volume ÷ bandwidth.")
    return t


def activations_table(m: Measurements) -> Table:
    t = Table("activations", "Activation memory next to model states (per GPU, peak over the run)",
              ["Stage", "Model states", "Activations (peak)", "Gathered params (peak)",
               "Activations / model states"],
              fmt={1: fmt_mb, 2: fmt_mb, 3: fmt_mb, 4: sig})   # a proportion: 3 digits say it
    for run in m.runs:
        states = _states(run)
        acts = max(mem.peak["activations"] for mem in run.result.memory)
        gathered = max(mem.peak["gathered"] for mem in run.result.memory)
        t.add(run.label, states, acts, gathered, Fraction(acts, states))
    t.notes.append(f"Micro-batch {m.config.micro_batch} × {m.config.model.block_size} tokens per GPU. "
                   f"ZeRO-DP partitions model states only; activations are ZeRO-R's job (C1, C27).")
    return t


ZERO_R_LABELS = {"none": "no checkpointing", "checkpoints": "a checkpoint per block",
                 "P_a": "P_a (N_m = 2)", "P_a+cpu": "P_a+cpu (N_m = 2)"}


def zero_r_table(m: Measurements) -> Table:
    t = Table("zero_r", "ZeRO-R's activation options (ZeRO-3, per GPU, one meta step)",
              ["Option", "GPUs", "Activation peak", "Checkpoints on GPU", "Checkpoints on host",
               "Recompute (peak)", "MP elements", "Host link"],
              fmt={2: fmt_mb, 3: fmt_mb, 4: fmt_mb, 5: fmt_mb, 7: fmt_mb})
    for key, r in m.zero_r.items():
        mem, led = r.memory(0), r.comm_ledger([0])
        link = led.link_bytes(0, group="host")
        t.add(ZERO_R_LABELS[key], f"{r.config.n_d} × {r.config.n_m}",
              mem.peak_total - r.model_states(0), mem.peak["checkpoints"],
              r.host(0).peak["checkpoints"], mem.peak["recomputed"],
              led.elements(0, group="mp"), link)
    t.notes.append("Activation peak: the step's peak less the model states. The recompute, P_a "
                   "and P_a+cpu change no bit of training (spec/activations.md, "
                   "spec/model_parallel.md); P_a rows need an even --heads.")
    return t


def scaled_table(m: Measurements) -> Table:
    c = m.config
    t = plan_table(c.scale_params, c.ranks, c.gpu_bytes, c.bandwidth, unit=c.unit, name="scaled")
    t.title = f"Scaled to the paper: {t.title} — closed forms (theory.py), not measured"
    return t


BUILDERS = {"memory": memory_table, "comm": comm_table, "equivalence": equivalence_table,
            "flops": flops_table, "wallclock": wallclock_table, "activations": activations_table,
            "zero_r": zero_r_table, "scaled": scaled_table}


def build_tables(m: Measurements, names=TABLES) -> list[Table]:
    return [BUILDERS[n](m) for n in names]


def header(m: Measurements) -> list[str]:
    c, res = m.config, m.runs[0].result
    g = c.model
    steps = f"{c.steps} step" + ("s" if c.steps != 1 else "")
    return [f"# zerospec report: ZeRO-DP on {c.ranks} virtual GPUs",
            "",
            f"Tiny GPT: {g.n_layer} layers, d = {g.n_embd}, {g.n_head} heads, vocab {g.vocab_size}, "
            f"sequence {g.block_size}; Ψ = {res.psi:,} parameters. {steps} of mixed-precision "
            f"Adam (fp16 params/grads, fp32 master/m/v: K = 12), {c.micro_batch} sequences per GPU. "
            f"Every number below is measured in this run unless labelled as a paper formula."]
