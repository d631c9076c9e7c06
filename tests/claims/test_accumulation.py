"""Gradient accumulation over G micro-batches: stages 0/1 reduce once per step, stages 2/3
reduce-scatter every micro-batch into their shard — and all four stay bit-identical (P6).

Expected figures are the ring model's (C21) with G written out: per step and rank, DP all-reduces
Ψ once, P_os reduce-scatters and all-gathers Ψ_p once, P_os+g reduce-scatters G times and
all-gathers once, P_os+g+p gathers twice and reduce-scatters once *per micro-batch*. Memory: the
exact accumulator holds 8 bytes per gradient element where G = 1 holds 2 (zero/accumulate.py).
"""
from __future__ import annotations

from fractions import Fraction

import pytest
import torch

from tests.support.runs import assert_same_training, odd_run, stage_id
from zerospec.render import robust_tables
from zerospec.paper import theory

GS = (1, 2, 4)
PASSES = {0: lambda g: 2, 1: lambda g: 2, 2: lambda g: g + 1, 3: lambda g: 3 * g}   # × Ψ(N−1)/N


def _psi(r):
    return r.psi if r.config.stage == 0 else r.psi_padded


@pytest.mark.parametrize("stage,n_d,g", [pytest.param(s, n, g, id=f"{stage_id(s)}/nd={n}/G={g}",
                                                      marks=[pytest.mark.slow] * (n != 3))
                                         for n, g in [(4, 2), (4, 4), (3, 2)] for s in (1, 2, 3)])
# the default run: N_d = 3, whose padded partitions are the case that can go wrong
@pytest.mark.claim("P6")
def test_accumulated_training_is_bit_identical_in_every_stage(stage, n_d, g, claim_values):
    """G micro-batches per step: every stage's losses and weights equal DP's bit for bit."""
    assert_same_training(odd_run(0, n_d, steps=3, grad_accum_steps=g),
                         odd_run(stage, n_d, steps=3, grad_accum_steps=g))
    claim_values(f"Δ vs DP = 0 ({stage_id(stage)}, N={n_d}, G={g})", "same algorithm")


@pytest.mark.parametrize("stage", range(4), ids=stage_id)
@pytest.mark.claim("P6")
def test_only_stages_2_and_3_pay_per_micro_batch_on_the_wire(stage, claim_values):
    """Elements per step: DP and P_os are flat in G; P_os+g grows by G reduce-scatters, P_os+g+p by 3G passes."""
    got = {}
    for g in GS:
        r = odd_run(stage, 4, steps=3, grad_accum_steps=g)
        expected = PASSES[stage](g) * Fraction(_psi(r)) * theory.ring_factor(4)
        assert r.comm.mean_elements(step=2) == expected
        got[g] = r.comm.mean_elements(step=2) / _psi(r)
    claim_values(" / ".join(f"{float(v):.4f}Ψ" for v in got.values()) + f" at G = 1/2/4 ({stage_id(stage)})",
                 {0: "flat", 1: "flat", 2: "(G+1)·¾Ψ", 3: "3G·¾Ψ"}[stage])


@pytest.mark.parametrize("stage", range(4), ids=stage_id)
@pytest.mark.claim("P6")
def test_exact_accumulation_reduces_in_fp64_and_gathers_parameters_in_fp16(stage):
    """With G > 1 every gradient reduction carries fp64 (exact sums); parameter all-gathers stay fp16."""
    r = odd_run(stage, 4, steps=3, grad_accum_steps=2)
    recs = r.comm.records(step=2)
    assert {x.dtype for x in recs if x.op in ("all_reduce", "reduce_scatter")} == {torch.float64}
    assert {x.dtype for x in recs if x.op == "all_gather"} <= {torch.float16}


@pytest.mark.parametrize("stage", range(4), ids=stage_id)
@pytest.mark.claim("P6")
def test_model_states_do_not_grow_with_g(stage):
    """G = 2 and 4 hold the same model states: 2Ψ params, 8Ψ exact gradients, 12Ψ Adam, sharded per stage."""
    n = 4
    for g in (2, 4):
        r = odd_run(stage, n, steps=3, grad_accum_steps=g)
        p = _psi(r)
        expected = {0: 22 * p, 1: 10 * p + 12 * p // n, 2: 2 * p + 20 * p // n, 3: 22 * p // n}[stage]
        assert r.model_states(0) == expected


@pytest.mark.claim("P6")
def test_with_exact_sums_only_the_set_of_micro_batches_matters():
    """The same 8 micro-batches spread as N×G = 4×2, 2×4, 1×8 or 8×1: bit-identical weights and losses."""
    base = odd_run(3, 4, steps=3, global_batch=16, grad_accum_steps=2)
    for n, g in [(2, 4), (1, 8), (8, 1)]:
        other = odd_run(3, n, steps=3, global_batch=16, grad_accum_steps=g, exact_grads=True)
        assert all(torch.equal(base.master[k], other.master[k]) for k in base.master)
        assert other.losses == base.losses


def test_accumulation_table(md_snapshot):
    """spec/accumulation.md's table: memory and traffic per stage and G."""
    rs = [odd_run(s, 4, steps=3, grad_accum_steps=g) for g in GS for s in range(4)]
    assert robust_tables.accumulation_table(rs) == md_snapshot
