"""ZeRO-Offload (B1–B6): the fp32 optimizer states and the Adam step on the host, over stage 2 or 3.

In front of a stage-2 or stage-3 class (:func:`with_offload`): the device keeps the fp16
parameters (2Ψ in stage 2, 2Ψ/N in stage 3) and FWD-BWD; each rank's gradient shard goes down to
the host as soon as the reduce-scatter has made it, inside backward (B5: the transfers overlap the
rest of backward); the host holds fp32 master, momentum and variance of the rank's 1/N (B6) and
runs Adam on them; the updated fp16 parameters go back up. Every copy across PCIe is booked on the
rank's ``host`` link (comm/ledger.py), per direction and phase.

Two modes, labelled, side by side:

* ``paper`` — the minimum of B3/B5: fp16 gradients down (2 bytes per parameter), fp16 parameters
  up (2): 4M per step (M = the rank's share, padded).
* ``deepspeed`` — DeepSpeed's ZeRO-Offload: the device casts its gradient partition to fp32 and
  copies that into an fp32 host buffer (4 bytes down), fp16 parameters up (2): 6M.

Exact: the host Adam is :func:`~zerospec.optim.adam.adam_update`, the same elementwise arithmetic
on the same values (an fp16 gradient cast to fp32 is exact), so an offloaded run is bit-identical
to its stage (tests/claims/test_offload.py).

The ``nvme`` tier (zerospec/offload/nvme.py) keeps master, momentum and variance in files between
steps: the step reads them into host buffers, runs Adam, writes them back (committed together:
all or nothing) and frees the buffers. Host tensors are CPU tensors here as everywhere; what makes
them "host" is the ledger that counts them (``ctx.host``), :func:`off_device` (the device
observers skip them) and the link their copies are booked on.
"""
from __future__ import annotations

import contextlib
import functools

import torch

from ..runtime.memory import MemoryLedger
from ..runtime.observe import off_device
from .nvme import MetaSwap, SwapDir

STATES = ("master32", "exp_avg", "exp_avg_sq")     # ledger categories, in file-name order


