"""The Interconnect protocol: what stage code calls. torch.distributed semantics, backend-agnostic.

Stage code talks only to :class:`Interconnect` (design property 4); the interconnect books every
collective in the :class:`~zerospec.comm.ledger.CommLedger` after the backend has moved the data, so
bytes are counted in exactly one place whatever the backend (threads, torch.distributed, meta).

Reductions: ``"sum"``, ``"mean"`` (sum, then divide by N — never a backend's AVG, which gloo before
torch 2.9 silently ignored) and ``"max"``. Every backend must reduce deterministically: the simulated
one sums in rank order, so all_reduce equals reduce_scatter followed by all_gather bit for bit.
"""
from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Protocol

import torch

from ..runtime.observe import off_device
from .groups import Group
from .ledger import CommLedger

REDUCE_OPS = ("sum", "mean", "max")


@dataclasses.dataclass
class Call:
    """One rank's side of a collective."""

    op: str
    inp: torch.Tensor | None
    out: torch.Tensor | None
    reduce_op: str | None = None
    src: int = 0
    seconds: float = 0.0   # time the backend spent moving data for this collective (set by it)
    group: Group | None = None   # None: every rank (the world); src is a position in the group
    sent_as: str | None = None   # what the backend's transport call was, if not ``op`` (coalesce.py)

    def describe(self) -> str:
        return describe(*self.summary())

    def summary(self) -> tuple:
        """What describe() prints, without formatting it (and without holding the tensors)."""
        inp = self.inp
        return self.op, inp.shape if inp is not None else None, \
            inp.dtype if inp is not None else None, self.reduce_op


def describe(op: str, shape, dtype, reduce_op) -> str:
    """``op(shape, dtype, op=…)``: a collective as error messages name it (see Call.summary)."""
    dtype = str(dtype).replace("torch.", "") if dtype is not None else "-"
    extra = f", op={reduce_op}" if reduce_op else ""
    return f"{op}({tuple(shape) if shape is not None else ()}, {dtype}{extra})"


