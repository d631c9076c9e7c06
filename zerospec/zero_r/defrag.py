"""ZeRO-R's memory defragmentation, M_D (§6.3, C37): activation checkpoints in one contiguous buffer.

Checkpoints live from forward to backward; between them the forward makes and drops every
discarded activation, and backward every recomputed one and every activation gradient. A
caching allocator (zerospec/runtime/allocator.py) places each checkpoint wherever a free block
fits at that moment, so the long-lived blocks end up scattered among short-lived ones, and the
free memory between them comes in pieces too small for the next large request (C30).

**M_D** (DeepSpeed's ``contiguous_memory_optimization``): at a step's first checkpoint, one
buffer for all of its checkpoints is allocated (ceil(L/k) slots of one checkpoint each, ledger
category ``"checkpoints"``); each checkpoint is copied into its slot as it is produced, and the
tensor it came from is let go with the other temporaries. With P_a the slot holds rank j's
1/N_m part (:mod:`.partition`), gathered back as without M_D. The buffer is freed when the last
slot has been read back, in the backward of the step's first segment.

Why allocate at the first checkpoint and free after backward, not once at setup: a checkpoint's
shape (B, T, d) is known only when the first one is produced, and a buffer held through
grad_sync, step and param_sync would add ceil(L/k) checkpoints to those phases' memory, which no
run without M_D has. Per step, its bytes are those of the checkpoints without M_D at the end of
forward (their peak); the allocator's cache hands the same block back next step, which is the
point of it.

What is saved for the recompute: the slot itself cannot be the recompute's input, because the
recompute's saved-tensor hooks would count the buffer again (a storage is counted once); so
without P_a the slot is copied out (``clone``), and with P_a the all-gather's output is new
anyway. Copies move values, never change them: M_D changes no bit of the run.

With P_a+cpu the device keeps no checkpoint, so there is nothing on it to arrange: the
partitioned keeper is used unchanged (zerospec/training/compose.py).
"""
from __future__ import annotations

import torch


class Contiguous:
    """Keep one rank's checkpoints in one buffer per micro-step: ``n`` slots (ceil(L/k)); ``mp``:
    the rank's TensorParallel with P_a (each slot holds rank j's 1/N_m), None without."""

    def __init__(self, memory, n: int, mp=None):
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"n (checkpoints per micro-step) must be an integer >= 1, got {n!r}")
        self.memory = memory      # the rank's device MemoryLedger: the buffer is counted there
        self.n, self.mp = n, mp
        self.buffer: torch.Tensor | None = None
        self.kept = self.restored = 0

    def keep(self, x: torch.Tensor, save) -> list:
        """Copy checkpoint ``x`` (its part, with P_a) into the next slot; autograd saves nothing."""
        flat = x.reshape(-1)
        if self.mp is not None:
            size = flat.numel() // self.mp.n_m
            flat = flat[self.mp.index * size:(self.mp.index + 1) * size]
        if self.buffer is None:   # the step's first checkpoint: now its size is known
            self.buffer = self.memory.alloc("checkpoints", (self.n * flat.numel(),), flat.dtype,
                                            zero=False)   # n · B·T·d (/N_m) elements
        if self.kept == self.n:
            raise RuntimeError(f"checkpoint {self.kept + 1} of a micro-step that has {self.n}")
        slot = self.buffer[self.kept * flat.numel():(self.kept + 1) * flat.numel()]
        slot.copy_(flat)
        self.kept += 1
        save()
        return [x.shape, slot]    # a list: restore drops the slot, so the buffer can die

    def restore(self, kept: list, saved) -> torch.Tensor:
        """The whole checkpoint again, in a storage of its own; frees the buffer after the last."""
        shape, slot = kept
        kept.clear()
        if self.mp is None:
            full = slot.clone()
        else:
            full = torch.empty(slot.numel() * self.mp.n_m, dtype=slot.dtype, device=slot.device)
            self.mp.comm.all_gather(full, slot)
        del slot
        self.restored += 1
        if self.restored == self.kept:   # every slot read back: the step's checkpoints are done
            self.memory.free(self.buffer)
            self.buffer, self.kept, self.restored = None, 0, 0
        return full.view(shape)


class GradientSlot:
    """M_D for gradients (DeepSpeed's ``contiguous_gradients``): one buffer, allocated once at
    setup (ledger category ``"buffer"``), that every unit's fp16 gradient is written into in
    backward before stages 2 and 3 reduce-scatter it — instead of a fresh unit-sized slot per
    unit, made and freed among backward's activations. Its size is the largest padded unit.

    Reused slots must hand the stage what a fresh one does: zeros past the unit's real
    elements (its padding enters the reduce-scatter, and the padding's shard is read by the
    overflow vote and the clipping norm). So :meth:`slot` zeroes that tail; the real elements
    are all written by the fetcher. The same values reach the same collectives: no bit changes."""

    def __init__(self, memory, units, dtype: torch.dtype):
        self.units = units
        self.buffer = memory.alloc("buffer", (max(u.padded for u in units),), dtype)

    def slot(self, i: int) -> torch.Tensor:
        u = self.units[i]
        view = self.buffer[:u.padded]
        view[u.numel:].zero_()
        return view
