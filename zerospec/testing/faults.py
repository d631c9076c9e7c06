"""Fault hooks for tests: ``with inject_overflow(step=2, rank=0): train(cfg)``.

A hook patches one narrow seam of the library for the duration of a ``with`` block, as torch's
FSDP test utilities patch ``reduce_scatter``; the library never imports this module, and a run
outside the block is the plain product. The seam here is
:meth:`zerospec.zero.fetch.ParamFetcher.grad_written`, which sees each unit's fp16 gradient after
the cast and before the stage takes it (stages 2/3 reduce-scatter it right after).

The patch is on the class, so it reaches every run in this process while the block is open (runs
in parallel threads included; pytest-xdist's workers are processes, each with its own). Ranks on
real processes run in forkserver children, which a patch in the parent does not reach: enter the
hook inside each rank, as :func:`train_rank_with_overflow` does for ``launch`` (see
tests/engine/test_robust_engine.py).
"""
from __future__ import annotations

import contextlib
import weakref
from unittest import mock

import torch

from ..training.run import train_rank
from ..runtime.memory import MemoryLedger
from ..zero.fetch import ParamFetcher


def poison_last(grad: torch.Tensor) -> None:
    """Make the last element inf. In the embedding unit (unit 0) it lies in the last rank's shard,
    so in stages 2 and 3 only that rank sees the inf after the reduce-scatter: a test that all
    ranks skip the step fails unless the overflow decision is a collective."""
    grad.view(-1)[-1] = float("inf")


@contextlib.contextmanager
def inject_overflow(step: int, rank: int, unit: int = 0):
    """Inside the block, rank ``rank``'s (global, on the N_d × N_m grid) gradient of unit ``unit``
    gets an inf at step ``step`` (in its first micro-batch), in every run. Raises ValueError on exit if no run reached that
    (step, rank, unit): a hook that never fires would make its test vacuous."""
    for name, value, low in (("step", step, 1), ("rank", rank, 0), ("unit", unit, 0)):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ValueError(f"inject_overflow {name} must be an integer >= {low}, got {value!r}")
    done: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # fetcher -> step poisoned
    seen = {"step": 0, "rank": -1, "unit": -1, "fired": 0}

    def grad_written(fetcher, i: int, grad16: torch.Tensor) -> None:
        ctx = fetcher.stage.ctx
        me = getattr(ctx, "global_rank", ctx.rank)   # with N_m > 1 the stage sees its DP group
        seen.update(step=max(seen["step"], ctx.step), rank=max(seen["rank"], me),
                    unit=max(seen["unit"], i))
        # once per run and step: a later micro-batch of the same step stays clean (G > 1)
        if (ctx.step, me, i) == (step, rank, unit) and done.get(fetcher) != step:
            done[fetcher] = step
            seen["fired"] += 1
            poison_last(grad16)

    with mock.patch.object(ParamFetcher, "grad_written", grad_written):
        yield
    if not seen["fired"]:
        raise ValueError(f"inject_overflow(step={step}, rank={rank}, unit={unit}) never fired: the "
                         f"runs inside reached steps 1..{seen['step']}, ranks 0..{seen['rank']}, "
                         f"units 0..{seen['unit']}")


def train_rank_with_overflow(ctx, cfgs, step: int, rank: int) -> list[dict]:
    """:func:`zerospec.training.run.train_rank` with :func:`inject_overflow` entered inside this
    rank's process: a per-rank function for :func:`zerospec.cluster.processes.launch`."""
    hook = inject_overflow(step, rank) if ctx.rank == rank else contextlib.nullcontext()
    with hook:
        return train_rank(ctx, cfgs)


@contextlib.contextmanager
def uninitialized_memory(value: float = float("nan")):
    """Inside the block, every ledger allocation made without zeros (``alloc(zero=False)``: gathered
    units, stage 2/3 gradient slots, buckets, fp64 buffers) comes back filled with ``value``, as
    memory a device allocator hands out may hold anything. A stage that reads such a buffer before
    writing it then computes with NaN instead of the zeros a fresh page happens to hold. Yields a
    dict whose ``"poisoned"`` counts the allocations filled (a test can check it is not vacuous)."""
    seen = {"poisoned": 0}
    alloc = MemoryLedger.alloc

    def poisoned(ledger, category, shape, dtype, *, zero=True):
        t = alloc(ledger, category, shape, dtype, zero=zero)
        if not zero and t.device.type != "meta":
            t.fill_(value if dtype.is_floating_point else -1)
            seen["poisoned"] += 1
        return t

    with mock.patch.object(MemoryLedger, "alloc", poisoned):
        yield seen


@contextlib.contextmanager
def inject_nvme_fault(step: int, write: int = 1, errno_: int = 28, fraction: float = 0.5,
                      kill: bool = False):
    """Inside the block, the ``write``-th swap-file write (counted from 1) of step ``step``
    (ctx.step of the first rank to reach it) writes ``fraction`` of its bytes, then fails with
    OSError ``errno_`` (28: ENOSPC, the disk is full; 30: EROFS) — or, ``kill``, kills this
    process with SIGKILL, as a crash mid-write would, leaving the ``.partial`` file half written.
    The seam is :func:`zerospec.offload.nvme.write_bytes`; the step is read from the caller's
    frames' ``self.ctx``. Yields a dict whose ``"fired"`` says whether it did."""
    import inspect
    import os
    import signal

    from ..offload import nvme

    seen = {"fired": 0, "writes": 0}
    real = nvme.write_bytes

    def faulty(f, data):
        frame = inspect.currentframe().f_back
        ctx = None
        while frame is not None and ctx is None:
            me = frame.f_locals.get("self")
            ctx = getattr(me, "ctx", None)
            frame = frame.f_back
        if ctx is None or ctx.step != step or seen["fired"]:
            return real(f, data)
        seen["writes"] += 1
        if seen["writes"] < write:
            return real(f, data)
        seen["fired"] += 1
        real(f, data[:int(len(data) * fraction)])
        f.flush()
        if kill:
            os.fsync(f.fileno())
            os.kill(os.getpid(), signal.SIGKILL)
        raise OSError(errno_, os.strerror(errno_))

    with mock.patch.object(nvme, "write_bytes", faulty):
        yield seen