def shares_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` live in the same memory (a collective's input inside its output)."""
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


class Backend(Protocol):
    """Moves data for one rank's side of a collective; raises CollectiveError on bad input."""

    def collective(self, rank: int, call: Call) -> None: ...

    def wire_factor(self, op: str) -> int:
        """Wire elements per logical ring-model element (gloo sends an all-reduce for an RS)."""
        ...


class Interconnect:
    """Per-rank handle on the collectives; books each completed collective in the ledger.

    ``group``: the collectives run over that :class:`~.groups.Group` (a DP or MP group of the
    2-D grid), and ``rank``/``n_ranks`` are this rank's position in it and its size; None: over
    every rank. :meth:`subgroup` makes one from the world's handle; all share one ledger."""

    def __init__(self, ctx, backend: Backend, ledger: CommLedger, group: Group | None = None,
                 root: Interconnect | None = None):
        self.ctx = ctx
        self.backend = backend
        self.ledger = ledger
        self.group = group
        self._root = root or self           # where the rank's last collective is remembered
        self._last: tuple | None = None   # (seq, Call.summary()) of the last collective
        self._issued: dict[int, tuple] | None = None   # in a batch: id(call) -> its _last

    def subgroup(self, group: Group) -> Interconnect:
        """This rank's handle on the collectives of ``group`` (which must contain it)."""
        group.index(self.ctx.rank)
        return Interconnect(self.ctx, self.backend, self.ledger, group, self._root)

    def split(self, grid) -> tuple[Interconnect, Interconnect]:
        """This rank's (DP, MP) handles on ``grid`` (comm/groups.py), whose groups the run's mesh
        made in the backend (comm/mesh.py: Mesh.make)."""
        r = self.ctx.rank
        return self.subgroup(grid.dp_group(r)), self.subgroup(grid.mp_group(r))

    @property
    def last_op(self) -> str | None:
        """The last collective this rank issued, for error messages ("#seq op(shape, dtype)")."""
        last = self._root._last
        return None if last is None else f"#{last[0]} {describe(*last[1])}"

    @property
    def rank(self) -> int:
        return self.ctx.rank if self.group is None else self.group.index(self.ctx.rank)

    @property
    def n_ranks(self) -> int:
        return self.ctx.n_ranks if self.group is None else self.group.size

    @property
    def group_name(self) -> str:
        return "world" if self.group is None else self.group.name

    def _run(self, call: Call, numel: int, post: bool = False) -> None:
        if call.reduce_op is not None and call.reduce_op not in REDUCE_OPS:
            raise ValueError(f"unknown reduce op {call.reduce_op!r}; accepted: {', '.join(REDUCE_OPS)}")
        call.group = self.group
        last = self._root._last = (self.ledger.next_seq(self.ctx.rank), call.summary())
        if self._issued is not None:
            self._issued[id(call)] = last
        self.ctx.timeline.mark_compute()
        # the backend speaks global ranks
        (self.backend.post if post else self.backend.collective)(self.ctx.rank, call)
        self.ctx.timeline.add(call.op, call.seconds)
        dtype = call.inp.dtype if call.inp is not None else None
        self.ledger.book(self.ctx.rank, call.op, dtype, numel, self.ctx.phase_name, self.ctx.step,
                         src=call.src, wire_factor=self.backend.wire_factor(call.op),
                         group=self.group_name, n=self.n_ranks, index=self.rank,
                         sent_as=call.op if call.sent_as is None else call.sent_as,
                         peer=self.successor)

    @property
    def successor(self) -> int:
        """The global rank this rank sends to in the group's ring (its link: ledger.py)."""
        if self.group is None:
            return (self.ctx.rank + 1) % self.ctx.n_ranks
        ranks = self.group.ranks
        return ranks[(ranks.index(self.ctx.rank) + 1) % len(ranks)]

    def to_host(self, tensor: torch.Tensor) -> torch.Tensor:
        """A copy of ``tensor`` in host memory (ZeRO-R's P_a+cpu), booked on this rank's own
        device→host link (group ``"host"``). On meta the copy is meta too: no data, same bytes."""
        with off_device():   # not the device's memory: its observers (and allocator trace) skip it
            host = torch.empty(tensor.shape, dtype=tensor.dtype,
                               device="meta" if tensor.device.type == "meta" else "cpu")
            host.copy_(tensor)
        self._book_host("to_host", host)
        return host

    def from_host(self, host: torch.Tensor, device) -> torch.Tensor:
        """``host`` copied back to the rank's device, booked on its host→device link."""
        out = torch.empty(host.shape, dtype=host.dtype, device=device)
        out.copy_(host)
        self._book_host("from_host", host)
        return out

    def _book_host(self, op: str, t: torch.Tensor) -> None:
        self.book_link(op, t)

    def copy_to_host(self, host: torch.Tensor, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` (on the device) copied into the existing host buffer ``host`` (ZeRO-Offload's
        gradients), booked on the rank's device→host link."""
        with off_device():
            host.copy_(tensor)
        self.book_link("to_host", tensor)
        return host

    def copy_from_host(self, out: torch.Tensor, host: torch.Tensor) -> torch.Tensor:
        """``host`` copied into the existing device tensor ``out`` (ZeRO-Offload's parameters),
        booked on the rank's host→device link."""
        out.copy_(host)
        self.book_link("from_host", host)
        return out

    def book_link(self, op: str, t: torch.Tensor) -> None:
        """Book a copy of ``t`` on the rank's own link: ``to_host``/``from_host`` on PCIe (group
        ``"host"``), ``to_nvme``/``from_nvme`` on its host's NVMe (group ``"nvme"``)."""
        group = "nvme" if op.endswith("nvme") else "host"
        self.ledger.book(self.ctx.rank, op, t.dtype, t.numel(), self.ctx.phase_name,
                         self.ctx.step, group=group, n=1, index=0)

    @contextlib.contextmanager
    def batch(self):
        """Collectives issued inside may be in flight together and complete at the end of the block.

        A backend that can overlap them does (torch.distributed's async ops: one rendezvous
        latency instead of one per collective; on gloo, one fused collective per kind); the
        simulator completes each at once. So outputs are valid only after the block, and inputs
        may be read until its end: no input may change inside the block, nor be an output of
        another collective of the block (a call's own output may lie inside its input). Every
        rank of a group must issue the same collectives in the same order, over all groups, as
        outside a block (a backend may fuse runs of them). Each
        collective is still booked as itself: counts, elements and bytes do not change. The wait
        at the end is added to the last collective's time on the timeline."""
        start = getattr(self.backend, "start_batch", None)
        if start is None or self._issued is not None:   # nothing to overlap, or nested
            yield
            return
        start()
        self._issued = issued = {}
        done = False
        try:
            yield
            done = True
        finally:
            self._issued = None
            t0 = time.perf_counter()
            try:
                self.backend.finish_batch(wait=done)   # after an error: drop, do not wait on peers
            except Exception as exc:
                # the collective that failed, not the batch's last one issued, is "the last"
                self._last = issued.get(id(getattr(exc, "call", None)), self._last)
                raise
            if done and issued:
                self.ctx.timeline.extend_last(time.perf_counter() - t0)

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """In place: every rank ends with the reduction of all ranks' ``tensor``."""
        self._run(Call("all_reduce", tensor, tensor, op), tensor.numel())
        return tensor

    def reduce_scatter(self, output: torch.Tensor, input: torch.Tensor, op: str = "sum", *,
                       post: bool = False) -> torch.Tensor:
        """Rank r's ``output`` gets chunk r of the reduction of all ranks' ``input`` (N equal chunks).

        ``post``: the call may return as soon as ``input`` is read (the caller may free or reuse
        it), before ``output`` is written; :meth:`wait` returns once it is, and a rank must call it
        before it reads ``output`` or returns. A backend that cannot post (torch.distributed, meta,
        the simulator's ring transport) completes the call at once, as does the simulator when
        ``output`` lies inside ``input``."""
        self._run(Call("reduce_scatter", input, output, op), input.numel(),
                  post and hasattr(self.backend, "post"))
        return output

    def wait(self) -> None:
        """Return once every collective this rank posted has written its outputs. The time spent
        waiting is the other ranks', not this rank's compute (the timeline skips it)."""
        wait = getattr(self.backend, "wait", None)
        if wait is not None:
            self.ctx.timeline.mark_compute()
            wait(self.ctx.rank)
            self.ctx.timeline.restart()

    def all_gather(self, output: torch.Tensor, input: torch.Tensor) -> torch.Tensor:
        """``output`` is the concatenation of every rank's ``input`` in rank order."""
        self._run(Call("all_gather", input, output), output.numel())
        return output

    def all_to_all(self, output: torch.Tensor, input: torch.Tensor) -> torch.Tensor:
        """``output``'s piece k is rank k's ``input`` piece r (this rank r; N equal pieces). Each
        piece goes straight to its rank, so the ledger books the sends on one link class: the
        group's peers must all sit on this rank's node, or all off it (qgZ's local and global
        groups, comm/groups.py)."""
        ranks = self.group.ranks if self.group is not None else tuple(range(self.ctx.n_ranks))
        links = {self.ledger.nodes.link(self.ctx.rank, p) for p in ranks if p != self.ctx.rank}
        if len(links) > 1:
            raise ValueError(f"all_to_all over {self.group_name!r} {ranks}: rank "
                             f"{self.ctx.rank}'s peers take both intra- and inter-node links; "
                             f"accepted: a group inside one node or one GPU per node")
        self._run(Call("all_to_all", input, output), input.numel())
        return output

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        if not 0 <= src < self.n_ranks:
            raise ValueError(f"broadcast src must be in 0..{self.n_ranks - 1}, got {src}")
        self._run(Call("broadcast", tensor, tensor, src=src), tensor.numel())
        return tensor

    def barrier(self) -> None:
        self._run(Call("barrier", None, None), 0)
