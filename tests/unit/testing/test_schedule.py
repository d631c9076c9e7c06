"""The schedule hook of the lockstep benchmark (zerospec/testing/schedule.py)."""
from __future__ import annotations

import functools
import threading
from unittest import mock

import pytest

from tests.support.runs import assert_same_training, config, odd_run
from zerospec.comm.interconnect import Interconnect
from zerospec.testing.schedule import barriers
from zerospec.training.run import train
from zerospec.zero.fetch import ParamFetcher

N, STEPS = 2, 2
UNITS = len(config(0).units())


@functools.lru_cache(maxsize=None)
def _train_recording(where: str):
    """A stage-0 run under ``barriers(where)``: (result, barriers the hook counted, barriers the
    ranks' interconnects really issued, the (rank, unit) order of the ranks' gradient writes,
    the calls of the fetchers' own end-of-backward check)."""
    order: list[tuple[int, int]] = []
    issued, checks = [0], [0]
    lock = threading.Lock()
    written, barrier = ParamFetcher.grad_written, Interconnect.barrier
    check = ParamFetcher.check_complete

    def checked(fetcher):
        with lock:
            checks[0] += 1
        check(fetcher)

    def record(fetcher, i, grad16):
        order.append((fetcher.stage.ctx.rank, i))
        written(fetcher, i, grad16)

    def count(comm):
        with lock:
            issued[0] += 1
        barrier(comm)

    with mock.patch.object(ParamFetcher, "grad_written", record), \
            mock.patch.object(Interconnect, "barrier", count), \
            mock.patch.object(ParamFetcher, "check_complete", checked), barriers(where) as seen:
        res = train(config(0, n_d=N, steps=STEPS))
    return res, seen["issued"], issued[0], order, checks[0]


@pytest.mark.parametrize("where", ["backward", "after_backward"])
def test_barriers_change_no_bit_and_one_is_issued_per_unit_gradient(where):
    """Barriers move no data: the run equals the plain one bit for bit; N × steps × units issued,
    and backward's own completeness check still runs once per rank and step."""
    res, counted, issued, _, checks = _train_recording(where)
    assert_same_training(res, odd_run(0, n_d=N, steps=STEPS))
    assert counted == issued == N * STEPS * UNITS
    assert checks == N * STEPS


def test_barriers_inside_backward_make_the_ranks_run_it_in_lockstep():
    """Inside backward the ranks alternate unit by unit; after it each rank writes all its units first."""
    inside, after = _train_recording("backward")[3], _train_recording("after_backward")[3]
    # round k: every rank's k-th gradient write of the run; lockstep: round k ends before k+1 begins
    rounds: dict[int, list[int]] = {}
    seen = [0] * N
    for pos, (rank, _) in enumerate(inside):
        rounds.setdefault(seen[rank], []).append(pos)
        seen[rank] += 1
    assert len(rounds) == STEPS * UNITS and all(len(p) == N for p in rounds.values())
    assert all(max(rounds[k]) < min(rounds[k + 1]) for k in range(len(rounds) - 1))
    assert [r for r, _ in after[:N * UNITS]] == [r for r in range(N) for _ in range(UNITS)]


def test_an_unknown_place_is_refused_naming_it():
    """barriers("forward") is a ValueError naming the value and the places accepted."""
    with pytest.raises(ValueError, match="backward, after_backward, got 'forward'"):
        with barriers("forward"):
            pass
