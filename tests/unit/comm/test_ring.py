"""The ring transport: torch.distributed semantics by neighbour-to-neighbour chunks, every transfer
counted on its link; results equal the default transport's wherever sums are exact."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

from zerospec import VirtualCluster

U16, U32 = 2.0 ** -11, 2.0 ** -24   # unit roundoff of fp16 and fp32
FP16_SUBNORMAL_HALF_ULP = 2.0 ** -25


def _ints(n, numel, dtype, seed):
    """Small integers: every partial sum is exact in any dtype, so summation order cannot show."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(-8, 9, (numel,), generator=g).to(dtype) for _ in range(n)]


def _collectives(xs, chunk, op):
    """Every collective, in the aliasing forms stage code uses (in place; output inside input;
    input inside output)."""
    def fn(ctx):
        n, r, x = ctx.n_ranks, ctx.rank, xs[ctx.rank]
        ar = ctx.comm.all_reduce(x.clone(), op)                    # in place; N·chunk + 1: uneven
        even = ctx.comm.all_reduce(x[: n * chunk].clone(), op)
        g = x[: n * chunk].clone()
        ctx.comm.reduce_scatter(g[r * chunk:(r + 1) * chunk], g, op)   # output is a slice of input
        rs = g[r * chunk:(r + 1) * chunk].clone()
        full = torch.zeros(n * chunk, dtype=x.dtype)
        full[r * chunk:(r + 1) * chunk] = x[:chunk]
        ag = ctx.comm.all_gather(full, full[r * chunk:(r + 1) * chunk])   # input is a slice of output
        bc = ctx.comm.broadcast(x.clone(), src=n - 1)
        ctx.comm.barrier()
        return ar, even, rs, ag, bc
    return fn


@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 7), chunk=st.integers(1, 6), dtype=st.sampled_from([torch.float16, torch.float64]),
       op=st.sampled_from(["sum", "mean", "max"]), seed=st.integers(0, 2 ** 16))
def test_ring_collectives_equal_the_direct_ones_when_sums_are_exact(n, chunk, dtype, op, seed):
    """All-reduce (even and uneven chunks), reduce-scatter, all-gather and broadcast give the
    default transport's bits when no partial sum rounds: only the route differs."""
    xs = _ints(n, n * chunk + 1, dtype, seed)
    ring, direct = (VirtualCluster(n, transport=t).run(_collectives(xs, chunk, op))
                    for t in ("ring", "direct"))
    for a, b in zip(ring, direct):
        assert all(torch.equal(x, y) for x, y in zip(a, b))


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 9), numel=st.integers(0, 40))
def test_every_all_reduce_size_puts_on_each_link_what_the_ledger_books(n, numel):
    """Any S, divisible by N or not: link r → r+1 carries rank r's booked send and rank r+1's
    booked receive (both 2S − |c_r| − |c_r+1|), in elements and bytes."""
    c = VirtualCluster(n, transport="ring")
    c.run(lambda ctx: ctx.comm.all_reduce(torch.ones(numel, dtype=torch.float16)))
    (w,) = c.wire.records
    for r in range(n):
        link, mine, nxt = (r, (r + 1) % n), c.comm_ledger.records(r)[0], c.comm_ledger.records((r + 1) % n)[0]
        assert w.elements[link] == mine.elements_sent == nxt.elements_recv
        assert w.bytes[link] == mine.bytes_sent == nxt.bytes_recv


@pytest.mark.parametrize("n,numel", [(4, 3), (5, 1), (3, 0)])
def test_an_all_reduce_smaller_than_the_ring_sends_only_its_nonempty_chunks(n, numel):
    """S < N (a scalar flag): chunks of 0 elements move nothing; every rank still gets the max."""
    c = VirtualCluster(n, transport="ring")
    out = c.run(lambda ctx: ctx.comm.all_reduce(torch.full((numel,), float(ctx.rank)), "max"))
    assert all(torch.equal(t, torch.full((numel,), float(n - 1))) for t in out)
    (w,) = c.wire.records
    assert sum(w.elements.values()) == 2 * (n - 1) * numel
    assert [w.elements[(r, (r + 1) % n)] for r in range(n)] == \
        [c.comm_ledger.records(r)[0].elements_sent for r in range(n)]


