"""zerospec.report.replay: one step's measured events replayed on N parallel clocks."""
from __future__ import annotations

import pytest

from zerospec.report.replay import parallel_time
from zerospec.training.config import TrainConfig
from zerospec.training.run import train

# Two ranks, one all-reduce: rank 1 computes longer, so rank 0 waits 2 s at the rendezvous.
TWO_RANKS = [
    [(0, "setup", "compute", 9.0),                       # another step: ignored
     (1, "forward", "compute", 1.0), (1, "grad_sync", "all_reduce", 0.5), (1, "step", "compute", 0.2)],
    [(1, "forward", "compute", 3.0), (1, "grad_sync", "all_reduce", 0.5), (1, "step", "compute", 0.1)],
]


def test_collective_waits_for_the_slowest_rank_then_adds_its_data_movement():
    """Step time = slowest arrival (3 s) + all-reduce (0.5 s) + the longest tail (0.2 s) = 3.7 s."""
    rp = parallel_time(TWO_RANKS, 1)
    assert rp.seconds == pytest.approx(3.7)
    assert rp.wait == pytest.approx([2.0, 0.0])
    assert rp.compute == pytest.approx([1.2, 3.1])
    assert rp.collective_seconds == pytest.approx(0.5)
    assert rp.n_collectives == 1


def test_serial_time_is_all_compute_plus_each_collective_once():
    """With the baton the ranks take turns: 1.2 + 3.1 + 0.5 = 4.8 s, more than the parallel 3.7 s."""
    assert parallel_time(TWO_RANKS, 1).serial_seconds == pytest.approx(4.8)


def test_segments_cover_each_rank_without_overlap():
    """Every rank's bars (compute, wait, collective) tile its clock from 0 to its end time."""
    rp = parallel_time(TWO_RANKS, 1)
    for rank in (0, 1):
        segs = [s for s in rp.segments if s.rank == rank]
        clock = 0.0
        for s in segs:
            assert s.start == pytest.approx(clock)
            clock += s.seconds
    assert [s.kind for s in rp.segments if s.rank == 0] == ["compute", "wait", "all_reduce", "compute"]


def test_ranks_that_disagree_on_a_collective_are_an_error():
    """A replay cannot pair an all-gather with a reduce-scatter: the error names both ranks' ops."""
    bad = [[(1, "x", "all_gather", 0.1)], [(1, "x", "reduce_scatter", 0.1)]]
    with pytest.raises(ValueError, match="rank 0: all_gather, rank 1: reduce_scatter"):
        parallel_time(bad, 1)


def test_a_step_without_events_is_an_error_naming_the_steps_there_are():
    """Asking for step 7 of a 1-step run names the steps that exist."""
    with pytest.raises(ValueError, match=r"no events for step 7.*\[0, 1\]"):
        parallel_time(TWO_RANKS, 7)


def test_replay_of_a_real_run_pairs_every_collective_the_ledger_booked():
    """On a real ZeRO-3 run the replay finds exactly the collectives the comm ledger counted."""
    res = train(TrainConfig(stage=3, n_d=2, steps=1))
    rp = parallel_time(res.timelines, 1)
    assert rp.n_collectives == res.comm.count(0, step=1)
    assert 0 < rp.seconds <= rp.serial_seconds
