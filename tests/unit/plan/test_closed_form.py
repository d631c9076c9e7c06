"""zerospec.plan.closed_form and zerospec.paper.estimators: the other tools' accountings, checked
against their printed values (DeepSpeed's docs, Megatron's table). The
paper's tables and its Figure 1 example from the same closed forms: tests/claims/test_tables_plan.py."""
from __future__ import annotations

from fractions import Fraction

import pytest

from zerospec.plan import closed_form as plan
from zerospec.paper.estimators import estimators

GB, GIB = 10**9, 2**30


# -- estimators ----------------------------------------------------------------------------------
def test_deepspeed_zero3_matches_its_documented_printout():
    """DeepSpeed docs (memory.rst, 2851M params, 32M largest layer, 8 GPUs): 6.09 / 0.78 / 0.12 GiB."""
    from zerospec.paper.estimators import deepspeed_bytes
    psi, layer = 2851 * 10**6, 32 * 10**6
    printed = {(False, False): "6.09", (True, False): "0.78", (True, True): "0.12"}
    for (opt, params), gib in printed.items():
        got = Fraction(deepspeed_bytes(3, psi, 8, layer, opt, params), GIB)
        assert abs(got - Fraction(gib)) <= Fraction(5, 1000), (opt, params, float(got))


def test_deepspeed_zero2_is_2psi_plus_18psi_over_n_and_2psi_offloaded():
    """ZeRO-2 at 2851M params on 8 GPUs: 5.31 GiB offloaded (docs); 2Ψ + 18Ψ/8 = 12,116,750,000 B."""
    est = estimators()["deepspeed"]
    assert est.model_state_bytes(2, 2851 * 10**6, 8) == 12_116_750_000
    from zerospec.paper.estimators import deepspeed_bytes
    assert abs(Fraction(deepspeed_bytes(2, 2851 * 10**6, 8, offload_optimizer=True), GIB)
               - Fraction("5.31")) <= Fraction(5, 1000)
    assert est.model_state_bytes(0, 10**9, 8) is None     # DeepSpeed has no stage-0 estimator


def test_megatron_distributed_optimizer_table():
    """Megatron's bytes per parameter: fp16 20 replicated, 4 + 16/d distributed (d = 4: 8 B)."""
    est = estimators()["megatron"]
    assert est.model_state_bytes(0, 10**9, 4) == 20 * 10**9
    assert est.model_state_bytes(1, 10**9, 4) == 8 * 10**9
    assert est.model_state_bytes(2, 10**9, 4) is None
    bf16 = estimators(megatron_dtype="bf16")["megatron"]
    assert bf16.model_state_bytes(1, 10**9, 4) == 9 * 10**9          # 6 + 12/4


def test_estimators_disagree_by_the_buffers_they_count():
    """At the same Ψ and N, DeepSpeed's ZeRO-2 exceeds the paper's by its fp32 gradient shard, 4Ψ/N."""
    e = estimators()
    psi, n = 10**9, 8
    extra = e["deepspeed"].model_state_bytes(2, psi, n) - e["paper"].model_state_bytes(2, psi, n)
    assert extra == 4 * psi // n


def test_max_params_is_the_largest_psi_that_still_fits():
    """One more parameter would not fit: checked for every estimator with a formula."""
    for est in estimators(largest_layer=10**6).values():
        for s in range(4):
            psi = est.max_params(s, 32 * GB, 64)
            if psi is None:
                continue
            assert est.model_state_bytes(s, psi, 64) <= 32 * GB < est.model_state_bytes(s, psi + 1, 64)
