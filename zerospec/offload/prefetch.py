"""C-I8's prefetcher, in front of :class:`~zerospec.offload.params.HostParams` (bandwidth layout):
before operator i runs, the NVMe → host read for operator i+3, the host → device copy for i+2 and
the all-gather for i+1 are started (``offload_prefetch=True``).

**Which operator comes next.** The first step runs without prefetch and records the order in
which units are fetched (as DeepSpeed traces its first step); the schedule is the same every
step (the model's fetch order does not depend on the data), so later steps follow the record:
the i-th fetch of a step is the i-th of the trace. A fetch that departs from it is an error, not
a silent wrong unit.

**Starting is doing, here.** The transfers of one rank run one after the other in this simulation,
so "start the transfer for i+3" means: do it now and hold the result until its use. What is
observable is exactly what a prefetcher changes: the order in which the links carry the bytes
(the ledger's records) and what is held meanwhile — on the device the gathered unit i+1 and the
chunk of i+2 while operator i runs, on the host the chunk of i+3 (one buffer: each read follows
the copy up of the one before it, so DeepSpeed's one staging buffer still suffices). The bytes and
the arithmetic are unchanged: training is bit-identical to stage 3. A unit DeepSpeed keeps
persistent (zerospec/offload/params.py) is on the device already: it is not in the trace.
"""
from __future__ import annotations

import torch

AHEAD = (1, 2, 3)   # all-gather for i+1, host→device for i+2, NVMe→host for i+3 (C-I8)


class Prefetching:
    """Before HostParams in the MRO; ``offload_prefetch``: on or off."""

    def __init__(self, ctx, *args, offload_prefetch: bool = False, **kwargs):
        self.prefetch = offload_prefetch
        self.trace: list[int] | None = None      # the first step's fetch order
        self._trace_step = None
        self._step, self._pos = None, 0
        self._host: dict[int, torch.Tensor] = {}
        self._dev: dict[int, torch.Tensor] = {}
        self._full: dict[int, torch.Tensor] = {}
        super().__init__(ctx, *args, **kwargs)

    # -- the three hops, for position q of the trace ---------------------------------------------
    def _hop_host(self, q: int) -> None:
        self._host[q] = self._to_host(self.trace[q])

    def _hop_dev(self, q: int) -> None:
        if q not in self._host:
            self._hop_host(q)
        u = self.units[self.trace[q]]
        chunk = self.memory.alloc("param16", (u.chunk,), self.dtype, zero=False)
        h = self._host.pop(q)
        self.comm.copy_from_host(chunk, h)
        self._done_host(h)
        self._dev[q] = chunk

    def _hop_gather(self, q: int) -> None:
        if q not in self._dev:
            self._hop_dev(q)
        u = self.units[self.trace[q]]
        full = self.memory.alloc("gathered", (u.padded,), self.dtype, zero=False)
        chunk = self._dev.pop(q)
        self.gather_unit(self.trace[q], full, chunk)   # the stage's hook: qwZ quantizes it
        self.memory.free(chunk)
        self._full[q] = full

    def acquire(self, i: int) -> torch.Tensor:
        if not self.prefetch or self.is_resident(i):   # a persistent unit is never fetched
            return super().acquire(i)
        step = self.ctx.step
        if step != self._step:                   # a new step: the trace restarts
            if self._host or self._dev or self._full:
                raise RuntimeError(f"prefetched units left over at step {self._step}: positions "
                                   f"{sorted({*self._host, *self._dev, *self._full})}")
            self._step, self._pos = step, 0
            if self.trace is None:
                self.trace, self._trace_step = [], step
        if step == self._trace_step:             # the first step: record, fetch on use
            self.trace.append(i)
            return super().acquire(i)
        p, n = self._pos, len(self.trace)
        if p >= n or self.trace[p] != i:
            raise RuntimeError(f"fetch {p} of step {step} is unit {i}, the first step's trace "
                               f"has {self.trace[p] if p < n else 'no more fetches'}: the fetch "
                               f"order changed, the prefetcher cannot follow")
        self._pos += 1
        if p not in self._full:
            self._hop_gather(p)
        held = (self._full, self._dev, self._host)     # a position is in at most one
        for ahead, hop in zip(AHEAD, (self._hop_gather, self._hop_dev, self._hop_host)):
            q = p + ahead          # i+1 gathered, i+2 up on the device, i+3 read from NVMe
            if q < n and not any(q in h for h in held[:ahead]):
                hop(q)
        return self._full.pop(p)
