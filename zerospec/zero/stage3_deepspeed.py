"""ZeRO-3 with DeepSpeed's two settings that change what it moves and holds (spec/deepspeed.md).

DeepSpeed's defaults do not run the paper's P_os+g+p: ``stage3_param_persistence_threshold``
keeps every tensor of at most that many elements whole on every GPU (refreshed by an all-gather
after each step, never gathered in forward or backward), and ``stage3_max_reuse_distance`` keeps
a gathered parameter from its forward use to its backward use when fewer than that many
elements are fetched in between (no re-gather in backward). With both at 0 this is the paper's
stage 3, :class:`~.stage3_params.Parameters`, bit for bit and byte for byte.

zerospec's sharding unit is a layer (zerospec/model/units.py), DeepSpeed's a tensor: here the
threshold applies to whole units (the final LayerNorm, a tiny model's blocks), where DeepSpeed
also keeps each block's biases and LayerNorms whole — a few d-sized vectors per block, well
under 1% of Ψ at GPT sizes, left out of this model and said so where it is used
(``zerospec plan --deepspeed-config``). The reuse distance is counted in elements fetched
between a unit's last forward use and its backward use, on the model's fetch order
(:func:`reused_within`), as DeepSpeed counts it on its recorded trace.

Values never change: a persistent unit holds the bits a gather would deliver, a kept unit the
bits a re-gather would. So these runs are bit-identical to stage 3; only the ledgers differ.
"""
from __future__ import annotations

import torch

from .stage3_params import Parameters


def reused_within(order: list[int], units, distance: int) -> frozenset[int]:
    """Units whose backward use follows their last forward use with fewer than ``distance``
    elements fetched in between (DeepSpeed's ``__params_to_release``: it walks the trace after the
    releasing module, stops before a module once ``params_traversed >= max_reuse_dist_in_numel``,
    and adds each visited parameter's ``ds_numel``: strict ``<``, in elements). ``order``: the
    units a forward fetches, in order (backward fetches the reverse, so a unit's backward use
    mirrors its last forward use)."""
    seq = list(order) + list(reversed(order))
    keep = set()
    for i in set(order):
        p = max(k for k, u in enumerate(order) if u == i)
        q = len(seq) - 1 - p
        if sum(units[seq[k]].numel for k in range(p + 1, q)) < distance:
            keep.add(i)
    return frozenset(keep)


class DeepSpeedParameters(Parameters):
    """P_os+g+p with DeepSpeed's persistence threshold and reuse distance (see the module doc).
    ``persistence_threshold``: units of at most this many elements (unpadded) stay whole, as
    DeepSpeed's ``DeepSpeedZeRoOffload.mark_persistent_parameters`` keeps a parameter when
    ``param.ds_numel <= param_threshold``; ``keep``: the units :func:`reused_within` names, kept
    gathered from forward to backward."""

    def __init__(self, ctx, units, init, adam, precision=None, buckets=None, grad_buffer=None,
                 persistence_threshold: int = 0, keep=frozenset()):
        self.persistent = frozenset(i for i, u in enumerate(units) if u.numel <= persistence_threshold)
        self.keep = frozenset(keep) - self.persistent
        super().__init__(ctx, units, init, adam, precision, buckets=buckets, grad_buffer=grad_buffer)

    def _allocate_params(self, init) -> None:
        self.param16 = []
        for i, (u, w) in enumerate(zip(self.units, init)):
            whole = i in self.persistent
            p = self._alloc("param16", u.padded if whole else u.chunk, self.dtype)
            p.copy_(w[:u.padded] if whole else w[u.shard(self.ctx.rank)])
            self.param16.append(p)

    def _param_chunk(self, i: int) -> torch.Tensor:
        p = self.param16[i]
        return p[self.units[i].shard(self.ctx.rank)] if i in self.persistent else p

    def is_resident(self, i: int) -> bool:
        return i in self.persistent

    def keep_for_backward(self, i: int) -> bool:
        return i in self.keep

    def acquire(self, i: int) -> torch.Tensor:
        return self.param16[i] if i in self.persistent else super().acquire(i)

    def release(self, i: int, full16: torch.Tensor) -> None:
        if i not in self.persistent:
            super().release(i, full16)

    def sync_params(self) -> None:
        """Every rank's chunk from its master; the persistent units gathered whole again."""
        if self.master_apart:   # ZeRO-Offload's _param_up copies it up from the host instead
            for i in range(len(self.units)):
                self._param_up(i)
        # one gather per persistent unit, not through C_B's buckets: those stream every unit
        with self.comm.batch():
            for i in sorted(self.persistent):
                self.comm.all_gather(self.param16[i], self._param_chunk(i))
