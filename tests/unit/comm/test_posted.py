"""Posted reduce-scatters (zerospec/comm/posted.py): the blocking call's bits, the rank goes on at
once, its input is free on return, and every failure is named instead of hanging."""
from __future__ import annotations

import threading
import time

import pytest
import torch

from zerospec import CollectiveError, CollectiveTimeout, VirtualCluster
from zerospec.training.config import TrainConfig
from zerospec.training.run import train
from tests.support.timeouts import ARRIVAL_SECONDS

N, CALLS = 4, 3


def _inputs(rank: int) -> list[torch.Tensor]:
    """Rank ``rank``'s inputs: fp16 as stage 2's, and fp32 of magnitudes 1 to 1e12 (rising and
    falling with the rank), whose fp32 sum depends on the order it is taken in."""
    g = torch.Generator().manual_seed(rank)
    return [(torch.randn(N * 5, generator=g) * scale).to(dtype) for scale, dtype in
            ((10 ** (rank % 3), torch.float16), (10 ** (3 * rank), torch.float32),
             (10 ** (3 * (N - rank)), torch.float32))]


def _reduce(post: bool, jitter: int | None = None, op: str = "mean") -> list[list[torch.Tensor]]:
    def fn(ctx):
        inputs = _inputs(ctx.rank)
        outs = [torch.empty(5, dtype=t.dtype) for t in inputs]
        for out, inp in zip(outs, inputs):
            ctx.comm.reduce_scatter(out, inp, op, post=post)
        if post:
            ctx.comm.wait()
        return outs
    return VirtualCluster(N, jitter=jitter).run(fn)


@pytest.mark.parametrize("op", ["mean", "sum", "max"])
@pytest.mark.parametrize("jitter", [None, 0, 1, 2], ids=lambda j: "rank order" if j is None else f"jitter{j}")
def test_a_posted_reduce_scatter_gives_the_blocking_calls_bits(jitter, op):
    """Posted in any order of arrival (the jittered baton), the outputs equal the blocking call's."""
    blocking, posted = _reduce(post=False, op=op), _reduce(post=True, jitter=jitter, op=op)
    assert all(torch.equal(a, b) for ra, rb in zip(blocking, posted) for a, b in zip(ra, rb))


def test_the_jitter_posts_out_of_rank_order():
    """The jittered cases above are not vacuous: some rank posts before a lower rank has."""
    order = []

    def fn(ctx):
        ctx.comm.reduce_scatter(torch.empty(1), torch.ones(N), post=True)
        order.append(ctx.rank)
        ctx.comm.wait()
    VirtualCluster(N, jitter=1).run(fn)
    assert order != sorted(order)


def test_a_rank_goes_on_after_posting_and_waits_only_in_wait():
    """Rank 0 posts all its calls before rank 1 runs; no output is written before the last post."""
    events = []

    def fn(ctx):
        out = torch.zeros(1)
        for k in range(CALLS):
            ctx.comm.reduce_scatter(out, torch.ones(N), post=True)
            events.append((ctx.rank, k, float(out[0])))
        ctx.comm.wait()
        events.append((ctx.rank, "done", float(out[0])))
    VirtualCluster(N).run(fn)
    posts = [e for e in events if e[1] != "done"]
    assert posts[:CALLS] == [(0, k, 0.0) for k in range(CALLS)]        # rank 0 did not stop
    assert all(out == 0.0 for rank, _, out in posts if rank < N - 1)     # nothing written early
    assert events.index((0, "done", float(N))) > events.index((N - 1, CALLS - 1, float(N)))


def test_the_input_is_read_when_posted_and_may_be_overwritten_at_once():
    """After a posted call returns, writing into its input changes nothing: it was read already."""
    def fn(ctx, clobber):
        inp, out = torch.full((N,), float(ctx.rank + 1)), torch.empty(1)
        ctx.comm.reduce_scatter(out, inp, post=True)
        if clobber:
            inp.fill_(1e4)
        ctx.comm.wait()
        return float(out[0])
    expected = float(sum(range(1, N + 1)))
    for jitter in (None, 1):
        assert VirtualCluster(N, jitter=jitter).run(fn, True) == [expected] * N


@pytest.mark.parametrize("stage", [2, 3])
def test_stages_2_and_3_post_and_stay_bit_identical_to_blocking_reduce_scatters(monkeypatch, stage):
    """Stages 2 and 3 post their reduce-scatters (none blocks in backward) and train to the same bits."""
    from zerospec.comm import sim

    calls = {"post": 0}
    post = sim.SimBackend.post

    def counting(self, rank, call):
        calls["post"] += 1
        post(self, rank, call)
    cfg = TrainConfig(stage=stage, n_d=N, steps=2)
    monkeypatch.setattr(sim.SimBackend, "post", counting)
    posted = train(cfg)
    assert calls["post"] == N * cfg.steps * len(cfg.units())
    monkeypatch.setattr(sim.SimBackend, "post", lambda self, rank, call: self.collective(rank, call))
    blocking = train(cfg)
    assert all(torch.equal(posted.master[k], blocking.master[k]) for k in posted.master)
    assert posted.comm.records() == blocking.comm.records()


