"""An independent memory observer (design property 2): it sees every storage a rank creates and
when it dies, without the stage code's cooperation, so a leak the ledger was never told about shows.

:class:`Observer` is a ``TorchDispatchMode``: every aten op a thread runs under it passes through
``__torch_dispatch__``, whose outputs reveal each storage at birth (a storage among an op's outputs
that was none of its inputs'); a weak reference on the storage object reports its death (torch
keeps one Python object per storage for the storage's lifetime, so the callback fires when the
memory is released, not when a wrapper goes). Bytes are ``untyped_storage().nbytes()``, the same
quantity the ledger counts, so the two compare with ``==``.

Why not ``torch.distributed._tools.mem_tracker.MemTracker`` (which works on torch 2.13, CPU and
meta)? The virtual cluster runs all ranks as threads of one process. Dispatch modes live on a
per-thread stack, so a mode entered in a rank's thread sees only that rank's ops — which is what
attributes each storage to its rank — but MemTracker also installs process-wide state on enter and
removes it on exit (nn.Module and optimizer hooks, and a patch of ``UntypedStorage.resize_``), so N
trackers entered and left by N threads in turn undo each other. Its unit of attribution is the
``nn.Module``; this functional model has none. The mode here keeps no global state but one
reference-counted ``resize_`` patch that tells every live observer (``resize_`` on a storage is
no aten op, and stage 3 frees its compute casts with it), and adds what the claims need: peaks
per phase (the ledger's snapshot labels, ``"forward@1"``), the ledger's category of each storage
live at a peak, and elements written per ledger category (C7: what Adam touches).

Cost: ~40 µs per op; the first dispatch mode in a process also imports ``torch._dynamo`` (a few
seconds, once; FlopCounterMode pays the same).
"""
from __future__ import annotations

import contextlib
import dataclasses
import threading
import weakref
from collections import defaultdict

import torch

from .dispatch import DispatchMode


_host = threading.local()   # how deep this thread is in off_device() blocks


@contextlib.contextmanager
def off_device():
    """Storages made (and written) inside live in host memory, not on the rank's device: every
    observer skips them (P_a+cpu's host copies, comm/interconnect.py). Per thread, as the
    observers are."""
    _host.depth = getattr(_host, "depth", 0) + 1
    try:
        yield
    finally:
        _host.depth -= 1


@dataclasses.dataclass(frozen=True)
class LiveStorage:
    """One storage live at a peak: its bytes, the ledger's category (None: the ledger does not
    count it), the op that made it with the dtype and shape it made, and the phase it was born in."""

    nbytes: int
    category: str | None
    op: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    born: str

    def __str__(self) -> str:
        shape = "×".join(map(str, self.shape)) or "scalar"
        return (f"{self.nbytes:>9,} B  {self.category or 'NOT IN LEDGER':<13} {self.op} -> "
                f"{str(self.dtype).removeprefix('torch.')}[{shape}] (born {self.born})")


@dataclasses.dataclass(frozen=True)
class Peak:
    """The most bytes live at once during one phase, what the ledger counted at that instant, and
    every storage live then (largest first)."""

    label: str
    bytes: int
    ledger_bytes: int
    live: tuple[LiveStorage, ...]
    keys: tuple[int, ...] = dataclasses.field(default=(), repr=False, compare=False)

    def extras(self) -> list[LiveStorage]:
        """The live storages the ledger does not count."""
        return [s for s in self.live if s.category is None]

    def describe(self) -> str:
        return "\n".join([f"{self.label}: {self.bytes:,} B observed, {self.ledger_bytes:,} B in the "
                          f"ledger; live storages:"] + [f"  {s}" for s in self.live])


@dataclasses.dataclass
class Observation:
    """What one rank's observer saw per phase label: ``peaks``; ``entries``, what was live when
    the phase's first op ran (a quiet point: the previous phase has finished and let go); and
    ``written[label][category]``, elements written by in-place and ``out=`` ops into storages
    the ledger counts under ``category`` (None: storages it does not count)."""

    peaks: dict[str, Peak]
    entries: dict[str, Peak]
    written: dict[str, dict[str | None, int]]


class _Tracked:
    __slots__ = ("ref", "nbytes", "op", "dtype", "shape", "born")


