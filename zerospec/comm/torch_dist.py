"""torch.distributed backend: the Interconnect protocol over a real process group (gloo or NCCL).

Stage code is unchanged: it calls :class:`~zerospec.comm.interconnect.Interconnect`, which books the
same logical ring-model numbers as the simulator; this backend only moves data, with torch's own
collectives (no home-made transport). What it does beyond a plain ``dist.*`` call, and why:

* **Reductions run in an fp32 buffer** (fp64 stays fp64). gloo sums fp16/bf16 in that dtype at
  every hop, so an fp16 all-reduce rounds N−1 times; the simulator (and the paper's fp32 reduction
  of fp16 gradients on real systems) accumulates in fp32 and rounds once. Copying to fp32, reducing,
  and casting back gives those semantics — every stage pays the same cast, so parity is kept.
* **Mean is SUM, then divide by N** in the fp32 buffer, never ``ReduceOp.AVG``: one division,
  rounded once, exactly where the simulator divides, whatever the backend does with AVG (before
  torch 2.9 gloo's ``reduce_scatter_tensor`` silently ignored its op and returned the SUM).
* **Every reduction buffer is zero-padded to a multiple of N.** The order in which gloo's ring
  adds the ranks' values for element i depends on the buffer's length, and stage 0 all-reduces
  unpadded units while stages 1–3 reduce padded ones: padding hands gloo the same buffer in every
  stage, so the stages are bit-identical by construction (design property 3). The measurements
  behind this are in spec/engine.md ("What the backend does beyond a dist.* call").
* **Wire figure.** gloo implements ``reduce_scatter`` as an all-reduce of the whole input, so it
  sends twice the ring model's (N−1)/N·S: :meth:`TorchDistBackend.wire_factor` says so and the
  ledger's ``wire_elements_sent`` shows it. The fp32 buffer also doubles the wire *bytes* of fp16
  and bf16 reductions (elements are unchanged); padding adds fewer than N elements per call sent
  alone, and up to about N per call to a fused batch (its rows are padded to equal length), which
  the ledger does not count.

* **Batches** (:meth:`Interconnect.batch`): the per-unit collectives after backward (stages 0
  and 1) and the parameter all-gathers after the step (stage 1) are waited for together at the
  end of the block. On gloo, consecutive reductions of one group, op and dtype go as *one*
  all-reduce, laid out so that each element is summed in the order of its own call
  (:mod:`zerospec.comm.coalesce`: same bits), and consecutive all-gathers as one all-gather: a
  step pays one rendezvous per kind rather than one per unit. Other backends issue each call
  as an async op. Either way each collective is booked as itself.

A failure inside a collective is re-raised as :class:`~zerospec.runtime.errors.CollectiveError` naming this
rank, the collective and, when a peer reported itself through the store (see
:mod:`zerospec.cluster.processes`), the rank that failed first.
"""
from __future__ import annotations

import re
import time

import torch
import torch.distributed as dist

from ..runtime.context import RankContext
from ..runtime.errors import CollectiveError
from ..runtime.memory import MemoryLedger
from .checks import accumulator_dtype
from .coalesce import Gathers, Reductions
from .interconnect import Call, Interconnect, shares_storage
from .ledger import CommLedger

MIN_TORCH = (2, 9)
FAILED_KEY = "zerospec/failed/{rank}"   # store key a failing rank (or its launcher) writes


class PeerFailure(CollectiveError):
    """A collective failed in the transport: a peer died, failed or timed out (not this rank's fault)."""


def check_torch_version(version: str | None = None) -> None:
    """Refuse torch < 2.9: its gloo ``reduce_scatter_tensor`` ignored ``op`` (AVG came back as SUM)."""
    version = version or torch.__version__
    m = re.match(r"(\d+)\.(\d+)", version)
    if m is None:
        raise RuntimeError(f"cannot parse torch version {version!r}; the torch.distributed backend "
                           f"needs torch >= {MIN_TORCH[0]}.{MIN_TORCH[1]}")
    if (int(m.group(1)), int(m.group(2))) < MIN_TORCH:
        raise RuntimeError(
            f"the torch.distributed backend needs torch >= {MIN_TORCH[0]}.{MIN_TORCH[1]}, found "
            f"{version}: before 2.9 gloo's reduce_scatter_tensor silently ignored its reduce op "
            f"(AVG came back as SUM). Upgrade torch, or use the simulated backend (--backend sim).")


