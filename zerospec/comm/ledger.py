"""The ONE place where communication is counted (design property 1).

Every collective issued through :class:`~zerospec.comm.interconnect.Interconnect` is booked here,
per rank, with the op, dtype, logical size, the elements and bytes that rank sends and receives
under a named algorithm model, and the phase and step it happened in. Backends only move data.

The paper counts volume in *elements* (C20); with fp16 tensors bytes = 2 × elements.

Ring model (C21, SC'20 form): a reduce-scatter or all-gather over S elements moves (N−1)/N·S per
rank; an all-reduce is a reduce-scatter followed by an all-gather, 2(N−1)/N·S. For an all-reduce
of a size S that does not divide by N, the ring splits S into N near-equal chunks c_0 … c_N−1 (the
first S mod N one element larger). Rank r sends to r+1 only: in the reduce-scatter every chunk but
its own (it ends owning c_r), in the all-gather every chunk but its successor's, so it sends
2S − |c_r| − |c_r+1| and receives 2S − |c_r−1| − |c_r| — what the ring transport (ring.py) measures
on each link. Summed over the ranks this is exactly 2(N−1)·S, so the per-rank mean is exactly
2(N−1)/N·S; with uneven chunks no unidirectional ring gives every rank the same share.

Links (spec/nodes.md): rank r sends only to its ring successor, so each record's sends take one
link, booked as ``link``: ``"intra"`` when the successor sits on r's node, ``"inter"`` when the hop
leaves it (:class:`~.groups.Nodes`: rank r on node r // G), ``"host"`` for the rank's own PCIe
copies (device→host sent, host→device received), ``"nvme"`` for its host's swap-file writes (sent)
and reads (received). ``elements(r, link="inter")`` is r's cross-node volume; :meth:`CommLedger.crossing` a
node's (what all its GPUs send over links that leave it).
"""
from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict
from fractions import Fraction

import torch

from .groups import Nodes

OPS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "barrier", "all_to_all")
HOST_OPS = ("to_host", "from_host",   # a rank's own device<->host copies (P_a+cpu, offload): "host"
            "to_nvme", "from_nvme")  # its host<->NVMe swap-file writes and reads: group "nvme"
# one way, not a ring: a copy away from the device (to_host) or from the host (to_nvme) is sent,
# its way back received


@dataclasses.dataclass(frozen=True)
class CommRecord:
    """One collective as one rank saw it."""

    rank: int
    seq: int                # position in this rank's collective sequence
    op: str
    dtype: torch.dtype | None
    numel: int              # logical size S of the collective (the full, unsharded tensor)
    elements_sent: int
    elements_recv: int
    bytes_sent: int
    bytes_recv: int
    phase: str
    step: int
    wire_elements_sent: int  # the backend's transport of it (the ring model × wire_factor: gloo's
                             # RS sends 2×); padding of a fused batch is not counted
    group: str = "world"     # "world", or the grid's "dp"/"mp" group, or "host" (comm/groups.py)
    group_size: int = 0      # ranks in the ring (the N of the ring model)
    sent_as: str = ""        # the transport call that carried it: ``op`` when sent alone; "" when
                             # it went inside an earlier one's (a batch fused on gloo, coalesce.py)
    link: str = "intra"      # the link its sends take: "intra", "inter" (leaves the node), "host"


def chunk_size(numel: int, n: int, rank: int) -> int:
    """Rank ``rank``'s chunk in the near-equal split of ``numel`` into ``n`` chunks, the first
    ``numel % n`` of them one larger."""
    base, extra = divmod(numel, n)
    return base + (1 if rank < extra else 0)


