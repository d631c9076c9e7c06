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


def test_each_record_is_booked_on_the_link_its_sends_take():
    """2 nodes × 2: the world ring's hops 1→2 and 3→0 leave a node; a group's hop goes to its
    ring successor (peer); a rank's own copies to the host take its PCIe link."""
    led = CommLedger(4, gpus_per_node=2)
    for r in range(4):
        led.book(r, "all_gather", torch.float16, 8, "forward", 1)
    led.book(0, "all_gather", torch.float16, 8, "forward", 1, group="dp", n=2, index=0, peer=2)
    led.book(1, "to_host", torch.float16, 8, "forward", 1, group="host", n=1, index=0)
    assert [r.link for r in led.records(group="world")] == ["intra", "inter", "intra", "inter"]
    assert [led.records(0)[-1].link, led.records(1)[-1].link] == ["inter", "host"]
    assert led.crossing(0, group="world") == 6 and led.crossing(1) == 6 and led.crossing(0) == 6 + 4
    assert CommLedger(4).crossing(0) == 0        # one node by default: nothing can cross


def test_a_node_size_that_does_not_divide_the_ranks_is_refused():
    """Nodes are whole: gpus_per_node must divide N, named with the accepted values."""
    with pytest.raises(ValueError, match=r"gpus_per_node must be .* divides the 6 ranks .*got 4; "
                                         r"accepted: 1, 2, 3, 6"):
        CommLedger(6, gpus_per_node=4)