# reduce_scatter_tensor/all_gather_into_tensor are deprecated in torch 2.13 in favour of the
# *_single names, which torch 2.9 lacks; use whichever this torch has.
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class TorchDistBackend:
    """One process's side of the collectives, on an initialised torch.distributed group."""

    def __init__(self, group=None, store=None, failure_wait: float = 5.0):
        check_torch_version()
        if not dist.is_initialized():
            raise RuntimeError("TorchDistBackend needs torch.distributed to be initialised "
                               "(dist.init_process_group, torchrun, or zerospec.cluster.processes)")
        self.group = group
        self.store = store                 # where peers report failures; None: no attribution
        self.failure_wait = failure_wait   # seconds to wait for a peer's report after an error
        self.n = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.name = str(dist.get_backend(group))
        self._batch: list | None = None   # (call, work, finish) in flight inside Interconnect.batch
        # calls of the open batch waiting to go as one: (key, Reductions | Gathers, issue)
        self._pending: tuple | None = None
        # gloo's ring order is known (comm/coalesce.py); NCCL's is not: each call goes alone there
        self.coalesce = self.name == "gloo"
        self._groups: dict[tuple[int, ...], object] = {}   # grid group ranks -> process group

    def new_groups(self, groups) -> None:
        """Create a process group for each grid group (comm/groups.py). Every process must call
        this with the same groups in the same order (``dist.new_group`` is collective)."""
        for g in groups:
            if g.ranks not in self._groups:
                self._groups[g.ranks] = (self.group if len(g.ranks) == self.n
                                         else dist.new_group(list(g.ranks)))

    def _pg(self, c: Call):
        """(process group, its size) of a call: its grid group's, or this backend's own."""
        if c.group is None:
            return self.group, self.n
        try:
            return self._groups[c.group.ranks], c.group.size
        except KeyError:
            raise CollectiveError(f"{c.describe()}: group {c.group.name} {list(c.group.ranks)} "
                                  f"was never created (call new_groups first)") from None

    def wire_factor(self, op: str) -> int:
        """Wire elements per ring-model element: 2 for gloo's reduce_scatter (an all-reduce)."""
        return 2 if op == "reduce_scatter" and self.name == "gloo" else 1

    def collective(self, rank: int, call: Call) -> None:
        if rank != self.rank:
            raise CollectiveError(f"this process is rank {self.rank} of the process group, "
                                  f"but the interconnect called it rank {rank}")
        _check_local(call, self._pg(call)[1])
        t0 = time.perf_counter()
        try:
            getattr(self, f"_{call.op}")(call)
        except CollectiveError:
            raise
        except Exception as exc:  # noqa: BLE001 - any transport error becomes a named one
            raise PeerFailure(self._explain(call, exc)) from exc
        call.seconds = time.perf_counter() - t0

    # -- batches (Interconnect.batch) ---------------------------------------------------------------
    def start_batch(self) -> None:
        self._batch = []

    def finish_batch(self, wait: bool = True) -> None:
        """Wait for the batch's collectives in issue order and finish each (divide, copy out)."""
        try:
            if wait:
                self._flush()
        finally:   # the batch is over even if sending its last group failed
            self._pending = None
            pending, self._batch = self._batch or [], None
        if not wait:
            return
        for call, work, finish in pending:
            try:
                work.wait()
            except Exception as exc:  # noqa: BLE001 - as in collective(): name the failure
                err = PeerFailure(self._explain(call, exc))
                err.call = call      # which of the batch failed (Interconnect.batch reads it)
                raise err from exc
            finish()

    def _issue(self, call: Call, start, finish) -> None:
        """``start(async_op)`` the torch collective; ``finish()`` once its data has arrived: now,
        or at the end of the batch if one is open. Same buffers and ops either way: same bits."""
        self._flush()   # keep the issue order: what waits to be fused goes first
        work = start(self._batch is not None)
        if work is None:
            finish()
        else:
            self._batch.append((call, work, finish))

    def _join(self, key: tuple, make, issue):
        """The open batch's group of calls with this ``key``, after sending any other group."""
        if self._pending is not None and self._pending[0] != key:
            self._flush()
        if self._pending is None:
            self._pending = (key, make(), issue)
        return self._pending[1]

    def _flush(self) -> None:
        """Send the waiting group as one collective; it is waited for at the end of the batch."""
        if self._pending is None:
            return
        _, group, issue = self._pending
        self._pending = None
        first = group.parts[0][0]
        try:
            work, finish = group.start(issue)
        except Exception as exc:  # noqa: BLE001 - name the group's call, not the one that flushed it
            err = PeerFailure(self._explain(first, exc))
            err.call = first
            raise err from exc
        self._batch.append((first, work, finish))

    def _coalescing(self) -> bool:
        return self._batch is not None and self.coalesce

    # -- the collectives -------------------------------------------------------------------------
    def _buffer(self, t: torch.Tensor, length: int) -> torch.Tensor:
        buf = torch.zeros(length, dtype=accumulator_dtype(t.dtype), device=t.device)
        buf[:t.numel()].copy_(t.reshape(-1))
        return buf

    def _finish(self, buf: torch.Tensor, op: str, n: int) -> torch.Tensor:
        if op == "mean":
            buf.div_(n)
        return buf

    def _op(self, reduce_op: str):
        return dist.ReduceOp.MAX if reduce_op == "max" else dist.ReduceOp.SUM

    def _reduction(self, c: Call, pg, n: int, length: int, at: int) -> bool:
        """Join the open batch's fused all-reduce (gloo): ``c.inp`` reduced as a buffer of
        ``length`` elements, ``c.out`` its elements from ``at``. False: send the call alone."""
        if not (self._coalescing() and c.out.is_contiguous()):
            return False
        dtype, op = accumulator_dtype(c.inp.dtype), self._op(c.reduce_op)
        group = self._join(("reduce", id(pg), c.reduce_op, dtype),
                           lambda: Reductions(n, dtype, c.reduce_op == "mean"),
                           lambda t: dist.all_reduce(t, op=op, group=pg, async_op=True))
        group.add(c, c.inp, length, c.out, at)
        return True

    def _all_reduce(self, c: Call) -> None:
        pg, n = self._pg(c)
        numel = c.inp.numel()
        length = -(-numel // n) * n              # padded: same order as a reduce-scatter
        if self._reduction(c, pg, n, length, 0):
            return
        buf = self._buffer(c.inp, length)
        self._issue(c, lambda a: dist.all_reduce(buf, op=self._op(c.reduce_op), group=pg,
                                                 async_op=a),
                    lambda: c.out.copy_(self._finish(buf, c.reduce_op, n)[:numel].view(c.out.shape)))

    def _reduce_scatter(self, c: Call) -> None:
        pg, n = self._pg(c)
        # fused: as the all-reduce gloo runs for a reduce-scatter; my chunk is the result
        if self._reduction(c, pg, n, c.inp.numel(), dist.get_rank(pg) * c.out.numel()):
            return
        buf = self._buffer(c.inp, c.inp.numel())      # also breaks any aliasing of out with inp
        out = torch.empty(c.out.numel(), dtype=buf.dtype, device=buf.device)
        self._issue(c, lambda a: _reduce_scatter(out, buf, op=self._op(c.reduce_op), group=pg,
                                                 async_op=a),
                    lambda: c.out.copy_(self._finish(out, c.reduce_op, n).view(c.out.shape)))

    def _all_gather(self, c: Call) -> None:
        pg, n = self._pg(c)
        if self._coalescing():
            group = self._join(("gather", id(pg), c.out.dtype), lambda: Gathers(n, c.out.dtype),
                               lambda o, i: _all_gather(o, i, group=pg, async_op=True))
            return group.add(c, c.inp, c.out)
        inp = c.inp.reshape(-1)
        if shares_storage(inp, c.out):       # stage 1 gathers its own chunk of the output buffer
            inp = inp.clone()
        self._issue(c, lambda a: _all_gather(c.out.view(-1), inp, group=pg, async_op=a),
                    lambda: None)

    def _all_to_all(self, c: Call) -> None:
        """qgZ's all-to-alls (zero/zeropp.py); gloo implements all_to_all_single on CPU."""
        pg, _ = self._pg(c)
        self._issue(c, lambda a: dist.all_to_all_single(c.out.view(-1), c.inp.reshape(-1),
                                                        group=pg, async_op=a), lambda: None)

    def _broadcast(self, c: Call) -> None:
        self._flush()   # not fused: what waits goes first, as it was issued first
        pg, _ = self._pg(c)
        src = c.group.ranks[c.src] if c.group is not None else c.src
        dist.broadcast(c.out, src=dist.get_global_rank(pg, src) if pg and c.group is None else src,
                       group=pg)

    def _barrier(self, c: Call) -> None:
        self._flush()
        dist.barrier(group=self._pg(c)[0])

    # -- failures --------------------------------------------------------------------------------
    def failed_peers(self, wait: float = 0.0) -> dict[int, str]:
        """Peers that reported a failure in the store: rank -> what happened (polls up to ``wait`` s)."""
        if self.store is None:
            return {}
        keys = [FAILED_KEY.format(rank=r) for r in range(self.n)]
        deadline = time.monotonic() + wait
        while True:
            try:
                found = {r: self.store.get(k).decode() for r, k in enumerate(keys)
                         if r != self.rank and self.store.check([k])}
            except Exception:  # noqa: BLE001 - the store died with the launcher: nothing to name
                return {}
            if found or time.monotonic() >= deadline:
                return found
            time.sleep(0.05)

    def _explain(self, call: Call, exc: BaseException) -> str:
        peers = self.failed_peers(self.failure_wait)
        cause = "; ".join(f"rank {r} failed first: {msg}" for r, msg in sorted(peers.items()))
        # gloo prefixes its messages with the C++ source location: keep only what happened
        what = re.sub(r"^\[[^\]]*\]\s*", "", (str(exc).strip().splitlines() or [""])[0])
        return (f"rank {self.rank}: {call.describe()} on {self.name} failed"
                f"{' because ' + cause if cause else ''} ({type(exc).__name__}: {what})")


def _check_local(c: Call, n: int) -> None:
    """What one rank can check alone; cross-rank checks: TORCH_DISTRIBUTED_DEBUG=DETAIL."""
    if c.op == "barrier":
        return
    if c.inp.dtype != c.out.dtype:
        raise CollectiveError(f"{c.describe()}: input dtype {c.inp.dtype} != output dtype {c.out.dtype}")
    if c.op == "reduce_scatter" and c.inp.numel() != n * c.out.numel():
        raise CollectiveError(f"reduce_scatter: input of {c.inp.numel()} elements must be {n} × its "
                              f"output of {c.out.numel()} elements")
    if c.op == "all_gather" and c.out.numel() != n * c.inp.numel():
        raise CollectiveError(f"all_gather: output of {c.out.numel()} elements must be {n} × its "
                              f"input of {c.inp.numel()} elements")
    if c.op in ("reduce_scatter", "all_gather", "broadcast") and not c.out.is_contiguous():
        raise CollectiveError(f"{c.op}: output must be contiguous")


def rank_context(device: str | torch.device = "cpu", *, group=None, store=None,
                 failure_wait: float = 5.0) -> RankContext:
    """This process's RankContext on an initialised process group: its own memory and comm ledgers
    (only its own rank's records are filled; :mod:`zerospec.cluster.processes` merges them)."""
    backend = TorchDistBackend(group, store, failure_wait)
    ctx = RankContext(backend.rank, backend.n, MemoryLedger(device), None)
    ctx.comm = Interconnect(ctx, backend, CommLedger(backend.n))
    return ctx
