"""Replay a memory ledger's allocation trace through the caching allocator model.

A trace is a list of :class:`~zerospec.runtime.memory.TraceEvent` (``MemoryLedger(trace=True)``
or ``ledger.record_trace()``): every storage the ledger counted, alloc and free in program
order, with a "phase" marker at each snapshot (the end of that phase). :func:`replay` feeds it to
a :class:`~zerospec.runtime.allocator.CachingAllocator` (each alloc on its event's stream) and reports, per phase, what the program
held (``requested``: the ledger's bytes; ``allocated``: after rounding), what the allocator held
(``reserved``) and its largest free block, with the peaks inside the phase; and, on a device of
``capacity`` bytes, the first request that does not fit.

:class:`LiveReplay` is the same replay fed one event at a time while the program runs
(:class:`~zerospec.runtime.trace.StorageTrace`'s ``live``), so that a step can end at its first
OutOfMemory (:class:`RanOut`) instead of being traced to its end and replayed after.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

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
    samples: list[tuple[int, int]] = dataclasses.field(default_factory=list)
    #        replay(samples=True): (allocated, reserved) after each alloc and free, for a figure

    @property
    def peak_allocated(self) -> int:
        """The most bytes allocated at any point of the replay (the allocator's peaks restart at
        each phase marker: the phases' peaks and its own since the last marker)."""
        return max([p.peak_allocated for p in self.phases] + [self.allocator.peak_allocated])

    @property
    def peak_reserved(self) -> int:
        """The most bytes reserved at any point of the replay: PyTorch's max cached memory. Not
        the allocator's own peak, which restarts at each marker and may follow a release of
        cached segments (an OOM's retry)."""
        return max([p.peak_reserved for p in self.phases] + [self.allocator.peak_reserved])


class RanOut(Exception):
    """A traced step ended at its first OutOfMemory on its live replay (``StorageTrace(live=)``);
    the OOMPoint is the live replay's (``StorageTrace.oom``) once the trace has its next marker."""


class LiveReplay:
    """:func:`replay`, one event at a time: ``feed(event)`` until it answers an OutOfMemory, then
    ``result(trace)``, where ``trace`` holds the events fed and any that followed (the OOM's
    phase is the label of the next marker, as :func:`replay` names it). Fed a whole trace, it
    is :func:`replay` (which runs through it)."""

    def __init__(self, capacity: int | None = None, *, max_split_size: int | None = None,
                 expandable_segments: bool = False, samples: bool = False):
        self.allocator = CachingAllocator(capacity, max_split_size=max_split_size,
                                          expandable_segments=expandable_segments)
        self.fed = 0                            # events fed: the next one's trace index
        self.phases: list[PhaseMemory] = []
        self.series: list[tuple[int, int]] | None = [] if samples else None
        self.failed: tuple[int, OutOfMemory] | None = None   # (event, error) of the OOM
        self._blocks: dict[int, int] = {}      # live storage key -> block id

    def feed(self, ev: TraceEvent) -> OutOfMemory | None:
        """Serve one event; the OutOfMemory if its alloc does not fit (the replay ends there).
        A storage key may be reused once its storage is freed (the ledger keys storages by
        address); freeing a key that is not live, or allocating one that is, is an error naming
        the event."""
        i, alloc, blocks = self.fed, self.allocator, self._blocks
        if self.failed is not None:
            raise ValueError(f"trace event {i}: fed after the OutOfMemory at event {self.failed[0]}")
        self.fed = i + 1
        op = ev.op
        if op == "alloc":
            if ev.key in blocks:
                raise ValueError(f"trace event {i}: alloc of storage {ev.key}, which is live")
            try:
                blocks[ev.key] = alloc.malloc(ev.nbytes, ev.stream)
            except OutOfMemory as e:
                self.failed = (i, e)
                return e
        elif op == "free":
            if ev.key not in blocks:
                raise ValueError(f"trace event {i}: free of storage {ev.key}, which is not live")
            alloc.free(blocks.pop(ev.key))
        elif op == "phase":
            self.phases.append(PhaseMemory(ev.label, alloc.requested, alloc.allocated,
                                           alloc.reserved, alloc.largest_free,
                                           alloc.peak_allocated, alloc.peak_reserved))
            alloc.reset_peaks()
            return None
        else:
            raise ValueError(f"trace event {i}: unknown op {op!r}; accepted: alloc, free, phase")
        if self.series is not None:
            self.series.append((alloc.allocated, alloc.reserved))
        return None

    def result(self, trace: Sequence[TraceEvent] = ()) -> Replay:
        """The replay so far. At an OOM its phase is the label of the first marker after it in
        ``trace`` (None if none follows); a step ended there (:class:`RanOut`) has it where the
        phase it ran out in was left: phases do not nest in a step, so it is the one the whole
        step would have next."""
        oom = None
        if self.failed is not None:
            i, error = self.failed
            phase = next((x.label for x in trace[i + 1:] if x.op == "phase"), None)
            oom = OOMPoint(i, phase, error)
        return Replay(self.phases, oom, self.allocator,
                      self.series if self.series is not None else [])


def replay(trace: Iterable[TraceEvent], capacity: int | None = None, *,
           max_split_size: int | None = None, expandable_segments: bool = False,
           samples: bool = False) -> Replay:
    """Run ``trace`` through a fresh allocator; stop at the first OutOfMemory (``Replay.oom``).
    Errors as :meth:`LiveReplay.feed`."""
    events = trace if isinstance(trace, Sequence) else list(trace)
    live = LiveReplay(capacity, max_split_size=max_split_size,
                      expandable_segments=expandable_segments, samples=samples)
    feed = live.feed
    for ev in events:
        if feed(ev) is not None:
            break
    return live.result(events)
