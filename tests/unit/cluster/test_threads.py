"""VirtualCluster: results in rank order, isolation, scale, and no hang on any failure path."""
from __future__ import annotations

import threading
import time

import pytest
import torch

from zerospec import ClusterAborted, CollectiveError, CollectiveTimeout, RankError, VirtualCluster
from tests.support.timeouts import ARRIVAL_SECONDS


def test_run_returns_each_ranks_result_in_rank_order():
    """run(fn) calls fn on every rank and returns the results indexed by rank."""
    assert VirtualCluster(5).run(lambda ctx, k: ctx.rank * k, 10) == [0, 10, 20, 30, 40]


def test_every_rank_sees_the_world_size_and_its_own_memory_ledger():
    """Each rank has its own device ledger; allocations on one rank do not show on another."""
    c = VirtualCluster(3)

    def fn(ctx):
        ctx.memory.alloc("buffer", (ctx.rank + 1,), torch.float32)
        return ctx.n_ranks
    assert c.run(fn) == [3, 3, 3]
    assert [m.current["buffer"] for m in c.memory] == [4, 8, 12]


def test_256_ranks_all_reduce():
    """The cluster scales to hundreds of ranks (the paper's tables go to N_d = 1024)."""
    c = VirtualCluster(256)

    def fn(ctx):
        t = torch.tensor([float(ctx.rank)])
        return float(ctx.comm.all_reduce(t)[0])
    assert set(c.run(fn)) == {sum(range(256))}


def test_two_clusters_in_one_process_do_not_interfere():
    """No module-level state: two clusters running at the same time keep their own rendezvous."""
    out = {}

    def drive(name, n, value):
        c = VirtualCluster(n)
        out[name] = c.run(lambda ctx: float(ctx.comm.all_reduce(torch.tensor([value]))[0]))

    threads = [threading.Thread(target=drive, args=("a", 3, 1.0)),
               threading.Thread(target=drive, args=("b", 4, 10.0))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert out == {"a": [3.0] * 3, "b": [40.0] * 4}


def test_a_rank_raising_aborts_the_cluster_and_names_rank_and_collective():
    """The first exception aborts every rank's pending collective; run re-raises it, chained."""
    c = VirtualCluster(4, timeout=30)    # a hang would show as a 30 s wait

    def fn(ctx):
        ctx.comm.all_reduce(torch.ones(2))
        with ctx.phase("backward"):
            if ctx.rank == 2:
                raise KeyError("boom")
            ctx.comm.all_gather(torch.empty(4), torch.ones(1))
    t0 = time.perf_counter()
    with pytest.raises(RankError, match=r"rank 2 failed in phase 'backward'.*#0 all_reduce.*boom") as ei:
        c.run(fn)
    assert time.perf_counter() - t0 < 10   # far below the 30 s timeout: aborted, not timed out
    assert isinstance(ei.value.__cause__, KeyError) and ei.value.rank == 2


def test_a_rank_that_never_arrives_times_out_naming_it():
    """A collective that waits longer than the timeout raises, naming the ranks that never came."""
    # The stuck rank is the last, so the others are inside the barrier when it sticks and every
    # timer that can fire names the same rank. (Stuck in the middle, it would keep the baton from
    # the ranks after it, whose wait for a first turn would race the barrier's timer.) The timeout
    # must exceed what a rank needs to reach the barrier and pass the baton (microseconds; a
    # loaded machine may not schedule it for tens of ms: tests/support/timeouts.py) and stay far
    # below the stuck rank's 30 s.
    c = VirtualCluster(3, timeout=ARRIVAL_SECONDS)
    stop = threading.Event()

    def fn(ctx):
        if ctx.rank == 2:
            stop.wait(30)     # stuck outside any collective, for far longer than the timeout
        ctx.comm.barrier()
    t0 = time.perf_counter()
    with pytest.raises(CollectiveTimeout, match=r"rank\(s\) \[2\] never arrived"):
        c.run(fn)
    stop.set()
    assert time.perf_counter() - t0 < 10   # the timeout fired; the stuck rank did not hold us


def test_a_rank_returning_while_others_wait_fails_instead_of_hanging():
    """A rank that skips a collective its peers entered is an error, not a deadlock."""
    c = VirtualCluster(3)

    def fn(ctx):
        if ctx.rank != 0:
            ctx.comm.all_reduce(torch.ones(1))
    with pytest.raises(CollectiveError, match=r"rank\(s\) \[0\] already returned|rank 0 returned"):
        c.run(fn)


@pytest.mark.parametrize("shapes,match", [
    ([(4,), (5,)], r"input shapes differ across ranks: rank 0 \(4,\), rank 1 \(5,\)"),
    ([(4,), (4, 1)], r"input shapes differ"),
])
def test_mismatched_shapes_are_an_error_naming_ranks_and_shapes(shapes, match):
    """Ranks that disagree about a collective's shape get a clear error, on every rank."""
    c = VirtualCluster(2)
    seen = []

    def fn(ctx):
        try:
            ctx.comm.all_reduce(torch.ones(shapes[ctx.rank]))
        except (CollectiveError, ClusterAborted) as exc:
            seen.append((ctx.rank, type(exc).__name__))
            raise
    with pytest.raises(CollectiveError, match=match):
        c.run(fn)
    assert sorted(seen) == [(0, "CollectiveError"), (1, "CollectiveError")]


def test_different_collectives_on_different_ranks_are_named():
    """Rank 0 calling all_reduce while rank 1 calls all_gather is reported with both calls."""
    def fn(ctx):
        if ctx.rank == 0:
            ctx.comm.all_reduce(torch.ones(2))
        else:
            ctx.comm.all_gather(torch.empty(2), torch.ones(1))
    with pytest.raises(CollectiveError, match=r"rank 0 all_reduce.*rank 1 all_gather"):
        VirtualCluster(2).run(fn)


def test_reduce_scatter_input_must_be_n_times_output():
    """reduce_scatter of a tensor that does not split into N equal chunks is refused clearly."""
    def fn(ctx):
        ctx.comm.reduce_scatter(torch.empty(2), torch.ones(5))
    with pytest.raises(CollectiveError, match=r"input of 5 elements \(5,\) must be 2 × its output of 2"):
        VirtualCluster(2).run(fn)


def test_unknown_reduce_op_is_refused_with_the_accepted_list():
    """An unknown reduction names itself and the accepted ones."""
    with pytest.raises(RankError, match=r"unknown reduce op 'avg'; accepted: sum, mean, max"):
        VirtualCluster(2).run(lambda ctx: ctx.comm.all_reduce(torch.ones(1), "avg"))


@pytest.mark.parametrize("bad", [0, -1, 2.5])
def test_cluster_size_must_be_a_positive_integer(bad):
    """N < 1 (or not an integer) is refused with the accepted range."""
    with pytest.raises(ValueError, match=r"n_ranks must be an integer >= 1"):
        VirtualCluster(bad)


def test_phases_label_collectives_and_snapshot_memory():
    """Collectives are booked under the phase they run in; each phase end snapshots memory."""
    c = VirtualCluster(2)

    def fn(ctx):
        with ctx.phase("forward"):
            ctx.memory.alloc("buffer", (8,), torch.float16)
            ctx.comm.all_reduce(torch.ones(4, dtype=torch.float16))
    c.run(fn)
    assert [r.phase for r in c.comm_ledger.records(0)] == ["forward"]
    assert c.memory[1].snapshots[-1].label == "forward@0"
    assert c.memory[1].snapshots[-1].current["buffer"] == 16
