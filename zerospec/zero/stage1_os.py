"""Stage 1, P_os: partition the optimizer states. 4Ψ + KΨ/N_d bytes per rank (C7).

Rank r holds fp32 master, exp_avg and exp_avg_sq only for its chunk of each unit (12Ψ/N) and
updates only that chunk; fp16 parameters and gradients stay replicated (4Ψ). After the step, the
updated fp16 chunks are all-gathered so every rank has the full parameters again (Ψ).

Two decompositions of the gradient synchronisation, both "ZeRO-1" (C22, C23; the seed's nuance):

* ``reduce_scatter`` (the paper's 2Ψ): reduce-scatter the gradients (Ψ) — each rank only needs the
  mean gradient of the chunk it updates — then all-gather the parameters (Ψ). Same volume as DP.
* ``all_reduce`` (the seed's and DeepSpeed's first ZeRO-1, 3Ψ = 1.5× DP): all-reduce the gradients
  (2Ψ) so every rank holds the full mean gradient, then all-gather the parameters (Ψ).

Either way the full fp16 gradient buffer is resident through the step, which is what makes the
memory 4Ψ + 12Ψ/N rather than stage 2's 2Ψ + 14Ψ/N.
"""
from __future__ import annotations

from ..paper import theory
from ..paper.theory import ZERO1_COMM
from .stage0_dp import DataParallel


class OptimizerStates(DataParallel):
    stage = 1
    label = theory.stage(1).label          # P_os
    pad = True

    def __init__(self, ctx, units, init, adam, precision=None, zero1_comm: str = "reduce_scatter",
                 buckets=None, grad_buffer=None):
        if zero1_comm not in ZERO1_COMM:
            raise ValueError(f"unknown ZeRO-1 variant {zero1_comm!r}; accepted: {', '.join(ZERO1_COMM)}")
        self.zero1_comm = zero1_comm
        super().__init__(ctx, units, init, adam, precision, buckets, grad_buffer)

    def owned_slice(self, u) -> slice:
        return u.shard(self.ctx.rank)

    def reduce_gradients(self) -> None:
        with self.fused.batch():
            for u, g in zip(self.units, self.grad16):
                if self.zero1_comm == "all_reduce":
                    self.fused.all_reduce(g, "mean")
                else:  # the mean of my chunk lands in my chunk of the (still resident) buffer
                    self.fused.reduce_scatter(g[u.shard(self.ctx.rank)], g, "mean")

    def sync_params(self) -> None:
        super().sync_params()
        with self.fused.batch():
            for i, u in enumerate(self.units):
                self.fused.all_gather(self.param16[i], self._param_chunk(i))
