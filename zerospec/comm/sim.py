"""Simulated backend: ranks meet at a rendezvous, the last to arrive moves the data for everyone
(one function per collective, looked up by the op's name in ``MOVES``).

Reductions are deterministic: each element is accumulated in rank order 0, 1, …, N−1 in an fp32
accumulator (fp64 for fp64), divided by N for ``mean``, and rounded once to the tensor's dtype.
Every step is a correctly rounded elementwise operation, so a slice of an all_reduce is bit-identical
to the matching reduce_scatter chunk — the property that keeps ZeRO stages bit-identical.
"""
from __future__ import annotations

import contextlib
import threading
import time

import torch

from ..runtime.errors import ClusterAborted, CollectiveError
from .checks import check_calls, reduce_end, reduce_step
from .interconnect import Call, describe, shares_storage
from .posted import PostedReduction

# elements per all-reduce block: its fp32 accumulator (256 KiB) stays in L2 while N ranks add
# into it (1M fp16 × 32 ranks on AVX-512: 25 ms unblocked, 17 ms at 2^15, 15 ms at 2^16 and 2^17)
BLOCK = 1 << 16


def reduce_in_rank_order(tensors: list[torch.Tensor], op: str) -> torch.Tensor:
    """Elementwise reduction of ``tensors`` in list order, in the accumulator dtype."""
    acc = scratch = None
    for t in tensors:
        acc = reduce_step(acc, t, op, scratch)
        if scratch is None and acc.dtype != t.dtype:
            scratch = torch.empty_like(acc)   # one cast buffer, not one temporary per addition
    return reduce_end(acc, op, len(tensors))


