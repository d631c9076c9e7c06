"""Replay a memory ledger's allocation trace through the caching allocator model.

A trace is a list of :class:`~zerospec.runtime.memory.TraceEvent` (``MemoryLedger(trace=True)``
or ``ledger.record_trace()``): every storage the ledger counted, alloc and free in program
order, with a "phase" marker at each snapshot (the end of that phase). :func:`replay` feeds it to
a :class:`~zerospec.runtime.allocator.CachingAllocator` and reports, per phase, what the program
held (``requested``: the ledger's bytes; ``allocated``: after rounding), what the allocator held
(``reserved``) and its largest free block, with the peaks inside the phase; and, on a device of
``capacity`` bytes, the first request that does not fit.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from .allocator import CachingAllocator, OutOfMemory
from .memory import TraceEvent


@dataclasses.dataclass(frozen=True)
class PhaseMemory:
    """The allocator at the end of phase ``label``, and its peaks since the previous marker."""

    label: str
    requested: int          # bytes the program holds: the ledger's total
    allocated: int          # the same blocks after rounding: torch.cuda.memory_allocated()
    reserved: int           # segments: torch.cuda.memory_reserved()
    largest_free: int       # the largest free cached block
    peak_allocated: int
    peak_reserved: int


@dataclasses.dataclass(frozen=True)
class OOMPoint:
    """Where a replay ran out of memory: trace index ``event``, inside phase ``phase`` (the label
    of the next marker; None past the last one), and the allocator's report then."""

    event: int
    phase: str | None
    error: OutOfMemory

    @property
    def free(self) -> int:
        """Bytes the program did not hold when it ran out (capacity − allocated)."""
        return self.error.free

    @property
    def free_fraction(self) -> float:
        """The "free at OOM" of C30, as a fraction of the device."""
        return self.error.free / self.error.capacity


@dataclasses.dataclass(frozen=True)
class Replay:
    phases: list[PhaseMemory]
    oom: OOMPoint | None
    allocator: CachingAllocator   # its state at the end (or at the OOM)

    @property
    def peak_reserved(self) -> int:
        return self.allocator.peak_reserved

    def by_label(self) -> dict[str, list[PhaseMemory]]:
        out: dict[str, list[PhaseMemory]] = {}
        for p in self.phases:
            out.setdefault(p.label, []).append(p)
        return out


def replay(trace: Iterable[TraceEvent], capacity: int | None = None, *,
           max_split_size: int | None = None, expandable_segments: bool = False) -> Replay:
    """Run ``trace`` through a fresh allocator; stop at the first OutOfMemory (``Replay.oom``).

    A storage key may be reused once its storage is freed (the ledger keys storages by address);
    freeing a key that is not live, or allocating one that is, is an error naming the event."""
    events = list(trace)
    alloc = CachingAllocator(capacity, max_split_size=max_split_size,
                             expandable_segments=expandable_segments)
    live: dict[int, int] = {}     # storage key -> block id
    phases: list[PhaseMemory] = []
    for i, ev in enumerate(events):
        if ev.op == "alloc":
            if ev.key in live:
                raise ValueError(f"trace event {i}: alloc of storage {ev.key}, which is live")
            try:
                live[ev.key] = alloc.malloc(ev.nbytes)
            except OutOfMemory as e:
                phase = next((x.label for x in events[i + 1:] if x.op == "phase"), None)
                return Replay(phases, OOMPoint(i, phase, e), alloc)
        elif ev.op == "free":
            if ev.key not in live:
                raise ValueError(f"trace event {i}: free of storage {ev.key}, which is not live")
            alloc.free(live.pop(ev.key))
        elif ev.op == "phase":
            phases.append(PhaseMemory(ev.label, alloc.requested, alloc.allocated, alloc.reserved,
                                      alloc.largest_free, alloc.peak_allocated,
                                      alloc.peak_reserved))
            alloc.reset_peaks()
        else:
            raise ValueError(f"trace event {i}: unknown op {ev.op!r}; accepted: alloc, free, phase")
    return Replay(phases, None, alloc)
