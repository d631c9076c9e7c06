"""Simulated collectives: torch.distributed semantics, deterministic rank-order reductions."""
from __future__ import annotations

import torch
from hypothesis import given, settings, strategies as st

from zerospec import VirtualCluster
from zerospec.paper.theory import ring_factor

DTYPES = st.sampled_from([torch.float16, torch.bfloat16, torch.float32])


def _inputs(n, numel, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(numel, generator=g) * 100).to(dtype) for _ in range(n)]


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 9), chunk=st.integers(1, 40), dtype=DTYPES, seed=st.integers(0, 2**16),
       op=st.sampled_from(["sum", "mean"]))
def test_all_reduce_equals_reduce_scatter_then_all_gather_bit_for_bit(n, chunk, dtype, seed, op):
    """Rank-order reduction makes all_reduce == all_gather(reduce_scatter(x)) exactly (P1's root)."""
    xs = _inputs(n, n * chunk, dtype, seed)

    def fn(ctx):
        a = xs[ctx.rank].clone()
        ctx.comm.all_reduce(a, op)
        part = torch.empty(chunk, dtype=dtype)
        ctx.comm.reduce_scatter(part, xs[ctx.rank], op)
        b = torch.empty(n * chunk, dtype=dtype)
        ctx.comm.all_gather(b, part)
        return a, b
    for a, b in VirtualCluster(n).run(fn):
        assert torch.equal(a, b)


@settings(max_examples=15, deadline=None)
@given(n=st.integers(2, 8), numel=st.integers(1, 50), seed=st.integers(0, 2**16))
def test_reduction_does_not_depend_on_which_rank_holds_which_tensor_order(n, numel, seed):
    """Every rank gets the same bits, and a repeated run gets the same bits again."""
    xs = _inputs(n, numel, torch.float16, seed)

    def fn(ctx):
        return ctx.comm.all_reduce(xs[ctx.rank].clone(), "mean")
    first, second = VirtualCluster(n).run(fn), VirtualCluster(n).run(fn)
    assert all(torch.equal(first[0], t) for t in first + second)


def test_fp16_sum_is_accumulated_wider_than_fp16():
    """fp16 sums are accumulated in fp32 and rounded once, not rounded after every addition."""
    def fn(ctx):
        return ctx.comm.all_reduce(torch.tensor([2048.0 if ctx.rank == 0 else 1.0], dtype=torch.float16))
    # in fp16, 2048 + 1 rounds back to 2048 at every step (ulp is 2 there): a step-by-step fp16 sum
    # would give 2048; 2051 accumulated exactly rounds once to the nearest fp16, 2052
    assert [float(v) for v in VirtualCluster(4).run(fn)[0]] == [2052.0]


def test_all_gather_concatenates_in_rank_order_and_broadcast_copies_src():
    """all_gather output is rank 0's input, then rank 1's, …; broadcast gives everyone src's."""
    def fn(ctx):
        out = torch.empty(6)
        ctx.comm.all_gather(out, torch.full((2,), float(ctx.rank)))
        b = torch.full((3,), float(ctx.rank))
        ctx.comm.broadcast(b, src=2)
        return out.tolist(), b.tolist()
    for out, b in VirtualCluster(3).run(fn):
        assert out == [0, 0, 1, 1, 2, 2] and b == [2, 2, 2]


def test_in_place_all_gather_gives_every_rank_the_rank_order_concatenation():
    """An input that is its own rank's chunk of the output (stage 1's in-place gather) works."""
    def fn(ctx):
        out = torch.full((6,), -1.0)
        out[2 * ctx.rank:2 * ctx.rank + 2] = float(ctx.rank)
        ctx.comm.all_gather(out, out[2 * ctx.rank:2 * ctx.rank + 2])
        return out.tolist()
    assert VirtualCluster(3).run(fn) == [[0, 0, 1, 1, 2, 2]] * 3


def test_all_gather_reads_every_input_before_writing_when_ranks_share_a_tensor():
    """Rank 1's input lives in rank 0's output: it is read before rank 0's output is written."""
    shared = torch.tensor([10.0, 11.0, 20.0, 21.0])

    def fn(ctx):
        if ctx.rank == 0:
            return ctx.comm.all_gather(shared, shared[2:4].clone()).tolist()
        return ctx.comm.all_gather(torch.empty(4), shared[0:2]).tolist()
    assert VirtualCluster(2).run(fn) == [[20, 21, 10, 11]] * 2


def test_max_reduction():
    """all_reduce(max) — what an overflow vote needs — returns the elementwise maximum."""
    res = VirtualCluster(3).run(lambda ctx: ctx.comm.all_reduce(torch.tensor([ctx.rank, -ctx.rank]), "max"))
    assert res[0].tolist() == [2, 0]


def test_ledger_books_ring_model_elements_and_bytes_per_rank():
    """C21 (SC'20): RS and AG move (N−1)/N·S per rank, all-reduce twice that; fp16 bytes = 2×."""
    n, s = 4, 1024
    c = VirtualCluster(n)

    def fn(ctx):
        ctx.comm.all_reduce(torch.ones(s, dtype=torch.float16))
        ctx.comm.reduce_scatter(torch.empty(s // n, dtype=torch.float16), torch.ones(s, dtype=torch.float16))
        ctx.comm.all_gather(torch.empty(s, dtype=torch.float16), torch.ones(s // n, dtype=torch.float16))
    c.run(fn)
    per_op = c.comm_ledger.by_op(1)
    assert per_op == {"all_reduce": 2 * s * ring_factor(n), "reduce_scatter": s * ring_factor(n),
                      "all_gather": s * ring_factor(n)}
    assert c.comm_ledger.bytes(1) == 2 * c.comm_ledger.elements(1) == 2 * 4 * s * ring_factor(n)
    assert c.comm_ledger.count(1) == 3