def ring_elements(op: str, numel: int, n: int, rank: int, src: int = 0) -> tuple[int, int]:
    """(sent, received) elements for ``rank`` under the ring model; ``numel`` is the full size S."""
    if op in ("to_host", "to_nvme"):     # over the rank's own link, not a ring: all of it, one way
        return numel, 0
    if op in ("from_host", "from_nvme"):
        return 0, numel
    if n == 1 or op == "barrier":
        return 0, 0
    if op == "all_reduce":
        prev, own, succ = (chunk_size(numel, n, k % n) for k in (rank - 1, rank, rank + 1))
        return 2 * numel - own - succ, 2 * numel - prev - own
    if op in ("reduce_scatter", "all_gather", "all_to_all"):
        # all_to_all (qgZ, zero/zeropp.py): S is each rank's input, n pieces, one to every rank
        # straight (no ring): a rank keeps its own piece and sends the other n−1
        if numel % n:
            raise ValueError(f"{op} of {numel} elements does not split over {n} ranks")
        moved = (n - 1) * (numel // n)
        return moved, moved
    if op == "broadcast":
        # pipelined chain src -> src+1 -> ... : every rank but the last forwards S, all but src receive S
        last = (src - 1) % n
        return (0 if rank == last else numel), (0 if rank == src else numel)
    raise ValueError(f"unknown collective {op!r}; accepted: {', '.join(OPS + HOST_OPS)}")


class CommLedger:
    """Per-rank lists of :class:`CommRecord`; each rank appends only to its own list (thread-safe)."""

    def __init__(self, n_ranks: int, gpus_per_node: int | None = None):
        self.n_ranks = n_ranks
        self.nodes = Nodes(n_ranks, gpus_per_node)   # which node each rank sits on
        self._records: list[list[CommRecord]] = [[] for _ in range(n_ranks)]

    def book(self, rank: int, op: str, dtype, numel: int, phase: str, step: int,
             *, src: int = 0, wire_factor: int = 1, group: str = "world", n: int | None = None,
             index: int | None = None, sent_as: str | None = None,
             peer: int | None = None) -> CommRecord:
        """Book ``rank``'s side of a collective over a ring of ``n`` ranks (default: all) in which
        it sits at ``index`` (default: ``rank``); ``group`` names the ring (comm/groups.py);
        ``sent_as``: the transport call it went as (default: ``op``; "": inside an earlier one's);
        ``peer``: the global rank it sends to, its ring successor (default: ``rank + 1`` mod N, the
        world ring), whose node decides the link."""
        n = self.n_ranks if n is None else n
        sent, recv = ring_elements(op, numel, n, rank if index is None else index, src)
        size = dtype.itemsize if dtype is not None else 0
        rec = CommRecord(rank=rank, seq=len(self._records[rank]), op=op, dtype=dtype, numel=numel,
                         elements_sent=sent, elements_recv=recv, bytes_sent=sent * size,
                         bytes_recv=recv * size, phase=phase, step=step,
                         wire_elements_sent=sent * wire_factor, group=group, group_size=n,
                         sent_as=op if sent_as is None else sent_as,
                         link=self._link(rank, group, peer))
        self._records[rank].append(rec)
        return rec

    def _link(self, rank: int, group: str, peer: int | None) -> str:
        if group in ("host", "nvme"):   # the rank's own PCIe link, its host's NVMe link
            return group
        return self.nodes.link(rank, (rank + 1) % self.n_ranks if peer is None else peer)

    def next_seq(self, rank: int) -> int:
        """The sequence number ``rank``'s next collective will get."""
        return len(self._records[rank])

    def adopt(self, rank: int, records: list[CommRecord]) -> None:
        """Take over ``rank``'s records booked by another ledger (each process of the
        torch.distributed engine books its own rank; the launcher merges them here)."""
        if any(r.rank != rank for r in records):
            raise ValueError(f"records of rank(s) {sorted({r.rank for r in records} - {rank})} "
                             f"cannot be adopted as rank {rank}'s")
        self._records[rank] = list(records)

    def records(self, rank: int | None = None, *, phase: str | None = None,
                step: int | None = None, op: str | None = None,
                group: str | None = None, link: str | None = None) -> list[CommRecord]:
        ranks = range(self.n_ranks) if rank is None else [rank]
        return [r for k in ranks for r in self._records[k]
                if (phase is None or r.phase == phase) and (step is None or r.step == step)
                and (op is None or r.op == op) and (group is None or r.group == group)
                and (link is None or r.link == link)]

    def elements(self, rank: int, **where) -> int:
        """Elements ``rank`` sent, filtered like :meth:`records` (= received, except in an
        all-reduce whose chunks are uneven, where the two differ by at most one element)."""
        return sum(r.elements_sent for r in self.records(rank, **where))

    def bytes(self, rank: int, **where) -> int:
        return sum(r.bytes_sent for r in self.records(rank, **where))

    def link_bytes(self, rank: int, **where) -> int:
        """Bytes ``rank`` sent plus received: a one-way link's total (the host link of P_a+cpu,
        ``group="host"``, where copies out are sent and copies back received)."""
        return sum(r.bytes_sent + r.bytes_recv for r in self.records(rank, **where))

    def crossing(self, node: int, **where) -> int:
        """Elements the GPUs of ``node`` sent over links that leave it (its cross-node volume)."""
        return sum(self.elements(r, link="inter", **where) for r in self.nodes.ranks_of(node))

    def crossing_bytes(self, node: int, **where) -> int:
        """Bytes the GPUs of ``node`` sent over links that leave it: what ZeRO++'s quantized
        collectives shrink (int8, packed int4 and fp32 scales travel in one ledger)."""
        return sum(self.bytes(r, link="inter", **where) for r in self.nodes.ranks_of(node))

    def count(self, rank: int, **where) -> int:
        """Number of collectives (barriers included) issued by ``rank``."""
        return len(self.records(rank, **where))

    def by_op(self, rank: int, **where) -> dict[str, int]:
        out: Counter = Counter()
        for r in self.records(rank, **where):
            out[r.op] += r.elements_sent
        return dict(out)

    def by_phase(self, rank: int, **where) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for r in self.records(rank, **where):
            out[r.phase] += r.elements_sent
        return dict(out)

    def in_psi(self, rank: int, psi: int, **where) -> Fraction:
        """Elements sent by ``rank`` in units of Ψ, exact (C20 counts volume in elements)."""
        return Fraction(self.elements(rank, **where), psi)

    def mean_elements(self, **where) -> Fraction:
        """Per-rank mean, exact: ranks differ only through uneven all-reduce chunks."""
        return Fraction(sum(self.elements(r, **where) for r in range(self.n_ranks)), self.n_ranks)
