"""Record a rank's complete storage trace for the caching allocator model.

:class:`StorageTrace` records every storage a rank's code makes and lets go, the temporaries the
ledger does not count included (``measure(..., trace=True)``), as a trace for
:func:`~zerospec.runtime.replay.replay` (zerospec/runtime/replay.py: a trace through the
allocator model, by phase, and the first request that does not fit on a device of a capacity).
Given a :class:`~zerospec.runtime.replay.LiveReplay` (``live``), it feeds each event to it as
it is recorded and ends the step at the first OutOfMemory by raising
:class:`~zerospec.runtime.replay.RanOut` (``measure(..., capacity=)``).
"""
from __future__ import annotations

import torch

from .allocator import DEFAULT_STREAM
from .memory import TraceEvent
from .observe import Observer, _host, tensors_in, written_arguments
from .replay import LiveReplay, OOMPoint, PhaseMemory, RanOut, Replay, replay

__all__ = ["LiveReplay", "OOMPoint", "PhaseMemory", "RanOut", "Replay", "StorageTrace", "replay"]


def _plain(func, args, kwargs):
    return func(*args, **kwargs)


_VIEWS: dict = {}   # aten op -> whether its schema makes it a view: every return an alias of an
#                     argument it does not write, and no argument written (``t``, ``expand``)


def _is_view(func) -> bool:
    v = _VIEWS.get(func)
    if v is None:
        rets = func._schema.returns
        v = _VIEWS[func] = bool(rets) and not written_arguments(func) and all(
            r.alias_info is not None and not r.alias_info.is_write for r in rets)
    return v