class Observer(DispatchMode):
    """Observe one thread's storages: ``with Observer(ctx) as obs: ...`` then ``obs.observation``.

    ``ctx``: anything with ``phase_name``, ``step`` and ``memory`` (a RankContext) — phases are
    labelled as the ledger labels its snapshots and each storage gets the ledger's category; None:
    one phase, ``"run"``, and no categories. Storages that existed before entering are not counted.

    ``side="host"``: observe the rank's host memory instead — only the storages made inside
    :func:`off_device` blocks (ZeRO-Offload's states and the host Adam's temporaries, P_a+cpu's
    copies), categorised by the rank's host ledger (``ctx.host``); the device side skips exactly
    those.

    ``record_peaks=False``: follow the storages' lives only (``current``: bytes live now), with no
    peaks, entries or written counts and no ``observation`` — for a subclass that records something
    else (:class:`~zerospec.runtime.trace.StorageTrace`), which would otherwise pay for a listing of
    every live storage at each new peak.
    """

    def __init__(self, ctx=None, *, record_peaks: bool = True, side: str = "device"):
        super().__init__()
        if side not in ("device", "host"):
            raise ValueError(f"side must be 'device' or 'host', got {side!r}")
        self.host_side = side == "host"
        self.ctx = ctx
        self.record_peaks = record_peaks
        self.current = 0
        self._live: dict[int, _Tracked] = {}      # storage key -> what we know of it
        self._peaks: dict[str, Peak] = {}
        self._written: dict[str, dict] = defaultdict(lambda: defaultdict(int))
        self._entries: dict[str, Peak] = {}
        self._pending: Peak | None = None         # the last peak, until the next op settles it
        self._label: str | None = None
        self._paused = 0

    # -- the mode --------------------------------------------------------------------------------
    def __enter__(self):
        _resize_patch.add(self)
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            _resize_patch.discard(self)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self._paused or (getattr(_host, "depth", 0) > 0) != self.host_side:
            return func(*args, **kwargs)
        self._settle()
        label = self._phase() if self.record_peaks else None
        out = func(*args, **kwargs)
        inputs = tensors_in(args, kwargs)
        storages = [t.untyped_storage() for t in inputs]   # a new Python object per call: once
        seen = {st._cdata for st in storages}
        for st in storages:    # aten-level resizes (resize_, out= of another size) show here
            self._refresh(st)
        for k, name, kwarg_only in written_arguments(func) if self.record_peaks else ():
            written = args[k] if k < len(args) and not kwarg_only else kwargs.get(name)
            for t in (written if isinstance(written, (list, tuple)) else [written]):
                if isinstance(t, torch.Tensor):
                    self._written[label][self._category(t.untyped_storage())] += t.numel()
        grew = False
        for t in tensors_in(out):
            st = t.untyped_storage()
            if st._cdata not in seen and st._cdata not in self._live:
                self._born(st, func, t, label)
                grew = True
        if grew and self.record_peaks:
            self._check_peak(label)
        return out

    @contextlib.contextmanager
    def paused(self):
        """Storages made inside are not this rank's (the simulator moving data for every rank)."""
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    # -- bookkeeping -----------------------------------------------------------------------------
    def _phase(self) -> str:
        ctx = self.ctx
        label = "run" if ctx is None else f"{ctx.phase_name}@{ctx.step}"
        if label != self._label:   # a new phase starts with what is live at its entry
            self._label = label
            if label not in self._peaks:
                self._peaks[label] = self._entries[label] = self._snapshot(label)
        return label

    def _settle(self) -> None:
        """Give the last peak the categories the ledger took before this op: ``ledger.alloc``
        makes a storage (the op that set the peak) and counts it right after, with no op between."""
        peak, self._pending = self._pending, None
        if peak is None or not any(s.category is None for s in peak.live):
            return
        ledger, late, live = self._ledger(), 0, []
        for key, s in zip(peak.keys, peak.live):
            entry = ledger.counted(key) if s.category is None and key in self._live else None
            if entry is not None:
                s, late = dataclasses.replace(s, category=entry[0]), late + s.nbytes
            live.append(s)
        if late:
            self._peaks[peak.label] = dataclasses.replace(
                peak, ledger_bytes=peak.ledger_bytes + late, live=tuple(live))

    def _born(self, st: torch.UntypedStorage, func, t: torch.Tensor, label: str | None) -> None:
        key = st._cdata
        rec = _Tracked()
        rec.ref = weakref.ref(st, lambda _, key=key: self._died(key))
        rec.nbytes = st.nbytes()
        if self.record_peaks:   # what a peak's snapshot lists
            rec.op, rec.dtype, rec.shape, rec.born = str(func), t.dtype, tuple(t.shape), label
        self._live[key] = rec
        self.current += rec.nbytes

    def _died(self, key: int) -> None:
        rec = self._live.pop(key, None)
        if rec is not None:
            self.current -= rec.nbytes

    def _refresh(self, st: torch.UntypedStorage) -> None:
        rec = self._live.get(st._cdata)
        if rec is not None and rec.nbytes != st.nbytes():
            grew = st.nbytes() > rec.nbytes
            self.current += st.nbytes() - rec.nbytes
            rec.nbytes = st.nbytes()
            if grew and self.record_peaks and not self._paused:
                self._check_peak(self._phase())

    def _ledger(self):
        """The ledger this observer checks: the rank's device ledger, or its host ledger."""
        if self.ctx is None:
            return None
        return self.ctx.host if self.host_side else self.ctx.memory

    def _category(self, st: torch.UntypedStorage) -> str | None:
        ledger = self._ledger()
        entry = ledger.counted(st._cdata) if ledger is not None else None
        return entry[0] if entry is not None else None

    def _check_peak(self, label: str) -> None:
        if self.current > self._peaks[label].bytes:
            self._peaks[label] = self._snapshot(label)
            self._pending = self._peaks[label] if self.ctx is not None else None

    def _snapshot(self, label: str) -> Peak:
        ledger = self._ledger()
        rows = []
        for key, rec in self._live.items():
            if rec.nbytes:
                entry = ledger.counted(key) if ledger is not None else None
                rows.append((LiveStorage(rec.nbytes, entry[0] if entry else None, rec.op,
                                         rec.dtype, rec.shape, rec.born), key))
        rows.sort(key=lambda row: (-row[0].nbytes, row[0].op))
        return Peak(label, self.current, ledger.total if ledger is not None else 0,
                    tuple(r[0] for r in rows), tuple(r[1] for r in rows))

    @property
    def observation(self) -> Observation:
        if not self.record_peaks:
            raise RuntimeError("this Observer was made with record_peaks=False: it kept no peaks, "
                               "entries or written counts to report")
        self._settle()
        return Observation(dict(self._peaks), dict(self._entries),
                           {k: dict(v) for k, v in self._written.items()})


