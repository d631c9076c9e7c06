"""Per-device byte ledger (design property 2): memory is counted where tensors are made.

Every persistent or transient buffer the stage code holds is allocated through :meth:`MemoryLedger.alloc`
(or registered with :meth:`MemoryLedger.track`) under a category, and released with
:meth:`MemoryLedger.free`. Bytes are the real ``nbytes`` of what is held (numel × element size), so
tests compare with ``==``. Activations come in through ``saved_tensors_hooks`` (see
:mod:`zerospec.zero.saved`), deduplicated by storage.

Temporary casts made only because CPU kernels compute in fp32 (fp16 storage cast up for one op) are
*not* counted: a GPU would not make them. That is the one deliberate omission.
"""
from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import NamedTuple

import torch

# activations: what autograd saves in forward; checkpoints: the inputs of checkpointed segments
# (kept from forward to backward); recomputed: a segment's activations saved again by its
# recompute in backward and freed as its backward consumes them (zerospec/zero_r/checkpointing.py)
# bucket: the fused buffer gradients are reduced and parameters gathered through, C_B or the naive
# whole-model one (zerospec/zero_r/buffers.py)
# secondary16: hpZ's fp16 secondary shard of each unit, held from forward to backward (zero/hpz.py)
# grad32: DeepSpeed's ZeRO-Offload gradient partition cast to fp32 (zerospec/offload/)
# param32, shard_grad32: the FSDP2 flavour's fp32 sharded parameters (what Adam updates) and fp32
# sharded gradients; ag_buffer, rs_buffer: its flat all-gather and reduce-scatter buffers
# (zerospec/zero/fsdp2_collectives.py; under CPUOffloadPolicy also the fp32 copy of each shard up
# and the reduce-scatter output on its way down, zerospec/zero/fsdp2_offload.py)
CATEGORIES = ("param16", "grad16", "master32", "exp_avg", "exp_avg_sq", "gathered",
              "activations", "checkpoints", "recomputed", "buffer", "bucket", "secondary16",
              "grad32", "param32", "shard_grad32", "ag_buffer", "rs_buffer")
ACTIVATIONS = ("activations", "checkpoints", "recomputed")
MODEL_STATES = ("param16", "grad16", "master32", "exp_avg", "exp_avg_sq", "param32",
                "shard_grad32")
_KNOWN = frozenset(CATEGORIES)   # membership test on every track (each saved activation)


def storage_key(t: torch.Tensor) -> int:
    """Identity of the storage behind ``t`` (views share it; works for meta tensors too)."""
    return t.untyped_storage()._cdata


class TraceEvent(NamedTuple):
    """One entry of a ledger's allocation trace (``MemoryLedger(trace=True)``), in program order:
    ``op`` is "alloc" or "free" (of storage ``key``, ``nbytes`` bytes, under ``category``) or
    "phase" (a :meth:`MemoryLedger.snapshot`: the phase ``label`` ends here). The allocator model
    replays it (zerospec/runtime/replay.py); an alloc's ``stream`` is the stream the owner makes
    it on (``RankContext.on_stream``), which decides which cached blocks it may reuse."""

    op: str
    key: int = 0
    nbytes: int = 0
    category: str = ""
    label: str = ""
    stream: str = "default"


@dataclasses.dataclass(frozen=True)
class Snapshot:
    label: str
    current: dict[str, int]
    total: int
    peak_total: int