class SimBackend:
    """Thread rendezvous on a :class:`~zerospec.cluster.threads.Baton`: one blocking collective in
    flight per group at a time, and any number of posted reduce-scatters (comm/posted.py)."""

    def __init__(self, baton, transport=None):
        self.baton = baton
        self.n = baton.n
        # None: the last rank to arrive moves the data, reducing in rank order (what keeps the
        # stages bit-identical); a RingTransport passes chunks between neighbours instead
        self.transport = transport
        # around_move(rank): a context the completing rank moves every rank's data inside (the
        # memory observer pauses there: that data belongs to no one rank); None: nothing
        self.around_move = None
        # one rendezvous per group (its global ranks, in ring order): the grid's DP and MP
        # groups run their collectives independently (comm/groups.py)
        self._pending: dict[tuple[int, ...], dict[int, Call]] = {}
        self._waiting: set[int] = set()
        self._world = tuple(range(self.n))
        self._finished = 0          # ranks whose function returned (checked per collective)
        self._seq = 0
        # posted reduce-scatters (comm/posted.py) in flight, by (group, k): the k-th each rank of
        # the group posts; per rank, how many it has posted in each group and those not done yet
        self._posts: dict[tuple, PostedReduction] = {}
        self._posted: dict[tuple, int] = {}
        self._open: dict[int, list[tuple[tuple, int, PostedReduction]]] = {}
        self._post_waiters: set[int] = set()   # ranks in wait(), a subset of _waiting
        self._unwaited: dict[int, int] = {}     # per rank, posts since its last wait()
        self._error: CollectiveError | None = None
        self._lock = threading.Lock()

    def wire_factor(self, op: str) -> int:
        return 1

    def collective(self, rank: int, call: Call) -> None:
        members = call.group.ranks if call.group is not None else self._world
        with self._lock:
            finished = [r for r in members if self.baton.finished[r]] if self._finished else ()
            if finished:
                err = CollectiveError(f"rank {rank} called {call.describe()} (collective #{self._seq}) "
                                      f"but rank(s) {finished} already returned")
                self._fail(rank, err)
            pending = self._pending.setdefault(members, {})
            pending[rank] = call
            complete = len(pending) == len(members)
            if complete:
                calls = [pending[r] for r in members]
                del self._pending[members]
                self._waiting.difference_update(members)
                self._seq += 1
            else:
                # a waiting rank holds no reference to its peers' calls: their buffers must
                # die when their owners free them (the memory observer checks it)
                del pending
                self._waiting.add(rank)
                nxt = self.baton.next_rank(rank, skip=self._waiting.__contains__)
                if nxt is None:   # every rank waits, in rendezvous that cannot complete
                    self._fail(rank, CollectiveError(
                        f"deadlock: rank {rank} called {call.describe()} and every other rank "
                        f"waits in another collective: {self._describe_pending()}"))
        if complete:
            self._finalize(rank, calls, members)  # the last to arrive keeps the baton, carries on
            return
        seq = self._seq
        self.baton.pass_to(nxt)
        try:
            self.baton.wait_turn(rank, lambda: self._missing(call, members, seq))
        except ClusterAborted:
            if self._error is not None:
                raise CollectiveError(str(self._error)) from None
            raise

    def post(self, rank: int, call: Call) -> None:
        """Read ``rank``'s input of a reduce-scatter and return; the outputs are written when the
        group's last input comes (comm/posted.py). The ring transport passes chunks between
        neighbours, which needs every rank there, and an output inside the input would be written
        after the caller let go of it: those calls block as before."""
        if (self.transport is not None or call.op != "reduce_scatter"
                or shares_storage(call.inp, call.out)):
            self.collective(rank, call)
            return
        if self.baton.error is not None:   # the cluster aborted: stop here, as a blocking call does
            raise ClusterAborted(f"rank {rank} aborted: rank {self.baton.failed_rank} failed") \
                from self.baton.error
        members = call.group.ranks if call.group is not None else self._world
        t0 = time.perf_counter()
        with self._lock:
            k = self._posted.get((rank, members), 0)
            self._posted[rank, members] = k + 1
            self._unwaited[rank] = self._unwaited.get(rank, 0) + 1
            index = members.index(rank)
            red = self._posts.get((members, k))
            if red is None:
                red = self._posts[members, k] = PostedReduction(len(members), call, index)
            gone = [members[i] for i in red.missing() if self.baton.finished[members[i]]]
            if gone:
                self._fail(rank, CollectiveError(f"rank {rank} posted {call.describe()} (its posted "
                                                 f"collective #{k}) but rank(s) {gone} returned "
                                                 f"without posting it"))
            problem = red.problem(index, call)
            if problem:
                self._fail(rank, CollectiveError(f"posted collective #{k}: {problem}"))
            with self._moving(rank):
                red.add(index, call)
            if red.done:
                del self._posts[members, k]
                for r in members:   # a rank waiting for this one may run again once all its are done
                    if r in self._post_waiters and all(p.done for _, _, p in self._open.get(r, ())):
                        self._post_waiters.discard(r)
                        self._waiting.discard(r)
            else:
                self._open.setdefault(rank, []).append((members, k, red))
        # the last poster's event holds every rank's share: the replay (report/replay.py) takes
        # a collective's longest event as its time, as it takes the mover's for a blocking one
        own = time.perf_counter() - t0
        red.seconds += own
        call.seconds = red.seconds if red.done else own

    def wait(self, rank: int) -> None:
        """Return once every reduce-scatter ``rank`` posted has written its outputs; until then the
        baton goes to ranks that can run (the ones still to post)."""
        while True:
            with self._lock:
                opens = self._open[rank] = [o for o in self._open.get(rank, ()) if not o[2].done]
                if not opens:
                    self._unwaited[rank] = 0
                    return
                self._waiting.add(rank)
                self._post_waiters.add(rank)
                nxt = self.baton.next_rank(rank, skip=self._waiting.__contains__)
                if nxt is None:
                    self._fail(rank, CollectiveError(
                        f"deadlock: rank {rank} waits for {self._missing_posts(rank)} and every "
                        f"other rank waits too: {self._describe_pending()}"))
            self.baton.pass_to(nxt)
            try:
                self.baton.wait_turn(rank, lambda: self._missing_posts(rank))
            except ClusterAborted:
                if self._error is not None:
                    raise CollectiveError(str(self._error)) from None
                raise

    def _missing_posts(self, rank: int) -> str:
        return "; ".join(f"posted collective #{k} {describe(*red.summary)}: rank(s) "
                         f"{[members[i] for i in red.missing()]} never posted"
                         for members, k, red in self._open.get(rank, ()) if not red.done)

    def _moving(self, rank: int):
        """The context the data of every rank moves in (the observers pause: it is no one's)."""
        return contextlib.nullcontext() if self.around_move is None else self.around_move(rank)

    def rank_finished(self, rank: int) -> None:
        """``rank``'s function returned: hand the baton on, or fail if peers wait in a collective."""
        with self._lock:
            self.baton.finished[rank] = True
            self._finished += 1
            for members, pending in self._pending.items():
                if rank in members and pending:
                    waiting = sorted(pending)
                    err = CollectiveError(f"rank {rank} returned while rank(s) {waiting} wait in "
                                          f"collective #{self._seq} {pending[waiting[0]].describe()}")
                    self._fail(rank, err)
            if self._unwaited.get(rank):
                self._fail(rank, CollectiveError(
                    f"rank {rank} returned without wait() after posting {self._unwaited[rank]} "
                    f"collective(s): their outputs may not have been written when it read them"))
            for (members, k), red in self._posts.items():
                if rank in members and members.index(rank) in red.missing():
                    self._fail(rank, CollectiveError(
                        f"rank {rank} returned without posting posted collective #{k} "
                        f"{describe(*red.summary)}, which rank(s) "
                        f"{[m for i, m in enumerate(members) if i not in red.missing()]} posted"))
            nxt = self.baton.next_rank(rank, skip=self._waiting.__contains__)
            if nxt is None and self._waiting:
                self._fail(rank, CollectiveError(
                    f"deadlock: rank {rank} returned and every other rank waits in a collective "
                    f"that cannot complete: {self._describe_pending()}"))
        if nxt is not None:
            self.baton.pass_to(nxt)

    def _describe_pending(self) -> str:
        return "; ".join([f"rank {r} in {c.describe()} over {list(members)}"
                          for members, pending in self._pending.items() for r, c in pending.items()]
                         + [f"rank {r} in wait() for {self._missing_posts(r)}"
                            for r in sorted(self._post_waiters)])

    def _missing(self, call: Call, members, seq: int) -> str:
        pending = self._pending.get(members, {})
        missing = [r for r in members if r not in pending]
        return f"collective #{seq} {call.describe()}: rank(s) {missing} never arrived"

    def _fail(self, rank: int, err: CollectiveError):
        self._error = err
        self.baton.abort(rank, err)
        raise err

    # -- data movement ----------------------------------------------------------------------------
    def _finalize(self, rank: int, calls: list[Call], members) -> None:
        t0 = time.perf_counter()
        with self._moving(rank):
            self._move(rank, calls, members)
        for c in calls:
            c.seconds = time.perf_counter() - t0

    def _move(self, rank: int, calls: list[Call], members) -> None:
        problem = check_calls(calls, len(calls))
        if problem:
            self._fail(rank, CollectiveError(f"collective #{self._seq - 1}: {problem}"))
        if self.transport is not None:
            self.transport.move(calls, members)
            return
        MOVES[calls[0].op](calls)


