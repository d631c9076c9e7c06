"""Ring transport: collectives as neighbour-to-neighbour transfers, every one counted on its link.

The ledger (:mod:`.ledger`) books what the ring *model* says each rank sends. This transport is the
observation: it really passes chunks around the ring — rank r sends only to r+1 mod N — and a
:class:`Wire` counts the elements and bytes on each directed link (src, dst), collective by
collective, so a test can compare every link with the ledger's booking (design property 1).

Schedules, with the chunks of an all-reduce near-equal (``ledger.chunk_size``: the first S mod N one
element larger) and those of a reduce-scatter or all-gather equal (the interconnect checks N | S):

* reduce-scatter: N−1 steps; at step s rank r sends chunk (r−s−1) mod N to r+1, which reduces it
  into its own copy of that chunk. After the last step rank r holds chunk r fully reduced — the
  chunk torch.distributed semantics give it. Rank r sent every chunk but its own.
* all-gather: N−1 steps; at step s rank r sends chunk (r−s) mod N to r+1, which stores it.
  Rank r sent every chunk but its successor's.
* all-reduce: the two in sequence (SC'20 §VII-B), on one buffer; so rank r sends 2S − |c_r| − |c_r+1|.
* broadcast: a chain src → src+1 → … → src−1, each hop the whole tensor (pipelining it in pieces
  moves the same bytes per link).
* barrier: a rendezvous with no payload; booked as a collective with no bytes on any link.

Arithmetic: what travels is the tensor's dtype (bytes = elements × itemsize, as the ledger counts),
so every hop of a reduction rounds once to that dtype, and each chunk is summed in ring order
c+1, c+2, …, c — not the default transport's rank order. Results therefore differ from the
default by rounding, except where sums are exact (fp64 sums of fp16 values, ``exact_grads``;
``max``; integers). ``mean`` divides once, at the chunk's owner, before the all-gather.
"""
from __future__ import annotations

import dataclasses
import itertools
from collections import Counter

import torch

from .checks import accumulator_dtype
from .groups import Nodes
from .interconnect import Call
from .ledger import chunk_size


@dataclasses.dataclass
class WireRecord:
    """One collective as the links saw it: elements and bytes per directed link (src, dst)."""

    op: str
    dtype: torch.dtype | None
    numel: int                                   # logical size S, as the ledger books it
    elements: Counter = dataclasses.field(default_factory=Counter)
    bytes: Counter = dataclasses.field(default_factory=Counter)
    steps: int = 0                               # neighbour-to-neighbour rounds taken


class Wire:
    """The per-link counter: one :class:`WireRecord` per collective, in issue order (so record k
    is every rank's k-th ledger record). Owned by the cluster: it outlives one ``run``."""

    def __init__(self, n_ranks: int, gpus_per_node: int | None = None):
        self.n_ranks = n_ranks
        self.nodes = Nodes(n_ranks, gpus_per_node)   # which hops leave a node (spec/nodes.md)
        self.records: list[WireRecord] = []

    def by_link(self, records=None) -> Counter:
        """Elements carried per link class ("intra", "inter") over ``records`` (default: all), each
        directed hop classed by the nodes of its two ends."""
        out: Counter = Counter()
        for rec in self.records if records is None else records:
            for (src, dst), e in rec.elements.items():
                out[self.nodes.link(src, dst)] += e
        return out

    def leaving(self, node: int, records=None, *, bytes: bool = False) -> int:
        """Elements (``bytes``: bytes) that left ``node`` over ``records`` (default: all): its hops
        to other nodes."""
        return sum(e for rec in (self.records if records is None else records)
                   for (src, dst), e in (rec.bytes if bytes else rec.elements).items()
                   if self.nodes.node(src) == node != self.nodes.node(dst))

    def open(self, op: str, dtype, numel: int) -> WireRecord:
        rec = WireRecord(op, dtype, numel)
        self.records.append(rec)
        return rec

    def carry(self, rec: WireRecord, src: int, dst: int, msg: torch.Tensor,
              ring: tuple[int, ...] | None = None) -> torch.Tensor:
        """Move ``msg`` from global rank ``src`` to ``dst``, neighbours on ``ring`` (default: all
        ranks in order): count it on the link, hand the receiver a copy."""
        ring = ring or tuple(range(self.n_ranks))
        if dst != ring[(ring.index(src) + 1) % len(ring)]:
            raise AssertionError(f"ring link {src}->{dst} is not a neighbour link")  # a schedule bug
        rec.elements[(src, dst)] += msg.numel()
        rec.bytes[(src, dst)] += msg.numel() * msg.element_size()
        return msg.clone()


    def send(self, rec: WireRecord, src: int, dst: int, msg: torch.Tensor) -> torch.Tensor:
        """Move ``msg`` from global rank ``src`` straight to ``dst`` (an all-to-all's
        point-to-point send, no ring): count it on that link, hand the receiver a copy."""
        rec.elements[(src, dst)] += msg.numel()
        rec.bytes[(src, dst)] += msg.numel() * msg.element_size()
        return msg.clone()


