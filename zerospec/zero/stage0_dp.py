"""Stage 0: plain data parallelism. Every rank holds every model state: 16Ψ bytes (C6).

fp16 parameters (2Ψ) and gradients (2Ψ) and fp32 master, exp_avg, exp_avg_sq (12Ψ) are all
replicated. After backward the gradients are all-reduced (mean), then every rank runs the same
Adam step over all Ψ elements. Communication: one all-reduce of Ψ per step, 2(N−1)/N·Ψ per rank
under the ring model (C21). Units are not padded: nothing is partitioned.

This class is also the base the other stages extend, one override at a time (cumulative, as in the
paper's P_os → P_os+g → P_os+g+p).
"""
from __future__ import annotations

import torch

from ..optim.adam import AdamConfig, adam_update
from ..optim.precision import POLICIES, Precision
from ..paper import theory


class DataParallel:
    stage = 0
    label = theory.stage(0).label          # DP
    pad = False   # stage 0 partitions nothing, so it needs no padding
    resident = True   # every rank keeps the full fp16 parameters between uses (stages 0–2)
    exact_sums = False   # gradients summed exactly in fp64 (zerospec/zero/exact.py)
    shards_leave = False   # gradient shards go to the host inside backward (ZeRO-Offload)
    computes_on_gathered = False   # compute reads a copy of the unit (zero/saved.py unit_leaf)

    def __init__(self, ctx, units, init: list[torch.Tensor], adam: AdamConfig,
                 precision: Precision | None = None, buckets=None, grad_buffer=None):
        """``init``: the full fp32 initial weights of each unit (length ``unit.padded`` or more).
        ``buckets``: None, one collective per unit; else fused buffers with the interconnect's
        signatures (ZeRO-R's C_B, zerospec/zero_r/buffers.py) that gradient reductions and the
        post-step parameter gathers go through. ``grad_buffer``: None, or a reusable slot for the
        gradient in flight (ZeRO-R's M_D for gradients, zero_r/defrag.py; stages 2–3 use it)."""
        self.ctx = ctx
        self.memory = ctx.memory
        self.comm = ctx.comm
        self.fused = ctx.comm if buckets is None else buckets   # what fusable collectives go to
        self.grad_buffer = grad_buffer
        self.units = units
        self.adam = adam
        self.precision = precision or POLICIES["fp16"]
        self.dtype = self.precision.dtype     # working copy of parameters and gradients
        self.optim_elements = 0          # elements the last optimizer step touched
        self._allocate_params(init)
        self._allocate_gradients()
        self._allocate_optimizer(init)

    # -- allocation (each stage overrides what it partitions) -----------------------------------
    def _alloc(self, category: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
        return self.memory.alloc(category, (numel,), dtype)

    def owned_slice(self, u) -> slice:
        """The slice of unit ``u``'s flat (padded) vector whose optimizer state this rank holds:
        all of it in stage 0, chunk ``rank`` from P_os on (clipping and checkpoints read it too)."""
        return slice(0, u.padded)

    def _allocate_optimizer(self, init) -> None:
        self.master, self.exp_avg, self.exp_avg_sq = [], [], []
        for i, (u, w) in enumerate(zip(self.units, init)):
            own = self.owned_slice(u)
            if self.precision.master:
                m = self._alloc("master32", own.stop - own.start, torch.float32)
                m.copy_(w[own])
            else:  # fp32 policy: Adam updates the parameters themselves (no master copy, K = 8)
                m = self._param_chunk(i)
            self.master.append(m)
            self.exp_avg.append(self._alloc("exp_avg", m.numel(), torch.float32))
            self.exp_avg_sq.append(self._alloc("exp_avg_sq", m.numel(), torch.float32))

    def _allocate_gradients(self) -> None:
        self.grad16 = [self._alloc("grad16", u.padded, self.dtype) for u in self.units]

    def _allocate_params(self, init) -> None:
        self.param16 = [self._alloc("param16", u.padded, self.dtype) for u in self.units]
        for p, w in zip(self.param16, init):
            p.copy_(w[:p.numel()])

    def _param_chunk(self, i: int) -> torch.Tensor:
        """This rank's fp16 parameters that mirror its master weights."""
        return self.param16[i][self.owned_slice(self.units[i])]

    # -- forward/backward hooks used by ParamFetcher --------------------------------------------
    def is_resident(self, i: int) -> bool:
        """Whether unit i's full fp16 vector stays on this rank between uses (stages 0–2: all)."""
        return self.resident

    def keep_for_backward(self, i: int) -> bool:
        """Whether unit i, once gathered in forward, is kept until its backward use (stage 3 with
        DeepSpeed's reuse distance, zerospec/zero/stage3_deepspeed.py); the paper's stages: no."""
        return False

    def acquire(self, i: int) -> torch.Tensor:
        """Unit i's full fp16 vector for one use."""
        return self.param16[i]

    def release(self, i: int, full16: torch.Tensor) -> None:
        """End of a use: nothing to free while parameters are replicated."""

    def grad_slot(self, i: int) -> torch.Tensor:
        """Where backward writes unit i's full fp16 gradient."""
        return self.grad16[i]

    def grad_ready(self, i: int, slot: torch.Tensor) -> None:
        """Unit i's local gradient is complete: kept until the synchronisation after backward."""

    def shard_ready(self, i: int, shard: torch.Tensor, op: str) -> None:
        """Hook: unit i's reduced gradient shard, about to leave the device (ZeRO-Offload,
        zerospec/offload/optimizer.py); ``op``: "mean", or "sum" for exact sums. MiCS's replicas
        reduce it here (zero/mics.py)."""

    def end_backward(self) -> None:
        """Backward is over: free what was held for it alone (hpZ's secondary shards, zero/hpz.py)."""

    def zero_grad(self) -> None:
        """Start a step: nothing to clear while each backward overwrites the gradient buffers
        (accumulating stages, zerospec/zero/exact.py, zero their sums here)."""

    # -- after backward ---------------------------------------------------------------------------
    def reduce_gradients(self) -> None:
        with self.fused.batch():   # one unit after another; a real backend overlaps them
            for g in self.grad16:
                self.fused.all_reduce(g, "mean")

    def grad_for_step(self, i: int) -> torch.Tensor:
        """The reduced gradient of unit i that this rank's optimizer step uses (its owned slice):
        what the overflow vote, the clipping norm and Adam read, in every stage."""
        return self.grad16[i][self.owned_slice(self.units[i])]

    def optimizer_step(self, step: int, grad_mul: float = 1.0) -> None:
        """Adam on the owned elements; ``grad_mul`` unscales and clips (zerospec/optim/update.py)."""
        self.optim_elements = 0
        for i in range(len(self.units)):
            adam_update(self.master[i], self.exp_avg[i], self.exp_avg_sq[i], self.grad_for_step(i),
                        step, self.adam, grad_mul)
            self.optim_elements += self.master[i].numel()

    @property
    def master_apart(self) -> bool:
        """Whether the fp32 masters are a copy apart from the parameters, which sync_params
        refreshes from them: in mixed precision, and wherever ZeRO-Offload keeps them (the host)."""
        return self.precision.master

    def sync_params(self) -> None:
        """Refresh the fp16 parameters from the updated masters."""
        if self.master_apart:
            for i in range(len(self.units)):
                self._param_up(i)

    def _param_up(self, i: int) -> None:
        """Unit i's fp16 chunk from its master (ZeRO-Offload copies it up from the host instead,
        zerospec/offload/optimizer.py)."""
        self._param_chunk(i).copy_(self.master[i])

    # -- results -------------------------------------------------------------------------------
    def owned_master(self) -> list[tuple[slice, torch.Tensor]]:
        """(slice of the padded unit, fp32 master) for each unit this rank owns."""
        return [(self.owned_slice(u), m) for u, m in zip(self.units, self.master)]
