"""Stage 2, P_os+g: partition the gradients too. 2Ψ + (2+K)Ψ/N_d bytes per rank (C8).

A full gradient never exists. As soon as backward has produced a unit's fp16 gradient, it is
reduce-scattered into this rank's persistent gradient shard (2Ψ/N) and the unit buffer is freed, so
at most one unit's gradient is in flight (C8: "reduced as soon as backward produces it"). The step
and the parameter all-gather are stage 1's. Communication: Ψ (reduce-scatter) + Ψ (all-gather) = 2Ψ
(C22) — the same bytes as stage 1, moved *during* backward instead of after it: ZeRO-2 is a "when" win.
"""
from __future__ import annotations

import torch

from ..paper import theory
from .stage1_os import OptimizerStates


class Gradients(OptimizerStates):
    stage = 2
    label = theory.stage(2).label          # P_os+g

    def _allocate_gradients(self) -> None:
        self.grad16 = [self._alloc("grad16", u.chunk, self.dtype) for u in self.units]

    def grad_slot(self, i: int) -> torch.Tensor:
        if self.grad_buffer is not None:   # ZeRO-R's M_D: one slot, reused (zero_r/defrag.py)
            return self.grad_buffer.slot(i)
        # one unit in flight. Not zero-filled: backward writes every real element (the unit's
        # parameters tile [0, numel)), so only the padding needs its zeros
        u = self.units[i]
        slot = self.memory.alloc("grad16", (u.padded,), self.dtype, zero=False)
        slot[u.numel:].zero_()
        return slot

    def grad_ready(self, i: int, slot: torch.Tensor) -> None:
        if self.fused is self.comm:
            # posted: the slot is read at once and the rank goes on with its backward, as a GPU
            # does while the reduction runs; reduce_gradients waits for the shard (comm/posted.py)
            self.reduce_unit(i, self.grad16[i], slot, post=True)
        else:   # buckets: copied into the current bucket, reduced when it is full (still in backward)
            self.fused.reduce_scatter(self.grad16[i], slot, "mean", unit=i)
        if self.grad_buffer is None:
            self.memory.free(slot)

    def reduce_unit(self, i: int, out: torch.Tensor, slot: torch.Tensor, post: bool = False) -> None:
        """The hook for how unit i's fp16 gradient ``slot`` becomes this rank's mean shard
        ``out``: one reduce-scatter over the DP group (qgZ's all-to-alls: zero/zeropp.py);
        ``post``: the result may wait until :meth:`reduce_gradients`."""
        self.comm.reduce_scatter(out, slot, "mean", post=post)

    def reduce_gradients(self) -> None:
        """Every unit was reduce-scattered inside backward: wait until each shard is written."""
        self.comm.wait()

    def grad_for_step(self, i: int) -> torch.Tensor:
        return self.grad16[i]
