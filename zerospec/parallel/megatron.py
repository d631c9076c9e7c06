"""Megatron-LM's two conjugate operators over one model-parallel group (Shoeybi et al. 2019, §3).

``enter`` (Megatron's *f*) stands before a column-parallel layer: identity in forward (every MP
rank already holds the whole input), all-reduce of the input's gradient in backward (each rank's
slice contributed part of it). ``exit`` (Megatron's *g*) follows a row-parallel layer: all-reduce
of the partial outputs in forward, identity in backward. Per block that is two all-reduces of
B·T·d in forward and two in backward (C33), all over the MP group and booked there.

The all-reduces sum in rank order in fp32 (comm/sim.py), so every MP rank gets the same bits:
whatever follows (LayerNorms, the residual stream, the replicated parameters' gradients) is
identical on every rank of the group without further communication.
"""
from __future__ import annotations

import torch


class TensorParallel:
    """One rank's handle on its MP group: ``n_m`` ranks, collectives through ``comm``."""

    def __init__(self, comm):
        self.comm = comm
        self.n_m = comm.n_ranks
        self.index = comm.rank

    def enter(self, x: torch.Tensor) -> torch.Tensor:
        return _Enter.apply(x, self.comm)

    def exit(self, x: torch.Tensor) -> torch.Tensor:
        return _Exit.apply(x, self.comm)


class _Enter(torch.autograd.Function):
    """f: identity forward, all-reduce (sum) of the gradient backward."""

    @staticmethod
    def forward(ctx, x, comm):
        ctx.comm = comm
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()     # autograd may still hold the incoming buffer
        ctx.comm.all_reduce(grad, "sum")
        return grad, None


class _Exit(torch.autograd.Function):
    """g: all-reduce (sum) of the partial outputs forward, identity backward."""

    @staticmethod
    def forward(ctx, x, comm):
        out = x.contiguous().clone()
        comm.all_reduce(out, "sum")
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad, None
