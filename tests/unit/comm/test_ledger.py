"""CommLedger: the ring model in exact integers, per rank, phase and step."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, strategies as st

from zerospec.comm.ledger import CommLedger, ring_elements


@given(n=st.integers(1, 64), numel=st.integers(0, 10_000))
def test_uneven_all_reduce_totals_exactly_2_n_minus_1_times_s(n, numel):
    """Summed over ranks an all-reduce of S moves exactly 2(N−1)·S, even when N does not divide S."""
    assert sum(ring_elements("all_reduce", numel, n, r)[0] for r in range(n)) == 2 * (n - 1) * numel


def test_reduce_scatter_of_a_size_n_does_not_divide_is_refused():
    """The ring model needs N equal chunks for RS/AG; anything else names the sizes."""
    with pytest.raises(ValueError, match="reduce_scatter of 10 elements does not split over 4 ranks"):
        ring_elements("reduce_scatter", 10, 4, 0)


def test_unknown_op_names_the_accepted_ones():
    """A collective the model does not know is an error listing the ones it does."""
    with pytest.raises(ValueError, match="unknown collective 'gather'; accepted: all_reduce"):
        ring_elements("gather", 10, 4, 0)


def test_broadcast_chain_sends_s_from_all_but_the_last_and_src_receives_nothing():
    """Pipelined broadcast: every rank but the chain's end forwards S; everyone but src receives S."""
    assert [ring_elements("broadcast", 7, 3, r, src=1) for r in range(3)] == [(0, 7), (7, 0), (7, 7)]


def test_totals_filter_by_phase_and_step_and_normalise_by_psi():
    """Per-phase and per-step totals add up; the Ψ view is exact."""
    led = CommLedger(2)
    led.book(0, "all_gather", torch.float16, 100, "forward", 1)
    led.book(0, "reduce_scatter", torch.float16, 100, "backward", 1)
    led.book(0, "all_gather", torch.float16, 100, "forward", 2)
    assert led.elements(0) == 150 and led.elements(0, phase="forward") == 100
    assert led.elements(0, step=1) == 100 and led.count(0, step=2) == 1
    assert led.by_phase(0, step=1) == {"forward": 50, "backward": 50}
    assert led.in_psi(0, 100, step=1) == 1
    assert led.bytes(0) == 300