class _ResizePatch:
    """``UntypedStorage.resize_`` is no aten op, so no dispatch mode sees it. While any observer is
    active it is wrapped to tell each of them (each checks whether the storage is one of its own);
    the last observer to leave restores torch's method. Reference-counted under a lock, so
    observers in several threads and clusters come and go independently."""

    def __init__(self):
        self.lock = threading.Lock()
        self.observers: set[Observer] = set()
        self.original = None

    def add(self, obs: Observer) -> None:
        with self.lock:
            if not self.observers:
                self.original = original = torch.UntypedStorage.resize_

                def resize_(st, size):
                    result = original(st, size)
                    for o in list(self.observers):
                        o._refresh(st)
                    return result
                torch.UntypedStorage.resize_ = resize_
            self.observers.add(obs)

    def discard(self, obs: Observer) -> None:
        with self.lock:
            self.observers.discard(obs)
            if not self.observers and self.original is not None:
                torch.UntypedStorage.resize_ = self.original
                self.original = None


_resize_patch = _ResizePatch()


def tensors_in(args, kwargs=None) -> list[torch.Tensor]:
    """The tensors among an aten op's arguments (or outputs), in order: an aten schema nests them
    at most in lists and tuples (``Tensor[]``, ``Tensor?[]``, tuple returns). What
    ``torch.utils._pytree.tree_leaves`` finds, filtered to tensors, at a fraction of its cost: it
    was a third of a traced meta step's time (every op passes here, tens of thousands a step)."""
    found: list[torch.Tensor] = []
    _collect(args, found)
    if kwargs:
        _collect(kwargs, found)
    return found


def _collect(x, found: list) -> None:
    if isinstance(x, torch.Tensor):
        found.append(x)
    elif isinstance(x, (list, tuple)):
        for y in x:
            if isinstance(y, torch.Tensor):      # the common case, without a call
                found.append(y)
            elif isinstance(y, (list, tuple, dict)):
                _collect(y, found)
    elif isinstance(x, dict):
        for y in x.values():
            _collect(y, found)


_WRITES: dict = {}   # aten op -> its written arguments: the schema is fixed, read it once per op


def written_arguments(func) -> list[tuple[int, str, bool]]:
    """(position, name, keyword-only) of each argument ``func`` writes (``out=``, in-place self)."""
    if func not in _WRITES:
        _WRITES[func] = [(k, a.name, a.kwarg_only) for k, a in enumerate(func._schema.arguments)
                         if a.alias_info is not None and a.alias_info.is_write]
    return _WRITES[func]
