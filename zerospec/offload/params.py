"""ZeRO-Infinity's parameter offload (``offload_params="cpu" | "nvme"``), over stage 3 with the
optimizer offloaded too: the fp16 parameters live in host memory or in NVMe swap files, never on
the device between uses.

**Where a unit's fp16 bytes live, and how a use fetches them** (``offload_partition``):

* ``"bandwidth"`` — C-I8's *bandwidth-centric partitioning*: every rank keeps its 1/N chunk of
  every unit. A fetch reads the chunk NVMe → host (nvme tier, booked ``from_nvme`` on the rank's
  ``nvme`` link), copies it host → device (``from_host`` on its PCIe link) and all-gathers it on
  the devices: each rank's PCIe link carries 1/N of the unit per fetch.
* ``"owner"`` — the baseline C-I8 compares against (ZeRO-3 / ZeRO-Offload's way): unit i lives
  whole on its owner's host, rank ``i mod N``; a fetch copies all of it over the owner's one PCIe
  link and broadcasts it from the owner. After the step the ranks' updated chunks go up, are
  all-gathered and the owner copies the whole unit down (booked in param_sync).

After the step the host Adam's fp16 result is written where the chunk lives (host buffer, or its
swap file: write to ``.partial``, fsync, rename; zerospec/offload/nvme.py): in bandwidth mode
nothing crosses PCIe in param_sync. No arithmetic changes, so training is bit-identical to stage
3 in every mode. The swap files are the NVMe tier's observer (their sizes, ``os.stat``).

C-I8's prefetcher (NVMe→CPU for operator i+3, CPU→GPU for i+2, the all-gather for i+1) sits in
front of this class (zerospec/offload/prefetch.py); without it each fetch happens when its unit is
used, one hop after the other.

**With DeepSpeed's stage-3 knobs** (zerospec/zero/stage3_deepspeed.py) a persistent unit (the
stage's ``is_resident``) is not offloaded: it stays whole on the device, updated from the host's
Adam and all-gathered in param_sync, as without offload. DeepSpeed's rule:
``Init._partition_param`` (deepspeed/runtime/zero/partition_parameters.py) allocates a partition
on ``local_device`` when ``param.ds_persist``, and the coordinator never releases a persistent
parameter (``PartitionedParameterCoordinator.__params_to_release`` skips ``ds_persist``), so its
whole copy stays on the device. (On NVMe DeepSpeed asks ``swappable_tensor`` first, which takes
only partitions of at least ``min_aio_bytes``, 1 MiB: the default threshold's 10^5 elements make
partitions below it, and the whole copy is on the device either way.) The reuse distance needs
nothing here: a unit kept from forward to backward is simply not fetched again in backward.
"""
from __future__ import annotations

import torch

from ..runtime.observe import off_device
from .nvme import MetaSwap, SwapDir

PARTITIONS = ("bandwidth", "owner")


