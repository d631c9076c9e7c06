"""Interconnect.batch: collectives that may complete together, each booked as itself."""
from __future__ import annotations

import time

import pytest
import torch

from zerospec import VirtualCluster
from zerospec.runtime.context import RankContext
from zerospec.comm.interconnect import Interconnect
from zerospec.comm.ledger import CommLedger
from zerospec.runtime.errors import CollectiveError
from zerospec.runtime.memory import MemoryLedger

WAIT = 0.05


class _Deferred:
    """A backend that, like torch's async ops, completes a batch's collectives only at its end.
    ``fail_first``: the first collective of a batch fails when waited for (a peer died)."""

    def __init__(self, fail_first: bool = False):
        self.pending: list | None = None
        self.pending_calls: list = []
        self.dropped = 0
        self.fail_first = fail_first

    def wire_factor(self, op):
        return 1

    def collective(self, rank, call):
        def land():   # two ranks holding the same tensor: the sum is twice it
            if self.fail_first and self.pending_calls and call is self.pending_calls[0]:
                err = CollectiveError(f"peer gone during {call.describe()}")
                err.call = call
                raise err
            call.out.copy_(call.inp * 2)
        call.seconds = 0.0
        if self.pending is None:
            land()
        else:
            self.pending.append(land)
            self.pending_calls.append(call)

    def start_batch(self):
        self.pending, self.pending_calls = [], []

    def finish_batch(self, wait=True):
        pending, self.pending = self.pending, None
        if not wait:
            self.dropped += len(pending)
            return
        time.sleep(WAIT)
        for land in pending:
            land()


def _ctx(backend) -> RankContext:
    ctx = RankContext(0, 2, MemoryLedger(), None)
    ctx.comm = Interconnect(ctx, backend, CommLedger(2))
    return ctx


def test_a_batch_lands_its_collectives_at_its_end_and_books_each_one():
    """Outputs are valid after the block; the ledger has one record per collective, as unbatched."""
    ctx = _ctx(_Deferred())
    a, b = torch.ones(4), torch.full((2,), 3.0)
    with ctx.comm.batch():
        ctx.comm.all_reduce(a)
        ctx.comm.all_reduce(b)
        assert a.tolist() == [1.0] * 4          # still in flight
    assert a.tolist() == [2.0] * 4 and b.tolist() == [6.0, 6.0]
    assert [r.numel for r in ctx.comm.ledger.records(0)] == [4, 2]


def test_the_wait_at_a_batchs_end_is_collective_time_not_compute():
    """The completion wait is added to the batch's last collective on the timeline."""
    ctx = _ctx(_Deferred())
    with ctx.comm.batch():
        ctx.comm.all_reduce(torch.ones(4))
        ctx.comm.all_reduce(torch.ones(4))
    ctx.timeline.mark_compute()
    kinds = [(kind, sec) for _, _, kind, sec in ctx.timeline.events]
    collectives = [sec for kind, sec in kinds if kind != "compute"]
    assert collectives[-1] >= WAIT and collectives[0] < WAIT
    assert all(sec < WAIT for kind, sec in kinds if kind == "compute")


def test_an_error_inside_a_batch_drops_it_instead_of_waiting_on_peers():
    """A failing rank must not block on collectives its peers will never finish."""
    backend = _Deferred()
    ctx = _ctx(backend)
    with pytest.raises(ValueError, match="boom"):
        with ctx.comm.batch():
            ctx.comm.all_reduce(torch.ones(4))
            raise ValueError("boom")
    assert backend.dropped == 1


def test_on_the_simulator_a_batch_changes_nothing():
    """The thread backend completes each collective at once: results inside the block are final."""
    def fn(ctx):
        x = torch.full((3,), float(ctx.rank + 1))
        with ctx.comm.batch():
            ctx.comm.all_reduce(x)
            inside = x.tolist()
        return inside, x.tolist()
    assert VirtualCluster(2).run(fn) == [([3.0] * 3, [3.0] * 3)] * 2


def test_a_batch_that_issues_nothing_adds_no_time_to_an_earlier_collective():
    """The wait belongs to the batch's own collectives; with none, earlier events are left alone."""
    ctx = _ctx(_Deferred())
    ctx.comm.all_reduce(torch.ones(4))
    before = list(ctx.timeline.events)
    with ctx.comm.batch():
        pass
    assert ctx.timeline.events == before


def test_a_failure_in_a_batch_is_reported_as_the_collective_that_failed():
    """last_op (what a failing rank's report names) is the failed collective, not the last issued."""
    ctx = _ctx(_Deferred(fail_first=True))
    with pytest.raises(CollectiveError, match="peer gone"):
        with ctx.comm.batch():
            ctx.comm.all_reduce(torch.ones(4))
            ctx.comm.all_reduce(torch.ones(2, 3))
    assert ctx.comm.last_op == "#0 all_reduce((4,), float32, op=sum)"