class HostOptimizer:
    """The mixin (see the module doc); ``offload``: "cpu" or "nvme"; ``offload_mode``: "paper"
    or "deepspeed"; ``nvme_path``: the NVMe tier's directory (None: a temporary one). In fp32
    (no separate master on the device) the host keeps an fp32 copy of the rank's parameters as
    the master, as DeepSpeed's offload does: 4 bytes down, 4 up."""

    master_apart = True   # the host's masters, whatever the precision
    shards_leave = True   # each gradient shard goes down inside backward (the stage's hook)

    def __init__(self, ctx, *args, offload: str, offload_mode: str = "paper", nvme_path=None,
                 **kwargs):
        self.offload, self.offload_mode = offload, offload_mode
        self.host = ctx.host
        self.nvme: MemoryLedger | None = None
        self.swap: SwapDir | None = None
        if offload == "nvme":
            self.nvme = ctx.nvme
            swap = MetaSwap if ctx.device.type == "meta" else SwapDir   # meta: bytes, no data
            self.swap = swap(nvme_path, getattr(ctx, "global_rank", ctx.rank))
        # what the gradient crosses PCIe as: fp16 (the paper) or fp32 (DeepSpeed)
        self.grad_dtype = torch.float32 if offload_mode == "deepspeed" else None
        self.param_up: list[torch.Tensor | None] = []
        super().__init__(ctx, *args, **kwargs)

    # -- allocation: the states on the host (and on NVMe) ------------------------------------------
    def _host_alloc(self, category: str, numel: int, dtype) -> torch.Tensor:
        with off_device():
            return self.host.alloc(category, (numel,), dtype)

    def _allocate_gradients(self) -> None:
        """The host gradient buffer of the rank's shard: fp16 (paper) or fp32 (DeepSpeed); with
        exact sums the fp64 sum of the step's micro-batches (category ``grad16``, as on the
        device: zerospec/zero/exact.py). The device keeps none between steps (B4's last row)."""
        if self.exact_sums:
            self.grad_dtype = torch.float64   # a partial sum of fp16 values is not an fp16 value
        dtype = self.grad_dtype or self.dtype
        cat = "grad32" if dtype == torch.float32 else "grad16"
        self.grad_host = [self._host_alloc(cat, u.chunk, dtype) for u in self.units]
        self.grad16 = [None] * len(self.units)
        if self.exact_sums:   # what the exact stage zeroes, sums into and divides: on the host
            self.grad_acc = self.grad_host

    def _allocate_optimizer(self, init) -> None:
        self.master, self.exp_avg, self.exp_avg_sq = [], [], []
        for u, w in zip(self.units, init):
            own = self.owned_slice(u)
            m = self._host_alloc("master32", own.stop - own.start, torch.float32)
            with off_device():
                m.copy_(w[own])
            self.master.append(m)
            self.exp_avg.append(self._host_alloc("exp_avg", m.numel(), torch.float32))
            self.exp_avg_sq.append(self._host_alloc("exp_avg_sq", m.numel(), torch.float32))
        self.param_up = [None] * len(self.units)
        if self.swap is not None:
            self._evict(setup=True)

    # -- NVMe: states in files between steps ----------------------------------------------------------
    def _names(self, i: int):
        return [f"{self.units[i].name.replace('/', '.')}.{k}" for k in STATES]

    def _load(self) -> None:
        """Read every unit's states from their files into fresh host buffers (host←NVMe)."""
        lists = (self.master, self.exp_avg, self.exp_avg_sq) = ([], [], [])
        for i, u in enumerate(self.units):
            n = u.chunk
            for cat, name, dst in zip(STATES, self._names(i), lists):
                t = self._host_alloc(cat, n, torch.float32)
                with off_device():
                    self.swap.read(name, t)
                self.comm.book_link("from_nvme", t)
                dst.append(t)

    def _evict(self, setup: bool = False) -> None:
        """Write every unit's states (all committed together, or none), then free the buffers;
        ``setup``: the first write, which the NVMe ledger counts (one file per unit and state,
        for the run)."""
        for i in range(len(self.units)):
            for name, t in zip(self._names(i), (self.master[i], self.exp_avg[i], self.exp_avg_sq[i])):
                self.swap.write(name, t)
                self.comm.book_link("to_nvme", t)
        self.swap.commit()
        if setup:
            for i in range(len(self.units)):
                for cat, name in zip(STATES, self._names(i)):
                    self.nvme.count_storage(cat, hash(str(self.swap.path(name))),
                                            self.master[i].numel() * 4)
        for lst in (self.master, self.exp_avg, self.exp_avg_sq):
            for t in lst:
                self.host.free(t)
        self.master = self.exp_avg = self.exp_avg_sq = None

    @contextlib.contextmanager
    def hold_states(self, write: bool = False):
        """The states in host memory for the block (checkpoint save and restore); ``write``: the
        block changed them, write them back. No-op on the cpu tier."""
        if self.swap is None:
            yield
            return
        self._load()
        ok = False
        try:
            yield
            ok = True
        finally:
            if ok and write:
                self._evict()
            else:
                for lst in (self.master, self.exp_avg, self.exp_avg_sq):
                    for t in lst:
                        self.host.free(t)
                self.master = self.exp_avg = self.exp_avg_sq = None

    # -- backward: each gradient shard down to the host as soon as it exists -------------------------
    def grad_ready(self, i: int, slot: torch.Tensor) -> None:
        """Unit i's gradient reduce-scattered over the DP group into a device shard, which goes
        down (:meth:`_grad_down`) as soon as it is whole: at once without buckets (not posted),
        when its last bucket is reduced with them (ZeRO-R's C_B, zero_r/buffers.py). With exact
        sums the shard is the micro-batch's fp64 sum over the ranks, as the exact stage's."""
        u = self.units[i]
        exact = self.exact_sums
        dtype, op = (torch.float64, "sum") if exact else (self.dtype, "mean")
        shard = self.memory.alloc("buffer" if exact else "grad16", (u.chunk,), dtype, zero=False)
        down = functools.partial(self._grad_down, i, shard)
        if self.fused is not self.comm:   # the bucket casts to the shard's dtype: exact still
            self.fused.reduce_scatter(shard, slot, op, then=down, unit=i)
        elif exact:   # the stage's hook: an fp64 reduce-scatter, or qgZ's (zero/zeropp.py)
            self.reduce_sum(i, shard, slot)
        else:   # the stage's hook: a reduce-scatter, or qgZ's all-to-alls (zero/zeropp.py)
            self.reduce_unit(i, shard, slot)
        if self.grad_buffer is None:
            self.memory.free(slot)
        if self.fused is self.comm:
            down()

    def _grad_down(self, i: int, shard: torch.Tensor) -> None:
        """The reduced shard to the host: copied into the gradient buffer, or (exact sums) into a
        host staging buffer added to the step's sum there, as DeepSpeed's ZeRO-Offload keeps its
        accumulated gradients in host memory (stage_1_and_2.py: ``accumulated_grads_in_cpu``)."""
        self.shard_ready(i, shard, "sum" if self.exact_sums else "mean")   # MiCS: the replicas
        if self.exact_sums:
            part = self._host_alloc("buffer", shard.numel(), torch.float64)
            self.comm.copy_to_host(part, shard)
            self.memory.free(shard)
            with off_device():
                self.grad_host[i].add_(part)   # exact
            self.host.free(part)
            return
        if self.grad_dtype is not None:   # DeepSpeed: cast up on the device, fp32 across PCIe
            up = self.memory.alloc("grad32", (shard.numel(),), self.grad_dtype, zero=False)
            up.copy_(shard)
            self.memory.free(shard)
            shard = up
        self.comm.copy_to_host(self.grad_host[i], shard)
        self.memory.free(shard)

    def zero_grad(self) -> None:
        with off_device():   # exact sums: the host's sums
            super().zero_grad()

    def _average(self) -> None:
        """Exact sums: the one division by N·G, on the host."""
        with off_device():
            super()._average()

    def grad_for_step(self, i: int) -> torch.Tensor:
        return self.grad_host[i]

    # -- the step on the host; parameters up -----------------------------------------------------------
    def optimizer_step(self, step: int, grad_mul: float = 1.0) -> None:
        """Adam on the host (NVMe: between a read and a committed write of the states); leaves
        the updated fp16 parameters on the host for :meth:`param_sync`'s copy up."""
        if self.swap is not None:
            self._load()
        with off_device():
            super().optimizer_step(step, grad_mul)
            for i, m in enumerate(self.master):
                up = self.param_up[i] = self.host.alloc("param16", (m.numel(),), self.dtype,
                                                       zero=False)
                up.copy_(m)     # the one fp32 -> fp16 rounding every stage does
        if self.swap is not None:
            self._evict()

    def _param_up(self, i: int) -> None:
        """The updated fp16 chunk up to the device (host→device), then freed on the host."""
        up = self.param_up[i]
        self.comm.copy_from_host(self._param_chunk(i), up)
        self.host.free(up)
        self.param_up[i] = None

    def owned_master(self) -> list[tuple[slice, torch.Tensor]]:
        if self.swap is None:
            return super().owned_master()
        out = []   # results only (not a step's traffic): read from the files, not booked
        for i, u in enumerate(self.units):
            t = torch.empty(u.chunk, dtype=torch.float32)
            self.swap.read(self._names(i)[0], t)
            out.append((self.owned_slice(u), t))
        return out


@functools.cache
def with_offload(cls: type, params: bool = False) -> type:
    """``cls`` (stage 2 or 3) with ZeRO-Offload's host optimizer in front; ``params``: and
    ZeRO-Infinity's parameter offload to the host before it (stage 3, zerospec/offload/params.py)."""
    if params:
        from .params import HostParams
        from .prefetch import Prefetching
        return type(f"OffloadParams{cls.__name__}", (Prefetching, HostParams, HostOptimizer, cls),
                    {})
    return type(f"Offload{cls.__name__}", (HostOptimizer, cls), {})
