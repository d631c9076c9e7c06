"""ZeRO-R's partitioned activation checkpointing, P_a, and its CPU offload, P_a+cpu (§6.1, C32–C35).

With model parallelism every MP rank holds the same checkpoint (a block's input is the residual
stream, whole on every rank after the row-parallel all-reduce). **P_a** keeps only rank j's
1/N_m of it: the flattened checkpoint, cut into N_m equal parts (B·T·d divides by N_m because
d does: the heads split). Before the recompute, one all-gather over the MP group rebuilds it —
booked in the ledger like any collective (C33: its volume is one B·T·d per checkpoint, against
the 2 + 2 + 2 all-reduces of B·T·d MP already does per block).

**P_a+cpu** moves the part to host memory right away: the device keeps nothing of it between
forward and backward (C35); the host ledger holds it under ``"checkpoints"``; the device→host and
host→device copies are booked in the comm ledger on the rank's own link (group ``"host"``), so the
bytes they move are read from there: twice the part, per checkpoint.

The part kept on the device is saved through autograd's saved-tensor hooks, so it is counted
under ``"checkpoints"`` exactly as a whole checkpoint is; what the all-gather rebuilds is the
recompute's input, counted as ``"recomputed"`` when the recompute saves it, as without P_a.
Gathering returns the same values, so P_a changes no bit of the run.

**Without model parallelism** (N_m = 1) the partition is taken over a group of one, as DeepSpeed
takes it (deepspeed/runtime/activation_checkpointing/checkpointing.py, 0.19.8: ``mp_size`` stays 1
without an mpu, so ``get_partition_size`` is the whole tensor and
``gather_partitioned_activations`` returns it without a collective): P_a keeps the whole
checkpoint in a storage of its own (``partition_activations``' ``clone``), P_a+cpu keeps it on the
host. **cpu_checkpointing without partition_activations** is DeepSpeed's ``elif CPU_CHECKPOINT``
branch of ``CheckpointFunction.forward``: the whole checkpoint copied to the host
(``copy_to_device``), at any N_m, and copied back before the recompute (``move_to_device``) —
the same keeper with no group (``mp`` None). Neither moves a value: no bit changes.
"""
from __future__ import annotations

import torch


class Partitioned:
    """How one rank keeps its checkpoints: 1/N_m each on the device, or on the host (``cpu``).
    ``mp``: the rank's TensorParallel (zerospec/model/megatron.py) to partition over, or None: a
    group of one (no MP, or cpu_checkpointing without P_a), the whole checkpoint kept.
    ``comm``: the rank's communicator, whose own link books the host copies."""

    def __init__(self, comm, mp=None, cpu: bool = False, host=None):
        self.comm = comm
        self.mp = mp
        self.n = 1 if mp is None else mp.n_m
        self.cpu = cpu
        self.host = host          # the rank's host MemoryLedger (P_a+cpu)

    def keep(self, x: torch.Tensor, save) -> tuple:
        """Keep rank j's part of checkpoint ``x``; ``save`` is autograd's save_for_backward."""
        j = 0 if self.mp is None else self.mp.index
        flat = x.reshape(-1)
        size = flat.numel() // self.n
        part = flat[j * size:(j + 1) * size]
        if self.cpu:
            host = self.comm.to_host(part)
            self.host.track("checkpoints", host)
            save()
            return (x.shape, host)
        save(part.clone())        # its own storage: x itself is let go
        return (x.shape, None)

    def restore(self, kept: tuple, saved) -> torch.Tensor:
        """The whole checkpoint again: the part (back from the host), all-gathered over MP."""
        shape, host = kept
        if host is not None:
            part = self.comm.from_host(host, self.comm.ctx.device)
            self.host.free(host)
        else:
            part, = saved
        if self.mp is None:       # a group of one: the part is the whole checkpoint
            return part.view(shape)
        full = torch.empty(part.numel() * self.n, dtype=part.dtype, device=part.device)
        self.mp.comm.all_gather(full, part)
        return full.view(shape)