def test_ranks_posting_different_shapes_are_named():
    """Ranks whose posted calls differ get an error naming both calls."""
    def fn(ctx):
        ctx.comm.reduce_scatter(torch.empty(1 + ctx.rank), torch.ones(N * (1 + ctx.rank)), post=True)
        ctx.comm.wait()
    with pytest.raises(CollectiveError, match=r"ranks posted different collectives: rank 0 .*\(4,\).*"
                                              r"rank 1 .*\(8,\)"):
        VirtualCluster(N).run(fn)


def test_a_rank_returning_without_posting_fails_naming_it():
    """A rank that skips a call its peers posted is an error naming it, not a deadlock."""
    def fn(ctx):
        if ctx.rank != 2:
            ctx.comm.reduce_scatter(torch.empty(1), torch.ones(N), post=True)
            ctx.comm.wait()
    with pytest.raises(CollectiveError, match=r"rank 2 returned without posting"):
        VirtualCluster(N, timeout=30).run(fn)
    # jittered so that rank 2 returns before rank 1 (seed 5) and rank 3 (seed 7) post: the post
    # that finds it gone names it
    for seed, poster in ((5, 1), (7, 3)):
        with pytest.raises(CollectiveError, match=rf"rank {poster} posted .* but rank\(s\) \[2\] "
                                                  r"returned without posting it"):
            VirtualCluster(N, timeout=30, jitter=seed).run(fn)


def test_a_rank_returning_without_wait_fails_naming_it():
    """Posting and returning without wait() is an error: the outputs may not have been written."""
    def fn(ctx):
        ctx.comm.reduce_scatter(torch.empty(1), torch.ones(N), post=True)
        if ctx.rank != 1:
            ctx.comm.wait()
    with pytest.raises(CollectiveError, match=r"rank 1 returned without wait\(\) after posting 1"):
        VirtualCluster(N, timeout=30).run(fn)


def test_a_rank_resuming_after_an_abort_stops_at_its_next_post():
    """A rank that was busy when the cluster aborted (here: stuck past the timeout) stops at its
    first post, as it would at a blocking call, instead of running on as a stray thread."""
    c = VirtualCluster(3, timeout=ARRIVAL_SECONDS)
    stop, posts, stuck = threading.Event(), [], []

    def fn(ctx):
        if ctx.rank == 2:
            stuck.append(threading.current_thread())
            stop.wait(30)           # busy outside any collective while the others time out
        for k in range(CALLS):
            ctx.comm.reduce_scatter(torch.empty(1), torch.ones(3), post=True)
            posts.append((ctx.rank, k))
        ctx.comm.wait()
    with pytest.raises(CollectiveTimeout):
        c.run(fn)
    stop.set()
    stuck[0].join(30)               # rank 2 resumes, stops at its first post, and its thread ends
    assert not stuck[0].is_alive() and [p for p in posts if p[0] == 2] == []


def test_a_rank_that_never_posts_times_out_naming_it():
    """A wait longer than the timeout raises, naming the rank that never posted."""
    c = VirtualCluster(3, timeout=ARRIVAL_SECONDS)
    stop = threading.Event()

    def fn(ctx):
        if ctx.rank == 2:
            stop.wait(30)       # stuck before posting, far longer than the timeout
        ctx.comm.reduce_scatter(torch.empty(1), torch.ones(3), post=True)
        ctx.comm.wait()
    t0 = time.perf_counter()
    with pytest.raises(CollectiveTimeout, match=r"rank\(s\) \[2\] never posted"):
        c.run(fn)
    stop.set()
    assert time.perf_counter() - t0 < 10


def test_the_ring_transport_and_other_ops_run_posted_calls_at_once():
    """With the ring transport (which needs every rank there) a posted call blocks, same result."""
    def fn(ctx):
        out = torch.empty(1)
        ctx.comm.reduce_scatter(out, torch.full((N,), 1.0 + ctx.rank), post=True)
        written = float(out[0])          # already: the call completed before returning
        ctx.comm.wait()
        return written
    assert VirtualCluster(N, transport="ring").run(fn) == [float(sum(range(1, N + 1)))] * N


def test_an_output_inside_its_input_is_not_posted():
    """Stage 1's in-place form (output inside input) completes at once: nothing writes into the
    input after the caller let go of it."""
    def fn(ctx):
        buf = torch.full((N,), 1.0 + ctx.rank)
        ctx.comm.reduce_scatter(buf[ctx.rank:ctx.rank + 1], buf, post=True)
        written = float(buf[ctx.rank])
        ctx.comm.wait()
        return written
    assert VirtualCluster(N).run(fn) == [float(sum(range(1, N + 1)))] * N


def test_the_last_poster_records_every_ranks_share_of_the_time():
    """The timeline's reduce-scatter events: the last poster's holds the sum of all ranks' shares,
    so the replay, which takes a collective's longest event, sees all of its data movement."""
    c = VirtualCluster(N)

    def fn(ctx):
        ctx.comm.reduce_scatter(torch.empty(1 << 14), torch.ones(N << 14), post=True)
        ctx.comm.wait()
    c.run(fn)
    secs = [next(e[3] for e in ctx.timeline.events if e[2] == "reduce_scatter") for ctx in c.contexts]
    assert secs[-1] == max(secs) and secs[-1] > sum(secs[:-1])