"""What every backend checks and shares about a collective, whatever moves its data.

``check_calls`` is the cross-rank check of one collective (the same op, reduce op, dtypes and
shapes on every rank; N × chunk sizes; contiguous outputs): the thread backend runs it on all N
calls, the meta backend on its one. ``accumulator_dtype`` is the dtype a reduction sums in, the
same in every backend so that their roundings agree; ``reduce_step`` and ``reduce_end`` are the
simulator's rank-ordered reduction one input at a time, shared by its blocking calls (all inputs at
once) and its posted ones (each as it comes, comm/posted.py), so the two cannot differ by a bit.
"""
from __future__ import annotations

import torch

from .interconnect import Call


def accumulator_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp64 sums in fp64, every other float dtype in fp32 (rounded once to its dtype at the end)."""
    return torch.float64 if dtype == torch.float64 else torch.float32 if dtype.is_floating_point else dtype


def reduce_step(acc: torch.Tensor | None, t: torch.Tensor, op: str,
                scratch: torch.Tensor | None = None) -> torch.Tensor:
    """The next rank's ``t`` into a rank-ordered reduction: the first makes the accumulator (a copy
    in the accumulator dtype), each later one is added (``max``: maximised) into it in place.

    ``scratch`` (the accumulator's shape and dtype): where ``t`` is cast up before the addition, the
    exact cast the addition would make into a temporary of its own (same bits, no allocation)."""
    if acc is None:
        return t.to(accumulator_dtype(t.dtype), copy=True)
    if op == "max":
        return torch.maximum(acc, t, out=acc)
    if scratch is not None and t.dtype != acc.dtype:
        t = scratch.copy_(t)
    return acc.add_(t)


def reduce_end(acc: torch.Tensor, op: str, n: int) -> torch.Tensor:
    """The reduction of ``n`` inputs, finished: ``mean`` divides the sum by ``n`` once."""
    return acc.div_(n) if op == "mean" else acc


def _shapes(calls: list[Call], attr: str) -> str:
    return ", ".join(f"rank {r} {tuple(getattr(c, attr).shape)}" for r, c in enumerate(calls))


def check_calls(calls: list[Call], n: int) -> str | None:
    """A description of what is wrong with this collective across ranks, or None."""
    ops = {c.op for c in calls}
    if len(ops) > 1:
        return "ranks called different collectives: " + ", ".join(
            f"rank {r} {c.describe()}" for r, c in enumerate(calls))
    op = calls[0].op
    if op == "barrier":
        return None
    if len({c.reduce_op for c in calls}) > 1:
        return "reduce ops differ: " + ", ".join(f"rank {r} {c.reduce_op}" for r, c in enumerate(calls))
    if len({c.inp.dtype for c in calls} | {c.out.dtype for c in calls}) > 1:
        return f"{op}: dtypes differ: " + ", ".join(
            f"rank {r} {c.inp.dtype}->{c.out.dtype}" for r, c in enumerate(calls))
    if len({tuple(c.inp.shape) for c in calls}) > 1:
        return f"{op}: input shapes differ across ranks: {_shapes(calls, 'inp')}"
    if op == "broadcast" and len({c.src for c in calls}) > 1:
        return "broadcast: ranks name different src: " + ", ".join(
            f"rank {r} src={c.src}" for r, c in enumerate(calls))
    for r, c in enumerate(calls):
        if op == "reduce_scatter" and c.inp.numel() != n * c.out.numel():
            return (f"reduce_scatter: rank {r} input of {c.inp.numel()} elements {tuple(c.inp.shape)} "
                    f"must be {n} × its output of {c.out.numel()} elements {tuple(c.out.shape)}")
        if op == "all_gather" and c.out.numel() != n * c.inp.numel():
            return (f"all_gather: rank {r} output of {c.out.numel()} elements {tuple(c.out.shape)} "
                    f"must be {n} × its input of {c.inp.numel()} elements {tuple(c.inp.shape)}")
        if op == "all_to_all" and (c.inp.numel() != c.out.numel() or c.inp.numel() % n):
            return (f"all_to_all: rank {r} input of {c.inp.numel()} elements and output of "
                    f"{c.out.numel()} must be equal and split into {n} pieces")
        if op in ("reduce_scatter", "all_gather", "all_to_all") and not c.out.is_contiguous():
            return f"{op}: rank {r} output must be contiguous"
    return None