def test_broadcast_is_a_chain_and_a_barrier_moves_nothing():
    """Broadcast from src: every link but the one into src carries S once; a barrier is a
    collective with no payload on any link."""
    n, s, src = 4, 5, 2
    c = VirtualCluster(n, transport="ring")

    def fn(ctx):
        ctx.comm.barrier()
        return ctx.comm.broadcast(torch.full((s,), float(ctx.rank), dtype=torch.float16), src=src)
    assert all(torch.equal(t, torch.full((s,), float(src), dtype=torch.float16)) for t in c.run(fn))
    barrier, bcast = c.wire.records
    assert (barrier.op, sum(barrier.elements.values()), barrier.steps) == ("barrier", 0, 0)
    assert {k: v for k, v in bcast.elements.items() if v} == {(2, 3): s, (3, 0): s, (0, 1): s}
    assert bcast.bytes[(2, 3)] == 2 * s and bcast.steps == n - 1


def test_the_wire_outlives_one_run_and_lines_up_with_the_ledger():
    """Two runs on one cluster append to one wire, record k beside every rank's k-th ledger entry."""
    c = VirtualCluster(3, transport="ring")
    for _ in range(2):
        c.run(lambda ctx: ctx.comm.all_reduce(torch.ones(6)))
    assert [w.op for w in c.wire.records] == [r.op for r in c.comm_ledger.records(0)] == ["all_reduce"] * 2


def test_an_unknown_transport_is_refused_naming_the_accepted_ones():
    """A typo in the transport is an error listing what is accepted."""
    with pytest.raises(ValueError, match="unknown transport 'rng'; accepted: direct, ring"):
        VirtualCluster(2, transport="rng")
    assert VirtualCluster(2).wire is None   # the default moves data directly and counts no links


@pytest.mark.parametrize("n", [2, 5, 8])
def test_fp16_mean_in_ring_order_stays_within_the_derived_rounding_bound(n):
    """Ring order rounds every hop to fp16: within γ(N−2)·Σ|x|/N of the exact mean, plus the final
    divisions and roundings; the default's rank-order fp32 sum within γ32(N−1)·Σ|x|/N plus one
    fp16 rounding (standard recursive-summation bounds, γ_k = k·u/(1 − k·u))."""
    g = torch.Generator().manual_seed(n)
    xs = [torch.randn(997, generator=g).to(torch.float16) for _ in range(n)]
    exact = torch.stack([x.double() for x in xs]).sum(0) / n
    total = torch.stack([x.double().abs() for x in xs]).sum(0)   # Σ_r |x_r| per element

    def gamma(k, u):
        return k * u / (1 - k * u)

    def run(transport):
        return VirtualCluster(n, transport=transport).run(
            lambda ctx: ctx.comm.all_reduce(xs[ctx.rank].clone(), "mean"))[0].double()
    ring, direct = run("ring"), run("direct")
    # ring: N−2 fp16 hops, then (partial + own) and /N in fp32, then one rounding to fp16
    hops = gamma(n - 2, U16) + (2 * U32 + U32 ** 2) * (1 + gamma(n - 2, U16))
    ring_bound = (1 + U16) * hops * total / n + U16 * exact.abs() + FP16_SUBNORMAL_HALF_ULP
    # direct: N−1 fp32 additions and the division, then one rounding to fp16
    direct_bound = (1 + U16) * gamma(n, U32) * total / n + U16 * exact.abs() + FP16_SUBNORMAL_HALF_ULP
    assert ((ring - exact).abs() <= ring_bound).all()
    assert ((direct - exact).abs() <= direct_bound).all()
    if n > 2:   # with fp16 hops the two routes really differ (N = 2 has no intermediate hop)
        assert not torch.equal(ring, direct)
