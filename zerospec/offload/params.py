"""ZeRO-Infinity's parameter offload to the host (``offload_params="cpu"``), over stage 3 with
the optimizer offloaded too: the fp16 parameter chunks live in host memory, not on the device.

Each use of a unit copies this rank's chunk host→device (booked on its PCIe link) and all-gathers
it on the devices: C-I8's *bandwidth-centric partitioning* — every rank's PCIe link carries 1/N of
the parameter per fetch, where a broadcast from one owner would put all of it on one link. After
the step the host Adam's fp16 result is written into the host chunk directly: nothing goes up
over PCIe in param_sync. No arithmetic changes, so training is bit-identical to stage 3.

Not built: the NVMe tier for parameters, and C-I8's prefetcher (NVMe→CPU for operator i+3,
CPU→GPU for i+2, the all-gather for i+1): each fetch here happens when its unit is used.
"""
from __future__ import annotations

import torch

from ..runtime.observe import off_device


class HostParams:
    """In front of :class:`~zerospec.offload.optimizer.HostOptimizer` over stage 3."""

    def _allocate_params(self, init) -> None:
        self.param16 = [self._host_alloc("param16", u.chunk, self.dtype) for u in self.units]
        with off_device():
            for u, p, w in zip(self.units, self.param16, init):
                p.copy_(w[u.shard(self.ctx.rank)])

    def acquire(self, i: int) -> torch.Tensor:
        """Unit i whole on the device: my chunk up over PCIe (1/N of it), then the all-gather."""
        u = self.units[i]
        chunk = self.memory.alloc("param16", (u.chunk,), self.dtype, zero=False)
        self.comm.copy_from_host(chunk, self.param16[i])
        full = self.memory.alloc("gathered", (u.padded,), self.dtype, zero=False)
        self.comm.all_gather(full, chunk)
        self.memory.free(chunk)
        return full

    def _param_up(self, i: int) -> None:
        """The updated fp16 chunk stays on the host: copied into the host chunk, no PCIe."""
        up = self.param_up[i]
        with off_device():
            self.param16[i].copy_(up)
        self.host.free(up)
        self.param_up[i] = None