class RingTransport:
    """Moves the data of one complete collective (every rank's :class:`Call`) around the ring."""

    def __init__(self, wire: Wire):
        self.wire = wire
        self.n = wire.n_ranks
        self.ring = tuple(range(self.n))

    def move(self, calls: list[Call], members: tuple[int, ...] | None = None) -> None:
        """One collective over ``members`` (global ranks in ring order; default: every rank);
        ``calls[k]`` is ``members[k]``'s side. Within the group, position k plays rank k."""
        self.ring = tuple(members) if members is not None else tuple(range(self.wire.n_ranks))
        self.n = len(self.ring)
        op, inp = calls[0].op, calls[0].inp
        if op == "barrier":                          # a rendezvous: no payload on any link
            self.wire.open(op, None, 0)
            return
        numel = calls[0].out.numel() if op == "all_gather" else inp.numel()   # S, as booked
        rec = self.wire.open(op, inp.dtype, numel)
        if op == "broadcast":
            self._broadcast(rec, calls)
            return
        if op == "all_to_all":
            self._all_to_all(rec, calls)
            return
        # every rank works on its own copy (its GPU's memory), so all inputs are read before any
        # output, which may alias an input, is written
        chunks = self._chunks(numel)
        if op == "all_gather":
            bufs = [torch.empty(numel, dtype=inp.dtype, device=inp.device) for _ in calls]
            for r, c in enumerate(calls):
                bufs[r][chunks[r]] = c.inp.reshape(-1)
        else:
            bufs = [c.inp.reshape(-1).clone() for c in calls]
            self._reduce_scatter(rec, bufs, chunks, calls[0].reduce_op)
        if op == "reduce_scatter":
            for r, c in enumerate(calls):
                c.out.view(-1).copy_(bufs[r][chunks[r]])
            return
        self._all_gather(rec, bufs, chunks)
        for c, b in zip(calls, bufs):
            c.out.view(-1).copy_(b)

    def _carry(self, rec: WireRecord, k: int, msg: torch.Tensor) -> torch.Tensor:
        """Position k of the ring sends ``msg`` to position k+1 (the wire counts global ranks)."""
        ring = self.ring
        return self.wire.carry(rec, ring[k], ring[(k + 1) % self.n], msg, ring)

    def _chunks(self, numel: int) -> list[slice]:
        """Chunk k of S, near-equal as the ledger splits it (equal when N divides S, as the
        interconnect requires of a reduce-scatter or all-gather)."""
        ends = list(itertools.accumulate((chunk_size(numel, self.n, k) for k in range(self.n)), initial=0))
        return [slice(a, b) for a, b in zip(ends, ends[1:])]

    def _reduce_scatter(self, rec: WireRecord, bufs, chunks, reduce_op: str) -> None:
        """N−1 steps; afterwards ``bufs[r][chunks[r]]`` is chunk r reduced over every rank."""
        n = self.n
        for s in range(n - 1):
            # every rank sends at once: take all messages before any receiver reduces
            sends = [(r, (r - s - 1) % n) for r in range(n)]
            msgs = [self._carry(rec, r, bufs[r][chunks[k]]) for r, k in sends]
            last = s == n - 2
            for (r, k), msg in zip(sends, msgs):
                mine = bufs[(r + 1) % n][chunks[k]]
                if reduce_op == "max":
                    torch.maximum(mine, msg, out=mine)
                elif last and reduce_op == "mean":     # the owner: sum and divide, one rounding
                    mine.copy_(mine.to(accumulator_dtype(mine.dtype)).add_(msg).div_(n))
                else:
                    mine.add_(msg)                     # rounded to the wire's dtype at every hop
        rec.steps += n - 1

    def _all_gather(self, rec: WireRecord, bufs, chunks) -> None:
        """N−1 steps; rank r starts holding chunk r and ends holding every chunk."""
        n = self.n
        for s in range(n - 1):
            sends = [(r, (r - s) % n) for r in range(n)]
            msgs = [self._carry(rec, r, bufs[r][chunks[k]]) for r, k in sends]
            for (r, k), msg in zip(sends, msgs):
                bufs[(r + 1) % n][chunks[k]] = msg
        rec.steps += n - 1

    def _all_to_all(self, rec: WireRecord, calls: list[Call]) -> None:
        """Position k sends its piece j straight to position j (a rank keeps its own piece)."""
        n, ring = self.n, self.ring
        pieces = [c.inp.reshape(n, -1) for c in calls]
        got = [[p[r].clone() if k == r else self.wire.send(rec, ring[k], ring[r], p[r])
                for k, p in enumerate(pieces)] for r in range(n)]   # every send before any write
        for c, mine in zip(calls, got):
            c.out.view(n, -1).copy_(torch.stack(mine))
        rec.steps += 1

    def _broadcast(self, rec: WireRecord, calls: list[Call]) -> None:
        src = calls[0].src
        msg = calls[src].inp.reshape(-1)
        for hop in range(self.n - 1):
            r = (src + hop) % self.n
            msg = self._carry(rec, r, msg)
            calls[(r + 1) % self.n].out.view(-1).copy_(msg)
        rec.steps += self.n - 1
