"""What DeepSpeed's ZeRO-Offload copies into and out of its host buffers per step, observed.

On its CPU accelerator device and host are the same memory, so there is no PCIe link to watch;
what is DeepSpeed's own is its code path: the fp32 host buffers its offloaded optimizer keeps —
``single_partition_of_fp32_groups`` (ZeRO-1/2, deepspeed/runtime/zero/stage_1_and_2.py) or
``fp32_partitioned_groups_flat`` (ZeRO-3, stage3.py), the fp32 master partitions, and their
``.grad``, the fp32 gradient partitions the host Adam reads. :class:`HostCopies`, a torch function
mode around the engine's backward and step, sees every ``Tensor.copy_`` DeepSpeed makes and books:

* **down**: bytes written into a gradient buffer (DeepSpeed's gradient offload, whatever method
  of its makes the copy: ``async_inplace_copy_grad_to_fp32_buffer_from_gpu``,
  ``_offload_grad_partition_at_boundary``, ...);
* **up**: bytes copied out of a master partition into anything else (the updated parameters back
  to the model's partition: ``bit16_partitions[i].copy_(fp32)`` / ``fp16_partitioned_groups_flat``).

Neither list of method names is read: a copy counts by the storages it touches.
"""
from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode


def host_buffers(optimizer) -> list[torch.Tensor]:
    """The offloaded optimizer's fp32 master partitions (their ``.grad``: its gradient buffers)."""
    for name in ("single_partition_of_fp32_groups", "fp32_partitioned_groups_flat"):
        flats = getattr(optimizer, name, None)
        if flats:
            return [t for t in flats if t is not None]
    raise ValueError(f"{type(optimizer).__name__} keeps no fp32 host partitions: is "
                     f"offload_optimizer on?")


def _storage(t) -> int | None:
    return t.untyped_storage().data_ptr() if isinstance(t, torch.Tensor) else None


class HostCopies(TorchFunctionMode):
    """Counts ``copy_`` bytes into the gradient buffers (down) and out of the masters (up)."""

    def __init__(self, optimizer):
        super().__init__()
        self.optimizer = optimizer
        self.down = self.up = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.copy_ and len(args) >= 2:
            dst, src = args[0], args[1]
            masters = host_buffers(self.optimizer)
            grads = {_storage(m.grad) for m in masters if m.grad is not None}
            flats = {_storage(m) for m in masters}
            if _storage(dst) in grads:
                self.down += dst.numel() * dst.element_size()
            elif _storage(src) in flats and _storage(dst) not in flats:
                self.up += dst.numel() * dst.element_size()
        return func(*args, **kwargs)

    def take(self) -> dict[str, int]:
        """This step's bytes, and the partition's elements; the counters start again."""
        out = {"down": self.down, "up": self.up,
               "elements": sum(m.numel() for m in host_buffers(self.optimizer))}
        self.down = self.up = 0
        return out
