"""§7 communication volume, measured: elements each rank sends per step, from the comm ledger.

Ring model (C21, SC'20 form): reduce-scatter and all-gather move (N−1)/N·S per rank, all-reduce
twice that. Stages 1–3 move padded units (Ψ_p); stage 0 all-reduces unpadded units, so when N_d
does not divide a unit the ranks' shares differ by an element and the *mean* is exact.
"""
from __future__ import annotations

from fractions import Fraction

import pytest

from tests.support.runs import MODELS, run, sizes, stage_cases, stage_id
from zerospec.paper import theory

STEP = 2  # any step: every step moves the same bytes
C57_PAGE = "spec/communication.md#where-the-3ψ-of-stage-3-comes-from-c24-c57"
CASES = stage_cases(lambda s: s.comm_claim)



@pytest.mark.parametrize("stage,n_d,model", CASES)
def test_elements_per_rank_per_step_follow_the_ring_model(stage, n_d, model, claim_values):
    """DP, P_os, P_os+g move 2Ψ(N−1)/N per rank per step; P_os+g+p moves 3Ψ(N−1)/N (C21–C24)."""
    r = run(stage, n_d, model)
    expected = theory.comm_elements(stage, r.psi_held, n_d)
    claim_values(f"{float(r.comm.mean_elements(step=STEP) / r.psi_held):.4f}Ψ",
                 f"{float(expected / r.psi_held):.4f}Ψ = {theory.comm_in_psi(stage)}Ψ·(N−1)/N "
                 f"({theory.stage(stage).comm_claim})", f"{stage_id(stage)}, N={n_d}")
    assert r.comm.mean_elements(step=STEP) == expected
    if stage or all(u.numel % n_d == 0 for u in r.units):
        assert {r.comm.elements(k, step=STEP) for k in range(n_d)} == {expected}


@pytest.mark.parametrize("n_d", sizes(2, 8, 32))
@pytest.mark.claim("C23")
def test_zero1_all_reduce_variant_costs_1_5x(n_d, claim_values):
    """DeepSpeed's first ZeRO-1 all-reduced gradients then all-gathered parameters: 3Ψ (C23)."""
    r = run(1, n_d, zero1_comm="all_reduce")
    expected = theory.comm_elements(1, r.psi_padded, n_d, "all_reduce")
    assert r.comm.elements(0, step=STEP) == expected
    rs = run(1, n_d)
    assert Fraction(r.comm.elements(0, step=STEP), rs.comm.elements(0, step=STEP)) == Fraction(3, 2)
    claim_values("1.5× of reduce_scatter variant", "1.5× (C23)")


@pytest.mark.parametrize("n_d", sizes(4, 32))
@pytest.mark.claim("C25")
def test_stage3_costs_1_5x_dp_and_stages_1_2_cost_1x(n_d, claim_values):
    """P_os and P_os+g cost 1× the DP volume, P_os+g+p 1.5× (C25)."""
    vols = [run(s, n_d).comm.elements(0, step=STEP) for s in range(4)]
    ratios = [Fraction(v, vols[0]) for v in vols]
    claim_values(" / ".join(str(x) for x in ratios), "1 / 1 / 1 / 3/2 (C25)")
    assert ratios == [1, 1, 1, Fraction(3, 2)]


@pytest.mark.parametrize("n_d", sizes(4, 32))
@pytest.mark.claim("C57", status="differs", page=C57_PAGE)
def test_stage3_volume_is_forward_gathers_plus_backward_gathers_plus_reduce_scatter(n_d):
    """3Ψ = Ψ all-gather in forward + Ψ all-gather in backward + Ψ reduce-scatter (C24, C57): the
    total is the paper's; per pass it is Ψ + E and Ψ − E, E the tied embedding (on the page)."""
    r = run(3, n_d)
    psi_ring = r.psi_padded * theory.ring_factor(n_d)
    assert r.comm.by_op(0, step=STEP) == {"all_gather": 2 * psi_ring, "reduce_scatter": psi_ring}
    gathers = {ph: r.comm.elements(0, step=STEP, op="all_gather", phase=ph)
               for ph in ("forward", "backward")}
    embed = r.units[0].padded * theory.ring_factor(n_d)
    # the tied embedding is gathered twice in forward and never in backward (see parameters.py)
    assert gathers == {"forward": psi_ring + embed, "backward": psi_ring - embed}
    assert r.comm.elements(0, step=STEP, op="all_gather", phase="param_sync") == 0


@pytest.mark.parametrize("n_d", sizes(4, 32))
@pytest.mark.claim("C8")
def test_stage2_reduces_inside_backward_and_stage1_after_it(n_d):
    """ZeRO-2 is a "when" win: the same reduce-scatter bytes, moved during backward (C8, C22)."""
    s1, s2 = run(1, n_d), run(2, n_d)
    assert s1.comm.by_phase(0, step=STEP, op="reduce_scatter") == {"grad_sync": s1.psi_padded * theory.ring_factor(n_d)}
    assert s2.comm.by_phase(0, step=STEP, op="reduce_scatter") == {"backward": s2.psi_padded * theory.ring_factor(n_d)}


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("stage,per_unit", [(0, 1), (1, 2), (2, 2), (3, 3)])
def test_collectives_per_step_are_one_per_unit_per_pass(stage, per_unit, model):
    """Collectives per step: U (DP), 2U (P_os, P_os+g), 3U (P_os+g+p), for U sharding units."""
    r = run(stage, 4, model)
    assert r.comm.count(0, step=STEP) == per_unit * len(r.units)


def test_no_collective_happens_outside_a_training_step():
    """Setup moves no bytes: every rank derives its shards from the same seeded initialisation."""
    for s in range(4):
        assert run(s, 4).comm.elements(0, step=0) == 0
