"""A batch's collectives as one gloo call each kind, with every element summed as it was alone.

On 4 gloo processes sharing 2 cores one all-reduce costs about 4 ms however small it is (the
ranks' rendezvous, not the bytes): four units' all-reduces in flight together took 15–18 ms, one
all-reduce of the four concatenated 5.8 ms (spec/engine.md). DDP gets its speed the same way, from
one bucket. Concatenating naively would change the bits, though: gloo's ring sums element p of
an L-element buffer in an order that depends only on its *ring chunk*, ``p // K(L)``, and a
concatenation moves elements into other chunks.

So the fused buffer is laid out by ring chunk: row c holds chunk c of every buffer, one after
another, and the row length S is chosen so that gloo cuts the fused buffer (N·S elements) into
exactly those rows. Every element then has the same chunk — the same summation order — as in its
own all-reduce, so the result is bit for bit the one of separate calls (tests/engine/test_backend.py
checks this against separate calls, N = 3 and 4, single- and multi-segment buffers). The rule
``ring_chunk`` restates is gloo's ring algorithm (gloo/allreduce.cc, 1 MiB segments), not a
documented contract; the test is what says it still holds for the torch installed.

A reduce-scatter goes in as the all-reduce of its whole input, which is what gloo runs for it anyway
(same bits: ``test_gloo_reduce_scatter_is_the_slice_of_its_all_reduce``; same wire). All-gathers
have no arithmetic: their inputs are concatenated, the output cut back into each call's rows.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

MAX_SEGMENT_BYTES = 1 << 20   # gloo::AllreduceOptionsImpl::kMaxSegmentSize


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def ring_chunk(length: int, n: int, itemsize: int) -> int:
    """Elements per ring chunk when gloo's ring all-reduces ``length`` elements over ``n`` ranks:
    element p is summed in the order of chunk ``p // ring_chunk(...)`` (the last chunks may be
    short or empty). gloo cuts the buffer into ≥ 2 segments per rank of at most 1 MiB each."""
    nbytes = length * itemsize
    max_seg = itemsize * max(1, MAX_SEGMENT_BYTES // itemsize)
    segments = _round_up(max(-(-nbytes // max_seg), 2 * n), n)
    return -(-length // segments) * (segments // n)


def rows(lengths: list[int], n: int, itemsize: int) -> tuple[int, list[list[tuple[int, int, int]]]]:
    """The fused layout of buffers of ``lengths``: (row length S, for each buffer the pieces
    (start in the buffer, start in the fused buffer, length)), one piece per non-empty ring chunk."""
    fill = [0] * n
    pieces = []
    for length in lengths:
        k = ring_chunk(length, n, itemsize)
        mine = []
        for c in range(n):
            size = min(k, max(0, length - c * k))
            if size:
                mine.append((c * k, c, fill[c], size))
                fill[c] += size
        pieces.append(mine)
    s = max(fill)
    while ring_chunk(n * s, n, itemsize) != s:   # S must be a multiple of gloo's segments per rank
        s += 1
    return s, [[(a, c * s + off, size) for a, c, off, size in mine] for mine in pieces]


@dataclass
class Reductions:
    """Reductions (all-reduce, or reduce-scatter as the all-reduce gloo runs) waiting to go as one.

    Inputs are read when the group is sent and outputs written when it has arrived, both inside
    the batch: what :meth:`~zerospec.comm.interconnect.Interconnect.batch` asks of its callers."""

    n: int
    dtype: torch.dtype           # the accumulator's: every input is cast to it, as alone
    mean: bool                   # divide the sums by n (once, in the accumulator: same bits)
    parts: list = field(default_factory=list)   # (call, input, padded length, output, at)

    def add(self, call, inp: torch.Tensor, length: int, out: torch.Tensor, at: int) -> None:
        """``inp`` is reduced as a buffer of ``length`` elements (zero-padded); ``out`` gets the
        result's elements ``[at, at + out.numel())``."""
        call.sent_as = "" if self.parts else "all_reduce"
        self.parts.append((call, inp.reshape(-1), length, out.view(-1), at))

    def start(self, all_reduce):
        """Issue ``all_reduce(fused)`` (async); returns (work, finish)."""
        s, pieces = rows([p[2] for p in self.parts], self.n, self.dtype.itemsize)
        fused = torch.empty(self.n * s, dtype=self.dtype, device=self.parts[0][1].device)
        end = [c * s for c in range(self.n)]     # where each row's filled part ends
        for (_, inp, _, _, _), mine in zip(self.parts, pieces):
            for a, f, size in mine:
                got = max(0, min(size, inp.numel() - a))
                fused[f:f + got].copy_(inp[a:a + got])
                fused[f + got:f + size].zero_()      # past the input: the padding's zeros
                end[f // s] = f + size
        for c, e in enumerate(end):                  # the rows' tails: zeros, as padding
            fused[e:(c + 1) * s].zero_()
        work = all_reduce(fused)

        def finish():
            for (_, _, _, out, at), mine in zip(self.parts, pieces):
                for a, f, size in mine:
                    lo, hi = max(a, at), min(a + size, at + out.numel())
                    if lo >= hi:
                        continue
                    dst, src = out[lo - at:hi - at], fused[f + lo - a:f + hi - a]
                    if not self.mean:
                        dst.copy_(src)
                    elif dst.dtype == src.dtype:   # divided in the accumulator, rounded once
                        torch.div(src, self.n, out=dst)
                    else:                          # ... then cast, as alone
                        dst.copy_(src.div_(self.n))
        return work, finish


@dataclass
class Gathers:
    """All-gathers waiting to go as one: inputs concatenated, the output cut into each call's rows."""

    n: int
    dtype: torch.dtype
    parts: list = field(default_factory=list)   # (call, input, output)

    def add(self, call, inp: torch.Tensor, out: torch.Tensor) -> None:
        call.sent_as = "" if self.parts else "all_gather"
        self.parts.append((call, inp.reshape(-1), out))

    def start(self, all_gather):
        """Issue ``all_gather(output, input)`` (async) on the concatenations; (work, finish)."""
        inp = torch.cat([i for _, i, _ in self.parts])   # read now, before any output is written
        total = inp.numel()
        out = torch.empty(self.n * total, dtype=self.dtype, device=inp.device)
        work = all_gather(out, inp)

        def finish():
            grid = out.view(self.n, total)
            off = 0
            for _, i, o in self.parts:
                o.view(self.n, i.numel()).copy_(grid[:, off:off + i.numel()])
                off += i.numel()
        return work, finish