class MemoryLedger:
    """Current and peak bytes per category for one device."""

    def __init__(self, device: torch.device | str = "cpu", *, trace: bool = False):
        self.device = torch.device(device)
        self.trace: list[TraceEvent] | None = [] if trace else None   # see record_trace
        self.current: dict[str, int] = {c: 0 for c in CATEGORIES}
        self.peak: dict[str, int] = {c: 0 for c in CATEGORIES}
        self.peak_total = 0
        self._total = 0                      # sum of current, kept as it changes (hot path)
        self.changes = 0                     # counts and frees so far: "has anything changed?"
        self.snapshots: list[Snapshot] = []
        self._live: dict[int, tuple[str, int]] = {}

    # -- allocation -------------------------------------------------------------------------------
    def alloc(self, category: str, shape, dtype: torch.dtype, *, zero: bool = True) -> torch.Tensor:
        """A new tensor on this device, counted under ``category`` until :meth:`free`."""
        make = torch.zeros if zero else torch.empty
        return self.track(category, make(shape, dtype=dtype, device=self.device))

    def track(self, category: str, t: torch.Tensor) -> torch.Tensor:
        """Count an existing tensor's whole storage under ``category``."""
        self.count_storage(category, storage_key(t), t.untyped_storage().nbytes())
        return t

    def count_storage(self, category: str, key: int, nbytes: int) -> None:
        """:meth:`track` for the storage with :func:`storage_key` ``key`` and size ``nbytes``, by
        a caller that has both at hand (the saved-tensor hooks, once per saved activation)."""
        if category not in _KNOWN:
            raise ValueError(f"unknown memory category {category!r}; accepted: {', '.join(CATEGORIES)}")
        if key in self._live:
            raise ValueError(f"storage already counted under {self._live[key][0]!r}")
        self._live[key] = (category, nbytes)
        self._add(category, nbytes)
        if self.trace is not None:
            self.trace.append(TraceEvent("alloc", key, nbytes, category))

    def free(self, t: torch.Tensor) -> None:
        """Release a counted tensor; freeing what was never allocated is an error."""
        key = storage_key(t)
        if key not in self._live:
            raise ValueError(f"free of a tensor this ledger never allocated (shape {tuple(t.shape)}, "
                             f"{t.dtype}) on {self.device}")
        self.free_storage(key)

    def free_storage(self, key: int) -> None:
        """:meth:`free` by :func:`storage_key` (of a storage counted here)."""
        category, nbytes = self._live.pop(key)
        self._add(category, -nbytes)
        if self.trace is not None:
            self.trace.append(TraceEvent("free", key, nbytes, category))

    def counted(self, key: int) -> tuple[str, int] | None:
        """(category, bytes) of the live storage with :func:`storage_key` ``key``; None if uncounted."""
        return self._live.get(key)

    def _add(self, category: str, nbytes: int) -> None:
        self.changes += 1
        cur = self.current[category] = self.current[category] + nbytes
        if cur > self.peak[category]:
            self.peak[category] = cur
        self._total += nbytes
        if self._total > self.peak_total:
            self.peak_total = self._total

    # -- queries ---------------------------------------------------------------------------------
    @property
    def total(self) -> int:
        return self._total

    def model_states(self) -> int:
        """Bytes of parameters, gradients and optimizer states held now (C1's model states)."""
        return sum(self.current[c] for c in MODEL_STATES)

    def snapshot(self, label: str) -> Snapshot:
        snap = Snapshot(label, dict(self.current), self.total, self.peak_total)
        self.snapshots.append(snap)
        if self.trace is not None:
            self.trace.append(TraceEvent("phase", label=label))
        return snap

    def snapshots_by_label(self) -> dict[str, list[Snapshot]]:
        out: dict[str, list[Snapshot]] = defaultdict(list)
        for s in self.snapshots:
            out[s.label].append(s)
        return dict(out)

    def record_trace(self) -> list[TraceEvent]:
        """Start recording every alloc, free and phase marker from now on (what ``trace=True``
        does at construction; a cluster's ledgers are made before its run, so a caller turns the
        trace on here). Activations come in through track/free too (zerospec/zero/saved.py)."""
        if self.trace is None:
            self.trace = []
        return self.trace

    def reset_peaks(self) -> None:
        """Start a new peak window from what is held now (e.g. at the start of a step)."""
        self.peak = dict(self.current)
        self.peak_total = self.total