class StorageTrace(Observer):
    """Every storage one rank's code makes and lets go, as a trace: ``with StorageTrace(ctx) as
    t: ...`` then ``t.trace``. The ledger's trace has only what it counts, and a saved activation
    only from when autograd saves it; a GPU's allocator also serves every temporary — the
    activations a checkpointed forward discards, the activation gradients of backward — and
    their interleaving with long-lived tensors is what fragments memory (C37). The observer
    (zerospec/runtime/observe.py) sees each storage's birth and death; this records them in
    order, with the ledger's phase markers where its snapshots fall, and each storage under the
    ledger's category once the ledger counts it (``""``: a temporary the ledger never counts)."""

    def __init__(self, ctx, kernels=None, live: LiveReplay | None = None):
        super().__init__(ctx, record_peaks=False)   # the trace is the record; peaks go unread
        self.live = live             # fed each event as recorded, until its OutOfMemory
        self._feed = live.feed if live is not None else None
        # a MetaKernelCache not entered as a mode: each op is run through it from here
        self._kernels = kernels
        self._run = kernels.call if kernels is not None else _plain
        self._stale: set[int] = set()   # live keys resized by an op run paused, not yet seen
        self.trace: list[TraceEvent] = []
        self._alloc_at: dict[int, int] = {}      # live storage key -> its alloc event's index
        self._unnamed: set[int] = set()          # live keys the ledger has not counted (yet)
        self._marked = len(ctx.memory.snapshots)
        self._changes = -1                       # the ledger's count at the last look
        log = ctx.memory.trace                   # the ledger's own trace, if it keeps one: what
        self._read = None if log is None else len(log)   # it counted since the last look
        self._ended = False

    def __exit__(self, *exc):
        self._settle()
        # the trace is the step's: a storage still alive at its end (the output's weights) dies
        # when the caller lets the result go, or a collection frees it; not an event of the step
        self._ended = True
        return super().__exit__(*exc)

    @property
    def oom(self) -> OOMPoint | None:
        """The live replay's OutOfMemory (None: none, or no live replay), its phase the next
        marker the trace recorded after it: read it once the step has ended."""
        return self.live.result(self.trace).oom if self.live is not None else None

    def _record(self, ev: TraceEvent) -> None:
        self.trace.append(ev)
        if self._feed is not None and self._feed(ev) is not None:
            self._feed = None       # what the step frees as it unwinds is recorded, not replayed
            raise RanOut(f"the step ran out of memory at trace event {len(self.trace) - 1} of "
                         f"its live replay on {self.live.allocator.capacity} B")

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        """The observer's dispatch less what a trace never reads (peaks, phase labels, written
        counts): every op of a traced meta step passes here, tens of thousands a step. The same
        events in the same order: inputs resized in place first, then the storages born."""
        kwargs = kwargs or {}
        if self._paused or getattr(_host, "depth", 0) > 0:
            out = self._run(func, args, kwargs)
            if written_arguments(func):          # it may have resized one of ours: the next op
                self._note_resized(args, kwargs)   # that reads it says so, as without the cache
            return out
        self._settle()
        out = self._run(func, args, kwargs)
        if not self._stale:   # no input may have been resized before: only this op could
            how = self._kernels.answered if self._kernels is not None else None
            if how == "made":      # from the kernel table: new storages; it writes no argument
                for t in (out,) if isinstance(out, torch.Tensor) else tensors_in(out):
                    self._born(t.untyped_storage(), func, t, None)
                return out
            if how == "written" or _is_view(func):   # nothing ran, or no write and no new storage
                return out
        live, seen = self._live, set()
        for t in tensors_in(args, kwargs):
            st = t.untyped_storage()
            key = st._cdata
            seen.add(key)
            rec = live.get(key)
            if rec is not None and rec.nbytes != st.nbytes():   # an aten-level resize
                self._refresh(st)
        for t in (out,) if isinstance(out, torch.Tensor) else tensors_in(out):
            st = t.untyped_storage()
            key = st._cdata
            if key not in seen and key not in live:
                self._born(st, func, t, None)
        return out

    def _note_resized(self, args, kwargs) -> None:
        for t in tensors_in(args, kwargs):
            st = t.untyped_storage()
            rec = self._live.get(st._cdata)
            if rec is not None and rec.nbytes != st.nbytes():
                self._stale.add(st._cdata)

    def _settle(self) -> None:
        """Before each op: the ledger's snapshots since the last event become phase markers, and
        storages it has counted since get its category (autograd saves a tensor after the op that
        made it; a checkpoint only when its segment's forward returns). Without peaks the
        observer has no pending peak to settle."""
        self._mark()
        ledger = self.ctx.memory
        if ledger.changes == self._changes:      # nothing counted since the last look (most ops)
            return
        log, unnamed = ledger.trace, self._unnamed
        # after a look no unnamed storage is counted, so only what the ledger counted since can
        # be (its trace says which); a look over every unnamed storage where the ledger keeps no
        # trace, or one of them was counted before its birth here (_alloc)
        if self._changes == -1 or self._read is None or log is None:
            keys = list(unnamed)
        else:
            keys = [e.key for e in log[self._read:] if e.op == "alloc" and e.key in unnamed]
        if self._read is not None and log is not None:
            self._read = len(log)
        self._changes, counted = ledger.changes, ledger.counted
        for key in keys:
            entry = counted(key)
            if entry is not None and key in unnamed:
                at = self._alloc_at[key]
                self.trace[at] = self.trace[at]._replace(category=entry[0])
                unnamed.discard(key)

    def _mark(self) -> None:
        snapshots = self.ctx.memory.snapshots
        if len(snapshots) == self._marked:       # no snapshot since the last event (most calls)
            return
        for snap in snapshots[self._marked:]:
            self._record(TraceEvent("phase", label=snap.label))
        self._marked = len(snapshots)

    def _born(self, st: torch.UntypedStorage, func, t: torch.Tensor, label: str | None) -> None:
        super()._born(st, func, t, label)
        self._alloc(st._cdata, st.nbytes())

    def _alloc(self, key: int, nbytes: int) -> None:
        self._alloc_at[key] = len(self.trace)
        self._unnamed.add(key)
        if self.ctx.memory.counted(key) is not None:   # counted already (a storage resized
            self._changes = -1                         # back up): name it at the next settle
        # the rank's current stream (RankContext.on_stream); a context without streams has one
        self._record(TraceEvent("alloc", key, nbytes,
                                stream=getattr(self.ctx, "stream", DEFAULT_STREAM)))

    def _died(self, key: int) -> None:
        super()._died(key)
        if self._ended:
            return
        self._stale.discard(key)
        if key in self._alloc_at:         # not if a resize_(0) let it go already
            self._free(key)

    def _free(self, key: int) -> None:
        self._mark()
        at = self._alloc_at.pop(key)
        self._unnamed.discard(key)
        self._record(TraceEvent("free", key, self.trace[at].nbytes, self.trace[at].category))

    def _refresh(self, st: torch.UntypedStorage) -> None:
        """A storage resized in place (stage 3 lets a gathered unit go with ``resize_(0)``):
        to an allocator, its old block is freed and a block of the new size is taken."""
        key = st._cdata
        rec = self._live.get(key)
        if rec is None or rec.nbytes == st.nbytes():   # not one of ours, or not resized: most calls
            return
        self._stale.discard(key)
        super()._refresh(st)
        if key in self._alloc_at:
            self._free(key)
        if st.nbytes():
            self._mark()
            self._alloc(key, st.nbytes())
