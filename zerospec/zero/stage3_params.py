"""Stage 3, P_os+g+p: partition the parameters too. (2+2+K)Ψ/N_d = 16Ψ/N_d bytes per rank (C9).

Only this rank's fp16 chunk of each unit persists. A unit is all-gathered right before each use in
forward and freed after it; backward gathers it again when autograd needs the saved weights (in
reverse order) and frees it after; gradients are reduce-scattered inside backward as in stage 2.
There is no all-gather after the step: each rank refreshes only its own chunk (C24).

Communication per step: Ψ forward gathers + Ψ backward gathers + Ψ reduce-scatter = 3Ψ (C24, C57).
The tied embedding shows where "re-gather" has exceptions, and why the sum still comes to exactly
2 gathers per unit: the embedding unit is gathered twice in forward (token lookup, tied LM head);
the LM head is the last use in forward, so it is kept for backward, which starts with it (as FSDP2
keeps its root); and the lookup's backward needs no weight, so it is never re-gathered.
"""
from __future__ import annotations

import torch

from ..paper import theory
from .stage2_grads import Gradients


class Parameters(Gradients):
    stage = 3
    label = theory.stage(3).label          # P_os+g+p
    resident = False   # a unit exists in full only between acquire and release

    def _allocate_params(self, init) -> None:
        self.param16 = [self._alloc("param16", u.chunk, self.dtype) for u in self.units]
        for u, p, w in zip(self.units, self.param16, init):
            p.copy_(w[u.shard(self.ctx.rank)])

    def _param_chunk(self, i: int) -> torch.Tensor:
        return self.param16[i]

    def acquire(self, i: int) -> torch.Tensor:
        full = self.memory.alloc("gathered", (self.units[i].padded,), self.dtype, zero=False)
        return self.gather_unit(i, full, self.param16[i])

    def gather_unit(self, i: int, full: torch.Tensor, chunk: torch.Tensor) -> torch.Tensor:
        """The hook for how unit i's fp16 chunks become ``full``: one all-gather over the DP
        group (qwZ's int8 gather: zero/zeropp.py; ZeRO-Infinity calls it with the chunk it
        brought up from the host, zerospec/offload/params.py)."""
        return self.comm.all_gather(full, chunk)

    def release(self, i: int, full16: torch.Tensor) -> None:
        self.memory.free(full16)

    def sync_params(self) -> None:
        """Refresh my fp16 chunk only; the next forward gathers what it needs."""
        if self.master_apart:
            for i in range(len(self.units)):
                self._param_up(i)
