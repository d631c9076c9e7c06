"""Compute is not partitioned: every stage does the same FLOPs per GPU; only the optimizer shrinks (P2).

FLOPs are counted around each rank's forward and backward with torch's FLOP formulas, by the op
observer (runtime/opcount.py; tests/unit/runtime/test_opcount.py checks its totals against
FlopCounterMode's). Attention is written out as matmuls (model.py), so it is counted.
"""
from __future__ import annotations

import dataclasses

import pytest

from tests.support.runs import MODELS, run, sizes, stage_id, trained, wider
from zerospec.paper import theory
from zerospec.report.measure import VARIANTS, ReportConfig

CASES = [pytest.param(n, m, id=f"nd={n}/{m}", marks=wider(n, m))
         for n, m in [(8, "small"), (4, "odd")]]


def _flops(stage, n_d, model):
    return run(stage, n_d, model, steps=1, count_flops=True)


@pytest.mark.parametrize("n_d,model", CASES)
@pytest.mark.claim("P2")
def test_forward_and_backward_flops_are_identical_in_every_stage_and_rank(n_d, model, claim_values):
    """A ZeRO-3 GPU does the same matmuls as a DP GPU; it only fetches the weights first."""
    per_stage = [[o.flops[0] for o in _flops(s, n_d, model).ranks] for s in range(4)]
    dp = per_stage[0][0]
    claim_values(f"fwd {dp['forward']:,} / bwd {dp['backward']:,} in all 4 stages", "unchanged")
    assert all(f == dp for ranks in per_stage for f in ranks)


@pytest.mark.parametrize("n_d,model", CASES)
@pytest.mark.claim("P2")
def test_forward_flops_match_the_matmul_count_and_backward_is_twice_forward(n_d, model):
    """Forward = 2·tokens·(12d²L + Vd) + 4·b·s²·d·L; backward = 2 × forward."""
    r = _flops(3, n_d, model)
    m = r.config.model
    expected = theory.gpt_forward_flops(m.n_layer, m.n_embd, m.vocab_size, r.config.batch // n_d,
                                        m.block_size)
    assert r.ranks[0].flops[0] == {"forward": expected, "backward": 2 * expected}


@pytest.mark.parametrize("n_d,model,micro_batch", [pytest.param(8, "small", 2, marks=wider(8)),
                                                    (4, "odd", 3)])
@pytest.mark.claim("P2")
def test_a_meta_step_counts_the_flops_of_a_real_step_on_every_rank(n_d, model, micro_batch):
    """The report's FLOP count (one step on meta tensors, one rank per class) equals what is
    counted in a real step of the report's own configuration, for every rank: forward,
    backward, optimizer elements (the ranks of a class count alike, so a class is
    checked on each of its ranks, not told apart from the others)."""
    cfg = ReportConfig(ranks=n_d, model=MODELS[model], micro_batch=micro_batch)
    for key in VARIANTS:
        real = trained(dataclasses.replace(cfg.train_config(key), steps=1, count_flops=True))
        meta = cfg.count_flops(key)
        assert len(meta) == n_d, key
        assert [(o.flops, o.optim_elements) for o in meta] == \
               [(o.flops, o.optim_elements) for o in real.ranks], key


@pytest.mark.parametrize("n_d", sizes(4, 8))
@pytest.mark.parametrize("stage", range(4))
@pytest.mark.claim("C7")
def test_optimizer_step_touches_psi_elements_in_dp_and_psi_over_n_otherwise(stage, n_d):
    """Rank i updates only its 1/N_d partition (C7): Ψ elements at stage 0, Ψ_p/N_d at stages 1–3."""
    r = run(stage, n_d)
    expected = r.psi if stage == 0 else r.psi_padded // n_d
    assert {e for o in r.ranks for e in o.optim_elements} == {expected}, stage_id(stage)
