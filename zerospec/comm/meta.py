"""Meta backend: one rank's side of every collective, with no peers and no data.

Used by :mod:`zerospec.training.scale` to run paper-size models on ``meta`` tensors (shapes and dtypes, no
storage). A meta tensor has no values to move, so a collective needs no rendezvous: the caller has
already allocated its output with the shape the collective defines, and all that is left is to
check that the shapes fit the true world size N. The
:class:`~zerospec.comm.interconnect.Interconnect` in front books the collective in the
:class:`~zerospec.comm.ledger.CommLedger` for that N, exactly as it does for the thread backend, so
the ring-model traffic of a rank does not depend on how many ranks actually ran.

The backend also keeps, per rank, the ``src`` of each collective in order: the ledger's records do
not carry it, and a broadcast's per-rank traffic depends on it (C21's ring model), so
:class:`zerospec.training.scale.ScaleResult` needs it to book the same trace for another rank.
"""
from __future__ import annotations

from collections import defaultdict

from ..runtime.errors import CollectiveError
from .interconnect import Call
from .checks import check_calls


class MetaBackend:
    """Single-rank collectives on meta tensors for a world of ``n_ranks``; moves nothing."""

    def __init__(self, n_ranks: int):
        if not isinstance(n_ranks, int) or n_ranks < 1:
            raise ValueError(f"n_ranks must be an integer >= 1, got {n_ranks!r}")
        self.n = n_ranks
        self.srcs: dict[int, list[int]] = defaultdict(list)   # rank -> src of each collective

    def wire_factor(self, op: str) -> int:
        return 1

    def collective(self, rank: int, call: Call) -> None:
        if not 0 <= rank < self.n:
            raise CollectiveError(f"rank must be in 0..{self.n - 1}, got {rank}")
        for name, t in (("input", call.inp), ("output", call.out)):
            if t is not None and t.device.type != "meta":
                raise CollectiveError(f"{call.describe()} on rank {rank}: the meta backend moves no "
                                      f"data, so its {name} must be a meta tensor, got {t.device}")
        # The same per-rank checks as the thread backend (N × chunk sizes, contiguous outputs);
        # checks *across* ranks are vacuous with one call, and symmetry is what scale.py relies on.
        problem = check_calls([call], call.group.size if call.group is not None else self.n)
        if problem:
            raise CollectiveError(f"rank {rank}: {problem}")
        self.srcs[rank].append(call.src)
        call.seconds = 0.0
