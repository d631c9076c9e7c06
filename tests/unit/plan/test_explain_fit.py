"""The one fit search (training/fit.py) as plan/explain_fit.py uses it: the largest micro-batch and
sequence length that fit, searched with few steps."""
from __future__ import annotations

import math

import pytest

from zerospec.training.fit import BOUND, largest

CURVES = {"linear": lambda x: 1000 + 37 * x, "quadratic": lambda x: 500 + 3 * x + x * x,
          "steps": lambda x: 100 * (x // 7), "flat-then-steep": lambda x: 10 if x < 300 else 10 * x}


@pytest.mark.parametrize("curve", list(CURVES))
@pytest.mark.parametrize("hi", [None, 4096])
def test_largest_is_the_last_value_that_fits(curve, hi):
    """For every capacity: the answer fits, the next value does not (or is past the bound), it
    measured both, and it took at most 2·log2(range) + 6 steps."""
    f = CURVES[curve]
    bound = BOUND if hi is None else hi
    for cap in sorted({f(1) - 1, f(1), f(2), f(50) + 1, f(299), f(300), f(1000) - 1, f(4095),
                       f(4096), f(5000)}):
        e = largest(f, cap, hi=hi)
        truth = max((x for x in range(1, min(bound, 6000) + 1) if f(x) <= cap), default=None)
        assert e.value == truth, (cap, e.value, truth)
        if e.value is not None and e.value < bound:
            assert e.peaks[e.value] <= cap < e.peaks[e.value + 1]
        assert e.steps <= 2 * math.ceil(math.log2(bound)) + 6, (cap, e.steps)


def test_a_linear_peak_takes_four_steps():
    """Where the peak is linear in the micro-batch (activations), two steps find the line and two
    confirm the edge."""
    assert largest(CURVES["linear"], 10**6).steps == 4


@pytest.mark.slow   # ~20 meta steps of Llama-3-8B: ~7 s
def test_explain_fit_answers_are_the_edge_of_fitting(capsys):
    """`plan --explain --fit`: at the micro-batch and sequence length it prints, a fresh meta step
    fits the GPU, and one more does not."""
    from zerospec.plan.explain import explain
    from zerospec.plan.explain_fit import fit_table, step_peak
    # eager attention: its B·H·T² scores put the sequence's edge inside the 8,192-token context
    ex = explain("llama-3-8b", 3, 8, 80 * 10**9, "dgx-a100-80gb", seq=1024, attention="eager")
    rows = {r[0]: r for r in fit_table(ex).rows}
    mb = int(rows["micro-batch at seq 1024"][1].replace(",", ""))
    sq = int(rows["sequence length at micro-batch 1"][1].replace(",", ""))
    assert step_peak(ex, mb, 1024) <= ex.capacity < step_peak(ex, mb + 1, 1024)
    assert step_peak(ex, 1, sq) <= ex.capacity < step_peak(ex, 1, sq + 1)
