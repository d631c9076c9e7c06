"""§5 ZeRO-DP stage formulas, measured: per-rank model-state bytes from the memory ledger.

Ψ in the formulas: stage 0 holds every unit unpadded (Ψ); stages 1–3 hold every unit padded to a
multiple of N_d (Ψ_p = Σ ceil(|u|/N_d)·N_d, so Ψ_p − Ψ < N_d per unit), and each formula holds
exactly with Ψ_p. For the default model every unit divides N_d ≤ 128, so Ψ_p = Ψ there.
"""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from tests.support.runs import run, sizes, stage_cases, stage_id
from zerospec import VirtualCluster
from zerospec.paper import theory
from zerospec.model.gpt import GPTConfig, init_params
from zerospec.optim.adam import AdamConfig
from zerospec.zero import STAGES

CASES = stage_cases(lambda s: s.memory_claim)



@pytest.mark.parametrize("stage,n_d,model", CASES)
def test_model_states_per_rank_equal_the_stage_formula(stage, n_d, model, claim_values):
    """16Ψ, 4Ψ+12Ψ/N, 2Ψ+14Ψ/N, 16Ψ/N bytes per rank, exactly, on every rank (C6–C9)."""
    r = run(stage, n_d, model)
    expected = theory.model_state_bytes(stage, r.psi_held, n_d)
    measured = [r.model_states(k) for k in range(n_d)]
    claim_values(f"{measured[0]:,} B", f"{int(expected):,} B ({theory.stage(stage).memory_claim})",
                 f"{stage_id(stage)}, N={n_d}")
    assert measured == [expected] * n_d


@pytest.mark.parametrize("n_d", sizes(1, 4, 32))
@pytest.mark.claim("C2")
def test_each_parameter_costs_2_2_and_12_bytes(n_d):
    """fp16 params 2Ψ, fp16 grads 2Ψ, fp32 master+m+v 12Ψ: 16 bytes per parameter (C2, K = 12)."""
    r = run(0, n_d)
    cur = r.memory[0].snapshots_by_label()["setup@0"][0].current
    assert (cur["param16"], cur["grad16"]) == (2 * r.psi, 2 * r.psi)
    assert cur["master32"] == cur["exp_avg"] == cur["exp_avg_sq"] == 4 * r.psi
    assert sum(cur[c] for c in ("master32", "exp_avg", "exp_avg_sq")) == theory.K_ADAM * r.psi


@pytest.mark.parametrize("n_d", sizes(2, 32))
@pytest.mark.claim("C8")
def test_stage2_never_holds_a_full_gradient(n_d):
    """P_os+g: the grad16 peak is the 2Ψ/N shard plus at most one unit in flight (C8)."""
    r = run(2, n_d)
    largest = max(u.padded for u in r.units)
    for k in range(n_d):
        assert r.memory[k].peak["grad16"] <= 2 * r.psi_padded // n_d + 2 * largest
        assert r.memory[k].peak["grad16"] < 2 * r.psi  # a full gradient buffer never existed


@pytest.mark.parametrize("n_d", sizes(2, 32))
@pytest.mark.claim("C9")
def test_stage3_gathered_parameters_are_bounded_by_the_largest_unit(n_d):
    """P_os+g+p: a gathered unit is freed after use, so at most one unit is whole at a time (C9)."""
    r = run(3, n_d)
    largest = max(u.padded for u in r.units)
    assert {r.memory[k].peak["gathered"] for k in range(n_d)} == {2 * largest}
    assert all(r.memory[k].current["gathered"] == 0 for k in range(n_d))


@pytest.mark.parametrize("n_d", sizes(4, 32))
@pytest.mark.claim("P3")
def test_activation_memory_is_the_same_in_every_stage(n_d):
    """ZeRO-DP partitions model states only; the activations each rank saves are unchanged (P3)."""
    peaks = [run(s, n_d).memory[0].peak["activations"] for s in range(4)]
    assert peaks[0] > 0 and peaks == [peaks[0]] * 4


@pytest.mark.parametrize("n_d", sizes(4, 32))
@pytest.mark.claim("P3")
def test_activation_memory_per_rank_does_not_depend_on_n_d(n_d):
    """Each rank saves activations for its own micro-batch only: the same bytes at N = 1 and N."""
    assert run(0, 1).memory[0].peak["activations"] == run(0, n_d).memory[0].peak["activations"]


@pytest.mark.slow   # the seed's N = 32 runs (tests/support/runs.py, N_DS_DEFAULT)
@pytest.mark.claim("P3")
def test_by_stage3_activations_outweigh_model_states():
    """The seed's observation: at N = 32 the activations dominate what ZeRO-3 leaves per GPU."""
    r = run(3, 32)
    assert r.memory[0].peak["activations"] > r.model_states(0)


@pytest.mark.parametrize("precision,p,k", [("bf16", 2, 12), ("fp32", 4, 8)])
@pytest.mark.parametrize("stage", range(4))
def test_precision_policies_follow_the_generalised_formula(stage, precision, p, k):
    """bf16 keeps the paper's 2+2+12 layout; fp32 has no master copy: 4+4+8 bytes, K = 8."""
    r = run(stage, 4, "odd", steps=1, precision=precision)
    psi = r.psi_held
    assert r.model_states(0) == theory.model_state_bytes(stage, psi, 4, k=k, p=p)


@settings(max_examples=20, deadline=None)
@given(n_d=st.integers(1, 12), d=st.integers(1, 6), vocab=st.integers(1, 20), seq=st.integers(1, 9),
       stage=st.integers(0, 3))
def test_bytes_equal_the_closed_form_plus_padding_for_any_shape(n_d, d, vocab, seq, stage):
    """For random unit sizes and N_d: partitions cover Ψ, padding < N_d per unit, bytes exact."""
    cfg = GPTConfig(vocab_size=vocab, block_size=seq, n_layer=1, n_head=1, n_embd=d)
    cls = STAGES[stage]
    units = cfg.units(n_d, pad=cls.pad)
    params = init_params(cfg, 0)
    init = [u.flatten(params[u.name]) for u in units]
    held = VirtualCluster(n_d).run(lambda ctx: cls(ctx, units, init, AdamConfig()).memory.model_states())
    psi = sum(u.numel for u in units)
    psi_p = sum(u.padded for u in units)
    assert psi == cfg.psi and all(0 <= u.padded - u.numel < n_d for u in units)
    if stage:
        owned = [sum(u.real_in_shard(r) for r in range(n_d)) for u in units]
        assert owned == [u.numel for u in units]   # every element owned exactly once
    assert held == [theory.model_state_bytes(stage, psi if stage == 0 else psi_p, n_d)] * n_d
