"""The FSDP2 flavour with ``CPUOffloadPolicy`` (zero/fsdp2.py; spec/fsdp2.md): what
``fully_shard(..., offload_policy=CPUOffloadPolicy())`` keeps on the host and what it copies
across PCIe, each from torch 2.13's ``distributed/fsdp/_fully_shard`` (file, function):

* **On the host**: the fp32 sharded parameters (``_fsdp_param.py::_init_sharded_param``: the
  padded shard ``.cpu()``, pinned when ``pin_memory``), their fp32 sharded gradients
  (``_fsdp_collectives.py::foreach_reduce``: ``new_sharded_grad.to(torch.device("cpu"))``) and
  AdamW's states, which the optimizer makes beside its parameters; the step runs there
  (``_fsdp_api.py::CPUOffloadPolicy``: "the optimizer step runs on CPU with CPU optimizer
  states"). The fp32 shards are still what Adam updates: no master apart, nothing copied up after
  the step. ``param32``, ``shard_grad32``, ``exp_avg``, ``exp_avg_sq`` on the host ledger.
* **Up, before each all-gather** (``_fsdp_param.py::FSDPParam.all_gather_inputs``, which
  ``_get_param_all_gather_inputs`` calls instead of its foreach copy when ``offload_to_cpu``):
  the padded fp32 shard ``.to(device, non_blocking=True)``, then cast to param_dtype; both made
  inside ``foreach_all_gather``'s ``with device_handle.stream(all_gather_copy_in_stream)``. The
  fp32 device copy goes as soon as it is cast; the casts are the all-gather's input, the same
  bytes as the flat copy-in without offload. So every unshard (forward, and backward's re-gather)
  moves 4 bytes per shard element up: ``ag_buffer``'s fp32 part, one unit at a time here, one
  parameter at a time in FSDP2 (zerospec's unit is a flat vector of several).
* **Down, after each reduce-scatter** (``foreach_reduce``): the fp32 reduce-scatter output is
  made on the reduce-scatter stream on the device, as without offload, each unit's part copied to
  the host (4 bytes per shard element), and the output freed once the group's parts are down:
  on the device it is now a transient of the reduce-scatter, ``rs_buffer``. A later micro-step's
  part is copied to the host and added there (``grad._local_tensor += new_sharded_grad``, with
  ``non_blocking`` False so the CPU add waits for the copy).

``pin_memory`` decides whether the host bytes are page-locked and whether the copy down is
asynchronous; it moves no value. Values are the flavour's without offload bit for bit: the copies
are exact, the host's addition and Adam the same fp32 arithmetic on the same operands.
"""
from __future__ import annotations

import torch

from ..runtime.observe import off_device
from .fsdp2 import FSDP2Parameters


class CPUOffloaded(FSDP2Parameters):
    """The flavour under CPUOffloadPolicy (module doc)."""

    shards_leave = True        # each sharded gradient goes down inside backward
    rs_output = "rs_buffer"    # the reduce-scatter output: a device transient, down to the host

    def __init__(self, ctx, *args, **kwargs):
        self.host = ctx.host
        super().__init__(ctx, *args, **kwargs)

    def _on_host(self, category: str, numel: int) -> torch.Tensor:
        with off_device():
            return self.host.alloc(category, (numel,), torch.float32)

    # -- states on the host ----------------------------------------------------------------------
    def _allocate_params(self, init) -> None:
        self.param32 = []
        for u, w in zip(self.units, init):
            p = self._on_host("param32", u.chunk)                         # 4·padded/N B, host
            with off_device():
                p.copy_(w[u.shard(self.ctx.rank)])
            self.param32.append(p)

    def _allocate_optimizer(self, init) -> None:
        self.master = self.param32
        self.exp_avg = [self._on_host("exp_avg", p.numel()) for p in self.param32]
        self.exp_avg_sq = [self._on_host("exp_avg_sq", p.numel()) for p in self.param32]

    def zero_grad(self) -> None:
        """Set to None, as without offload: the host's sharded gradients go."""
        for i, g in enumerate(self.grad32):
            if g is not None:
                self.host.free(g)
                self.grad32[i] = None

    def optimizer_step(self, step: int, grad_mul: float = 1.0) -> None:
        """AdamW on the host's fp32 shards, in place: the next all-gather copies them up."""
        with off_device():
            super().optimizer_step(step, grad_mul)

    # -- across PCIe -----------------------------------------------------------------------------
    def _copy_in(self, j: int, chunk: torch.Tensor) -> None:
        """all_gather_inputs: the host's fp32 shard up (H2D), then its cast to param_dtype; the
        fp32 copy is freed once cast. Called on the all-gather copy-in stream."""
        up = self.memory.alloc("ag_buffer", (chunk.numel(),), torch.float32, zero=False)
        self.comm.copy_from_host(up, self.param32[j])
        chunk.copy_(up)                                                      # fp32 -> param_dtype
        self.memory.free(up)

    def _grad_out(self, j: int, out: torch.Tensor) -> bool:
        """The reduce-scatter output's part down to the host: the sharded gradient, or (a later
        micro-step) added into it there. The device output is the caller's to free."""
        down = self._on_host("shard_grad32", out.numel())
        self.comm.copy_to_host(down, out)
        if self.grad32[j] is None:
            self.grad32[j] = down
        else:
            with off_device():
                self.grad32[j].add_(down)
            self.host.free(down)
        return False


def check(cfg) -> None:
    """The offload settings that have no meaning under CPUOffloadPolicy: ValueError naming the
    value (the pairs the table refuses are training/combine.py's)."""
    if cfg.flavour != "fsdp2" or cfg.offload_optimizer is None:
        return
    if cfg.offload_mode != "paper":
        raise ValueError(f"offload_mode={cfg.offload_mode!r} chooses what ZeRO-Offload's gradient "
                         f"crosses PCIe as; with flavour='fsdp2' CPUOffloadPolicy copies the fp32 "
                         f"reduce-scatter output down and the fp32 shards up before each "
                         f"all-gather, its own choice: accepted only the default, 'paper'")
    if cfg.offload_params not in (None, "cpu"):
        raise ValueError(f"offload_params={cfg.offload_params!r}: with flavour='fsdp2' the "
                         f"parameters go where CPUOffloadPolicy puts them, the host; FSDP2 has no "
                         f"NVMe tier: accepted None or 'cpu' (the same run)")
    if cfg.offload_partition != "bandwidth":
        raise ValueError(f"offload_partition={cfg.offload_partition!r}: with flavour='fsdp2' each "
                         f"rank's host holds its own 1/N shard (CPUOffloadPolicy shards as FSDP2 "
                         f"does): accepted 'bandwidth'")
