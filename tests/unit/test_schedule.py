"""The schedule hook of the lockstep benchmark (zerospec/testing/schedule.py)."""
from __future__ import annotations

from unittest import mock

import pytest

from tests.runs import assert_same_training, config, odd_run
from zerospec.testing.schedule import barriers
from zerospec.training.run import train
from zerospec.zero.fetch import ParamFetcher

N, STEPS = 2, 2


def _train_recording(where: str):
    """A stage-0 run under ``barriers(where)``: (result, barriers issued, the (rank, unit) order in
    which the ranks wrote their unit gradients, over the whole run)."""
    order: list[tuple[int, int]] = []
    written = ParamFetcher.grad_written

    def record(fetcher, i, grad16):
        order.append((fetcher.stage.ctx.rank, i))
        written(fetcher, i, grad16)

    with mock.patch.object(ParamFetcher, "grad_written", record), barriers(where) as seen:
        res = train(config(0, n_d=N, steps=STEPS))
    return res, seen["issued"], order


@pytest.mark.parametrize("where", ["backward", "after_backward"])
def test_barriers_change_no_bit_and_one_is_issued_per_unit_gradient(where):
    """Barriers move no data: the run equals the plain one bit for bit; N × steps × units issued."""
    res, issued, _ = _train_recording(where)
    assert_same_training(res, odd_run(0, n_d=N, steps=STEPS))
    assert issued == N * STEPS * len(config(0).units())


def test_barriers_inside_backward_make_the_ranks_run_it_in_lockstep():
    """Inside backward the ranks alternate unit by unit; after it each rank writes all its units first."""
    units = len(config(0).units())
    _, _, inside = _train_recording("backward")
    _, _, after = _train_recording("after_backward")
    # round k: every rank's k-th gradient write of the run; lockstep: round k ends before k+1 begins
    rounds: dict[int, list[int]] = {}
    seen = [0] * N
    for pos, (rank, _) in enumerate(inside):
        rounds.setdefault(seen[rank], []).append(pos)
        seen[rank] += 1
    assert len(rounds) == STEPS * units and all(len(p) == N for p in rounds.values())
    assert all(max(rounds[k]) < min(rounds[k + 1]) for k in range(len(rounds) - 1))
    assert [r for r, _ in after[:N * units]] == [r for r in range(N) for _ in range(units)]


def test_an_unknown_place_is_refused_naming_it():
    with pytest.raises(ValueError, match="'forward'.*backward, after_backward|backward, after_backward.*'forward'"):
        with barriers("forward"):
            pass
