"""Gradient accumulation over G micro-batches, exact, so every stage keeps the same bits.

The paper's layouts disagree on *when* gradients are reduced once a step has several micro-batches:

* stages 0 and 1 keep a full gradient buffer anyway, so each rank sums its G micro-batch
  gradients locally and reduces once per step (comm per step independent of G);
* stages 2 and 3 never hold a full gradient, so each micro-batch's unit gradient is
  reduce-scattered as backward produces it and added into the rank's shard (G reduce-scatters per
  step: DeepSpeed's ZeRO-2 design).

Stage 0 thus computes Σ_r (Σ_k g_rk) and stage 2 computes Σ_k (Σ_r g_rk). In rounding arithmetic
these differ (DeepSpeed issue #1488 reports stage-dependent losses under accumulation). zerospec
makes both sums *exact*, so their order cannot matter: every g_rk is the micro-batch's fp16
gradient (as with G = 1), fp16 numbers are integer multiples of 2^-24 below 2^16 in magnitude, so
a sum of up to 2^13 of them needs at most 40 + 13 = 53 significant bits — fp64's significand. The
accumulators and the reductions that feed them are therefore fp64 ("sum", never "mean"); the one
rounding is the final division by N·G. The exactness bound is checked: N·G ≤ 8192 and fp16
gradients only (bf16 and fp32 gradients span too many binades for fp64).

Costs, honestly booked: the gradient buffer holds 8 bytes per element instead of 2 (full in stages
0/1, a 1/N shard in stages 2/3), and gradient reductions move fp64 — the same *elements* as the
paper counts (C20), 4× the bytes. The same mixins run with G = 1 when ``exact_grads`` is set, which
makes a trajectory depend only on the set of micro-batches, not on how they are spread over ranks
and micro-steps (spec/checkpoints.md uses this to continue an N-rank checkpoint on M ranks).

The exact stages are declared by name below, one per stage (``ExactDataParallel`` …
``ExactParameters``), each its stage class with the layout's mixin in front; ``EXACT_STAGES`` maps
a stage number to its exact class.
"""
from __future__ import annotations

import functools

import torch

from .stage0_dp import DataParallel
from .stage1_os import OptimizerStates
from .stage2_grads import Gradients
from .stage3_params import Parameters

MAX_TERMS = 2 ** 13   # fp16 values summed exactly in fp64: 40 + log2(terms) <= 53 bits


class _Exact:
    """What both layouts share: fp64 buffers, a zeroed start, one division by N·G."""

    exact_sums = True

    def __init__(self, *args, grad_accum_steps: int = 1, **kwargs):
        self.accum_steps = grad_accum_steps
        super().__init__(*args, **kwargs)

    def grad_slot(self, i: int) -> torch.Tensor:
        """One unit's fp16 micro-batch gradient in flight (the same rounding as without
        accumulation); with contiguous gradients (M_D), the one reused slot's view."""
        if self.grad_buffer is not None:
            return self.grad_buffer.slot(i)
        return self._alloc("grad16", self.units[i].padded, self.dtype)

    def reduce_sum(self, i: int, out: torch.Tensor, slot: torch.Tensor) -> None:
        """The hook for how unit i's fp16 micro-batch gradient ``slot`` becomes this rank's
        shard of the sum over the ranks, in ``out`` (fp64): widened, then an fp64 reduce-scatter
        (exact). qgZ's quantized sum: zero/zeropp.py; ZeRO-Offload and qgZ's buckets call it."""
        wide = self.memory.alloc("buffer", (self.units[i].padded,), torch.float64, zero=False)
        wide.copy_(slot)                   # exact; the wire carries fp64 so the sum stays exact
        self.comm.reduce_scatter(out, wide, "sum")
        self.memory.free(wide)

    def _done_with(self, slot: torch.Tensor) -> None:
        """The micro-batch's slot is read: freed, unless it is M_D's reused one."""
        if self.grad_buffer is None:
            self.memory.free(slot)

    def zero_grad(self) -> None:
        for a in self.grad_acc:
            a.zero_()

    def _average(self) -> None:
        """The one rounding: the exact sum over N ranks and G micro-batches, divided by N·G."""
        for i in range(len(self.units)):
            self.grad_for_step(i).div_(self.ctx.n_ranks * self.accum_steps)


class FullAccumulation(_Exact):
    """Stages 0 and 1: each rank sums its micro-batch gradients, one reduction per step."""

    def _allocate_gradients(self) -> None:
        self.grad_acc = [self._alloc("grad16", u.padded, torch.float64) for u in self.units]  # 8Ψ

    def grad_ready(self, i: int, slot: torch.Tensor) -> None:
        self.grad_acc[i].add_(slot)        # fp16 into fp64: exact
        self.memory.free(slot)

    def reduce_gradients(self) -> None:
        with self.fused.batch():
            for u, a in zip(self.units, self.grad_acc):
                if self.stage == 0 or self.zero1_comm == "all_reduce":
                    self.fused.all_reduce(a, "sum")
                else:
                    self.fused.reduce_scatter(a[u.shard(self.ctx.rank)], a, "sum")
        self._average()

    def grad_for_step(self, i: int) -> torch.Tensor:
        return self.grad_acc[i][self.owned_slice(self.units[i])]


class ShardedAccumulation(_Exact):
    """Stages 2 and 3: reduce-scatter every micro-batch's unit gradient into the owned shard."""

    def _allocate_gradients(self) -> None:
        self.grad_acc = [self._alloc("grad16", u.chunk, torch.float64) for u in self.units]  # 8Ψ/N

    def grad_ready(self, i: int, slot: torch.Tensor) -> None:
        if self.fused is not self.comm:   # buckets: the bucket is fp64: the cast and the sums stay exact
            self.fused.reduce_scatter(self.grad_acc[i], slot, "sum", accumulate=True, unit=i)
            self._done_with(slot)
            return
        u = self.units[i]
        wide = self.memory.alloc("buffer", (u.padded,), torch.float64, zero=False)
        wide.copy_(slot)                   # exact; the wire carries fp64 so the sum stays exact
        self._done_with(slot)
        part = self.memory.alloc("buffer", (u.chunk,), torch.float64, zero=False)
        self.comm.reduce_scatter(part, wide, "sum")
        self.memory.free(wide)
        self.grad_acc[i].add_(part)        # exact
        self.memory.free(part)

    def reduce_gradients(self) -> None:
        """Every micro-batch was reduce-scattered inside its backward; only the division is left."""
        self._average()

    def grad_for_step(self, i: int) -> torch.Tensor:
        return self.grad_acc[i]


class ExactDataParallel(FullAccumulation, DataParallel):
    """Stage 0 with exact gradient sums: a full fp64 sum per rank, one all-reduce per step."""


class ExactOptimizerStates(FullAccumulation, OptimizerStates):
    """P_os with exact gradient sums: a full fp64 sum per rank, one reduction per step."""


class ExactGradients(ShardedAccumulation, Gradients):
    """P_os+g with exact gradient sums: each micro-batch reduce-scattered into an fp64 shard."""


class ExactParameters(ShardedAccumulation, Parameters):
    """P_os+g+p with exact gradient sums: each micro-batch reduce-scattered into an fp64 shard."""


EXACT_STAGES = {0: ExactDataParallel, 1: ExactOptimizerStates, 2: ExactGradients, 3: ExactParameters}


@functools.cache
def with_exact(cls: type) -> type:
    """A stage-3 variant (DeepSpeed's ZeRO-3, zero/stage3_deepspeed.py) with exact sums in front."""
    return type(f"Exact{cls.__name__}", (ShardedAccumulation, cls), {})