# -- the collectives: each moves the data of every rank's call, the calls in rank order -----------
def _all_reduce(calls: list[Call]) -> None:
    """Every rank's ``out``: the reduction of every rank's ``inp``, in rank order."""
    n = len(calls)
    # block by block, so the fp32 accumulator stays in cache while N ranks add into it (the same
    # elementwise operations in the same order: the same bits); within a block every input is read
    # before any output, which may alias it, is written. One block when ranks share a storage: a
    # view at another offset would be read after an earlier block wrote it
    flat = (all(c.inp.is_contiguous() and c.out.is_contiguous() for c in calls)
            and len({c.inp.untyped_storage()._cdata for c in calls}) == n)
    ins = [c.inp.view(-1) if flat else c.inp for c in calls]
    outs = [c.out.view(-1) if flat else c.out for c in calls]
    size = ins[0].numel() if flat else 0
    blocks = [slice(b, b + BLOCK) for b in range(0, size, BLOCK)] or [slice(None)]
    for b in blocks:
        acc = reduce_in_rank_order([x[b] for x in ins], calls[0].reduce_op)
        first = outs[0][b]
        first.copy_(acc)          # the one rounding to the tensor's dtype …
        for o in outs[1:]:
            o[b].copy_(first)     # … then plain copies (same bits, half the bytes read)


def _reduce_scatter(calls: list[Call]) -> None:
    """Rank r's ``out``: chunk r of the reduction of every rank's ``inp``, in rank order."""
    n = len(calls)
    # the whole reduction once, then each rank its chunk: the same elementwise operations
    # in the same order as reducing chunk by chunk, in N + 1 kernels instead of N², and
    # every input is read before any output (which may alias an input) is written
    acc = reduce_in_rank_order([c.inp.reshape(-1) for c in calls], calls[0].reduce_op)
    size = acc.numel() // n
    for r, c in enumerate(calls):
        c.out.view(-1).copy_(acc[r * size:(r + 1) * size])


def _all_gather(calls: list[Call]) -> None:
    """Every rank's ``out``: every rank's ``inp``, concatenated in rank order."""
    # assemble in rank 0's output, then copy it to the others, without an intermediate
    # buffer: an input may alias its own rank's output, but only at its own chunk, where
    # the copy writes the same values; rank r ≥ 1's input is read before rank r is written
    first = calls[0].out.view(-1)
    size = calls[0].inp.numel()
    if any(shares_storage(c.inp, first) for c in calls[1:]):   # ranks sharing tensors
        first.copy_(torch.cat([c.inp.reshape(-1) for c in calls]))  # read all first
    else:
        for r, c in enumerate(calls):
            dst, src = first[r * size:(r + 1) * size], c.inp.reshape(-1)
            if dst.data_ptr() != src.data_ptr():
                dst.copy_(src)
    for c in calls[1:]:
        c.out.view(-1).copy_(first)


def _broadcast(calls: list[Call]) -> None:
    """Every rank's ``out`` but ``src``'s: rank ``src``'s ``inp``."""
    src = calls[calls[0].src].inp
    for r, c in enumerate(calls):
        if r != calls[0].src:
            c.out.copy_(src)


def _all_to_all(calls: list[Call]) -> None:
    """Rank r's ``out`` piece k: rank k's ``inp`` piece r (n equal pieces)."""
    n = len(calls)
    pieces = [c.inp.reshape(n, -1).clone() for c in calls]   # all read before any is written
    for r, c in enumerate(calls):
        c.out.view(n, -1).copy_(torch.stack([p[r] for p in pieces]))


def _barrier(calls: list[Call]) -> None:
    """No data: meeting at the rendezvous was the barrier."""


MOVES = {"all_reduce": _all_reduce, "reduce_scatter": _reduce_scatter, "all_gather": _all_gather,
         "broadcast": _broadcast, "barrier": _barrier, "all_to_all": _all_to_all}
