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

    def describe(self) -> str:
        return _describe(*self.summary())

    def summary(self) -> tuple:
        """What describe() prints, without formatting it (and without holding the tensors)."""
        inp = self.inp
        return self.op, inp.shape if inp is not None else None, \
            inp.dtype if inp is not None else None, self.reduce_op


def _describe(op: str, shape, dtype, reduce_op) -> str:
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
    """Per-rank handle on the collectives; books each completed collective in the ledger."""

    def __init__(self, ctx, backend: Backend, ledger: CommLedger):
        self.ctx = ctx
        self.backend = backend
        self.ledger = ledger
        self._last: tuple | None = None   # (seq, Call.summary()) of the last collective
        self._issued: dict[int, tuple] | None = None   # in a batch: id(call) -> its _last

    @property
    def last_op(self) -> str | None:
        """The last collective this rank issued, for error messages ("#seq op(shape, dtype)")."""
        return None if self._last is None else f"#{self._last[0]} {_describe(*self._last[1])}"

    @property
    def rank(self) -> int:
        return self.ctx.rank

    @property
    def n_ranks(self) -> int:
        return self.ctx.n_ranks

    def _run(self, call: Call, numel: int) -> None:
        if call.reduce_op is not None and call.reduce_op not in REDUCE_OPS:
            raise ValueError(f"unknown reduce op {call.reduce_op!r}; accepted: {', '.join(REDUCE_OPS)}")
        self._last = (self.ledger.next_seq(self.rank), call.summary())  # formatted on error only
        if self._issued is not None:
            self._issued[id(call)] = self._last
        self.ctx.timeline.mark_compute()
        self.backend.collective(self.rank, call)
        self.ctx.timeline.add(call.op, call.seconds)
        dtype = call.inp.dtype if call.inp is not None else None
        self.ledger.book(self.rank, call.op, dtype, numel, self.ctx.phase_name, self.ctx.step,
                         src=call.src, wire_factor=self.backend.wire_factor(call.op))

    @contextlib.contextmanager
    def batch(self):
        """Collectives issued inside may be in flight together and complete at the end of the block.

        A backend that can overlap them does (torch.distributed's async ops: one rendezvous
        latency instead of one per collective); the simulator completes each at once. So outputs
        are valid only after the block, and no input may be an output of the same block. Each
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

    def reduce_scatter(self, output: torch.Tensor, input: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """Rank r's ``output`` gets chunk r of the reduction of all ranks' ``input`` (N equal chunks)."""
        self._run(Call("reduce_scatter", input, output, op), input.numel())
        return output

    def all_gather(self, output: torch.Tensor, input: torch.Tensor) -> torch.Tensor:
        """``output`` is the concatenation of every rank's ``input`` in rank order."""
        self._run(Call("all_gather", input, output), output.numel())
        return output

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        if not 0 <= src < self.n_ranks:
            raise ValueError(f"broadcast src must be in 0..{self.n_ranks - 1}, got {src}")
        self._run(Call("broadcast", tensor, tensor, src=src), tensor.numel())
        return tensor

    def barrier(self) -> None:
        self._run(Call("barrier", None, None), 0)