class HostParams:
    """In front of :class:`~zerospec.offload.optimizer.HostOptimizer` over stage 3; ``offload_params``:
    "cpu" or "nvme"; ``offload_partition``: "bandwidth" or "owner" (module doc)."""

    def __init__(self, ctx, *args, offload_params: str = "cpu", offload_partition: str = "bandwidth",
                 offload_buffer_elements: int | None = None, **kwargs):
        self.offload_params, self.partition = offload_params, offload_partition
        self.buffer_elements, self.staging = offload_buffer_elements, None
        # a second SwapDir on the same rank directory: its own commits, file names apart
        swap = MetaSwap if ctx.device.type == "meta" else SwapDir   # meta: bytes, no file
        self.param_swap = (swap(kwargs.get("nvme_path"), getattr(ctx, "global_rank", ctx.rank))
                           if offload_params == "nvme" else None)
        super().__init__(ctx, *args, **kwargs)

    # -- where this rank's bytes of unit i live -------------------------------------------------------
    def owner(self, i: int) -> int:
        """Unit i's owner in the owner mode: the units dealt round the ranks."""
        return i % self.comm.n_ranks

    def _holds(self, i: int) -> int:
        """Elements of unit i this rank keeps (host or file): its chunk, or all of it / none."""
        u = self.units[i]
        if self.partition == "bandwidth":
            return u.chunk
        return u.padded if self.owner(i) == self.ctx.rank else 0

    def _pname(self, i: int) -> str:
        return f"{self.units[i].name.replace('/', '.')}.param16"

    def _allocate_params(self, init) -> None:
        self.param16 = [None] * len(self.units)
        for i, (u, w) in enumerate(zip(self.units, init)):
            if self.is_resident(i):   # DeepSpeed's persistent unit: whole on the device (doc)
                self.param16[i] = self._alloc("param16", u.padded, self.dtype)
                self.param16[i].copy_(w[:u.padded])
                continue
            n = self._holds(i)
            if not n:
                continue
            src = w[u.shard(self.ctx.rank)] if self.partition == "bandwidth" else w   # padded
            p = self._host_alloc("param16", n, self.dtype)
            with off_device():
                p.copy_(src)
            if self.param_swap is None:
                self.param16[i] = p
                continue
            self.param_swap.write(self._pname(i), p)   # setup: not a step's traffic
            self.param_swap.commit()
            self.ctx.nvme.count_storage("param16", hash(str(self.param_swap.path(self._pname(i)))),
                                    p.numel() * p.element_size())
            self.host.free(p)

    # -- the hops: NVMe -> host, host -> device ------------------------------------------------------
    def _to_host(self, i: int) -> torch.Tensor:
        """This rank's bytes of unit i in host memory: the resident buffer, or read from the
        swap file (NVMe → host, booked on the nvme link) into a fresh host buffer — or into the
        one staging buffer of ``offload_buffer_elements``, allocated once (DeepSpeed's
        ``offload_param.buffer_size``; no prefetch here, so one buffer is enough)."""
        if self.param_swap is None:
            return self.param16[i]
        if self.buffer_elements is not None:
            if self.staging is None:
                self.staging = self._host_alloc("buffer", self.buffer_elements, self.dtype)
            h = self.staging[:self._holds(i)]
            with off_device():
                self.param_swap.read(self._pname(i), h)
            self.comm.book_link("from_nvme", h)
            return h
        h = self._host_alloc("param16", self._holds(i), self.dtype)
        with off_device():
            self.param_swap.read(self._pname(i), h)
        self.comm.book_link("from_nvme", h)
        return h

    def _done_host(self, h: torch.Tensor) -> None:
        if self.param_swap is not None and self.buffer_elements is None:
            self.host.free(h)

    def _store(self, i: int, value: torch.Tensor) -> None:
        """Write the host tensor ``value`` where unit i's bytes of this rank live (host → NVMe)."""
        if self.param_swap is None:
            with off_device():
                self.param16[i].copy_(value)
            return
        self.param_swap.write(self._pname(i), value)
        self.param_swap.commit()
        self.comm.book_link("to_nvme", value)

    def acquire(self, i: int) -> torch.Tensor:
        """Unit i whole on the device (module doc): bandwidth — my chunk up, then the all-gather;
        owner — the owner's whole unit up, then its broadcast."""
        if self.is_resident(i):   # DeepSpeed's persistent unit, on the device (module doc)
            return super().acquire(i)
        u = self.units[i]
        full = self.memory.alloc("gathered", (u.padded,), self.dtype, zero=False)
        if self.partition == "owner":
            if self._holds(i):
                h = self._to_host(i)
                self.comm.copy_from_host(full, h)
                self._done_host(h)
            return self.comm.broadcast(full, src=self.owner(i))
        chunk = self.memory.alloc("param16", (u.chunk,), self.dtype, zero=False)
        h = self._to_host(i)
        self.comm.copy_from_host(chunk, h)
        self._done_host(h)
        self.gather_unit(i, full, chunk)   # the stage's hook: qwZ quantizes it
        self.memory.free(chunk)
        return full

    def _param_up(self, i: int) -> None:
        """The updated fp16 chunk to where it lives: bandwidth — this rank's host buffer or file,
        no PCIe; owner — up, all-gathered, and the whole unit down to the owner's host. A
        persistent unit's chunk goes up to the device, as ZeRO-Offload's does."""
        if self.is_resident(i):
            return super()._param_up(i)
        up = self.param_up[i]
        if self.partition == "bandwidth":
            self._store(i, up)
        else:
            u = self.units[i]
            chunk = self.memory.alloc("param16", (u.chunk,), self.dtype, zero=False)
            self.comm.copy_from_host(chunk, up)
            full = self.memory.alloc("gathered", (u.padded,), self.dtype, zero=False)
            self.comm.all_gather(full, chunk)
            self.memory.free(chunk)
            if self._holds(i) and self.param_swap is None:
                self.comm.copy_to_host(self.param16[i], full)
            elif self._holds(i):
                h = self._host_alloc("param16", u.padded, self.dtype)
                self.comm.copy_to_host(h, full)
                self._store(i, h)
                self.host.free(h)
            self.memory.free(full)
        self.host.free(up)
        self.param_up[i] = None

    # -- checkpoints: the fp16 chunk read from where it lives, and written back -----------------------
    def saved_param16(self, i: int) -> torch.Tensor:
        """This rank's fp16 chunk of unit i for a checkpoint: read from its host buffer or swap
        file (NVMe → host, booked as a fetch's first hop); in the owner layout only the owner
        holds it, so the unit comes up and is broadcast as a fetch does, each rank keeping its
        chunk."""
        if self.partition == "bandwidth":
            h = self._to_host(i)
            with off_device():
                out = h.clone()       # the staging buffer is the next read's
            self._done_host(h)
            return out
        full = self.acquire(i)
        out = full[self.owned_slice(self.units[i])].clone()
        self.release(i, full)
        return out

    def restore_param16(self, i: int, padded: torch.Tensor) -> None:
        """A checkpoint's unit i written where this rank's bytes of it live (host buffer or swap
        file): its chunk (bandwidth), the whole unit on its owner, nothing elsewhere (owner)."""
        if self._holds(i):
            self._store(i, padded[self.units[i].shard(self.ctx.rank)]
                        if self.partition == "bandwidth" else padded)
