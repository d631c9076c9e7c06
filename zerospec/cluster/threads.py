"""VirtualCluster: N ranks as Python threads with a baton, so ranks never fight for the CPU.

Each rank's code is ordinary blocking code that calls collectives the way torch.distributed code
does. Scheduling is deliberate: exactly one rank runs at a time. A rank holds the *baton* until it
enters a collective it must wait for, then hands it to the next rank that has not yet arrived
there; the last rank to arrive completes the collective and carries on (a reduce-scatter a rank
posts lets it go on at once, and only ``wait`` may hand the baton on: zerospec/comm/posted.py).
Free-running threads fight over the GIL and OpenMP (spec/engine.md, "Why one rank at a time");
with the baton the cost of a step is the work plus one hand-off per rank per collective waited
for. It also makes every run deterministic, whatever the OS does with the threads. The ranks'
threads share one CPU (``pin``), so a hand-off does not move the next rank to another core.

Failure handling (design property 6): the first exception on any rank aborts the cluster, wakes
every waiting rank (each raises :class:`ClusterAborted`), and :meth:`VirtualCluster.run` re-raises
it as :class:`RankError` naming the rank, the phase and the last collective, chained to the
original. A rank that does not reach a collective within ``timeout`` seconds of its peers makes
them raise :class:`CollectiveTimeout` naming the ranks that never arrived. No path hangs.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import random
import threading
import time
from typing import Any, Callable

import torch

from ..runtime.errors import ClusterAborted, ClusterError, CollectiveTimeout, RankError
from ..comm.interconnect import Interconnect
from ..runtime.context import RankContext
from ..comm.ledger import CommLedger
from ..comm.ring import RingTransport, Wire
from ..comm.sim import SimBackend
from ..runtime.memory import MemoryLedger
from ..runtime.metacache import MetaKernelCache, shared
from ..runtime.observe import Observation, Observer


JITTER_SECONDS = 0.002   # longest random pause before a hand-off when jitter is on
TRANSPORTS = ("direct", "ring")


class Baton:
    """Exactly one rank runs at a time; ``pass_to`` hands the CPU to another rank.

    ``jitter`` (a random.Random, for determinism tests): the first rank to run, and the next
    rank at every hand-off, are drawn at random among those that may run, and each hand-off
    waits a random pause. Results must not change: reductions are ordered by rank, never by
    arrival (spec/determinism.md, P8)."""

    def __init__(self, n: int, timeout: float, jitter: random.Random | None = None):
        self.n = n
        self.timeout = timeout
        self.jitter = jitter
        self.lock = threading.Lock()
        # rank r may run while it holds _go[r]: a plain lock, released to hand r the baton (a
        # hand-off through locks costs 15–16 µs where one through threading.Event costs 24–27
        # µs: Event.wait makes a new lock and takes a Condition's on every wait)
        self._go = [threading.Lock() for _ in range(n)]
        for go in self._go:
            go.acquire()
        self.error: BaseException | None = None   # set once, by the first failure
        self.failed_rank: int | None = None
        self.finished = [False] * n
        self._wake(jitter.randrange(n) if jitter else 0)

    def wait_turn(self, rank: int, waiting_for: Callable[[], str]) -> None:
        """Block until ``rank`` holds the baton; raise if the cluster aborted or time ran out."""
        if self.error is None and not self._go[rank].acquire(timeout=self.timeout):
            err = CollectiveTimeout(f"rank {rank} waited more than {self.timeout:g} s: {waiting_for()}")
            self.abort(rank, err)
            raise err
        if self.error is not None:
            raise ClusterAborted(f"rank {rank} aborted: rank {self.failed_rank} failed") from self.error

    def pass_to(self, rank: int) -> None:
        if self.jitter is not None:
            time.sleep(self.jitter.uniform(0, JITTER_SECONDS))
        self._wake(rank)

    def _wake(self, rank: int) -> None:
        try:
            self._go[rank].release()
        except RuntimeError:   # already released: only abort wakes a rank twice
            pass

    def next_rank(self, after: int, skip: Callable[[int], bool]) -> int | None:
        """The next rank after ``after`` (cyclically) that has not finished and is not skipped;
        with jitter, a random one of them. None if there is none."""
        order = (r % self.n for r in range(after + 1, after + self.n + 1))
        if self.jitter is None:   # the first one, without listing the others (once per hand-off)
            return next((r for r in order if not self.finished[r] and not skip(r)), None)
        ready = [r for r in order if not self.finished[r] and not skip(r)]
        return self.jitter.choice(ready) if ready else None

    def abort(self, rank: int, error: BaseException) -> None:
        """Record the first failure and wake every rank so none waits forever."""
        with self.lock:
            if self.error is None:
                self.error, self.failed_rank = error, rank
        for r in range(self.n):   # a rank that waits later sees the error before it waits
            self._wake(r)


class VirtualCluster:
    """N virtual GPUs in one process. ``run(fn, *args)`` → per-rank results in rank order.

    ``torch_threads``: torch's intra-op threads while the cluster runs (restored after). One by
    default: ranks take turns and their ops are small, so a second OpenMP thread mostly contends
    (spec/engine.md, "Why one rank at a time"). ``None`` leaves torch's setting alone.

    ``pin``: run every rank's thread on one CPU, the one the caller is on when ``run`` starts, or
    the process's own (:func:`home_cpu`) where one is set (Linux; elsewhere, or where the OS
    refuses, the ranks run where the OS puts them). Only with
    ``torch_threads=1``: a rank's OpenMP team would be confined to that CPU too; ``None`` (the
    default) pins exactly then, ``True`` with another thread count is refused. Only one rank runs
    at a time, so one CPU loses nothing, and it keeps each hand-off from waking the next rank on
    another core, away from the caches the ranks share (spec/engine.md, "Why one CPU").

    ``transport``: ``"direct"`` (default) moves each collective's data in one go, reducing in rank
    order; ``"ring"`` passes chunks between neighbours (:mod:`zerospec.comm.ring`) and counts
    every transfer per link in ``self.wire``, to observe what the ledger's ring model books.

    ``gpus_per_node``: the ranks sit on nodes of that many GPUs, rank r on node r // G (None: one
    node); the ledger and the wire book each transfer on its link class (spec/nodes.md).

    ``observe``: run each rank under its own :class:`~zerospec.runtime.observe.Observer` (a
    dispatch mode, per thread), which sees every storage the rank makes and when it dies; after
    ``run``, ``observed[r]`` holds rank r's peaks per phase. What the simulator makes while one
    rank's thread moves a collective's data for every rank belongs to no rank and is not observed.

    ``cache_kernels``: on meta, each rank runs under its own
    :class:`~zerospec.runtime.metacache.MetaKernelCache` of the process's table
    (``metacache.shared()``), as a meta step does, entered before the observer so that every mode
    sees each op before the cache answers it. ``None`` (the default): exactly when ``device`` is
    meta (elsewhere kernels compute values, which no key holds).
    """

    def __init__(self, n_ranks: int, *, device: str = "cpu", timeout: float = 120.0,
                 torch_threads: int | None = 1, jitter: int | None = None,
                 transport: str = "direct", observe: bool = False, pin: bool | None = None,
                 gpus_per_node: int | None = None, cache_kernels: bool | None = None):
        if not isinstance(n_ranks, int) or n_ranks < 1:
            raise ValueError(f"n_ranks must be an integer >= 1, got {n_ranks!r}")
        if not 0 < timeout < float("inf"):   # NaN fails both comparisons
            raise ValueError(f"timeout must be a finite number of seconds > 0, got {timeout!r}")
        if jitter is not None and (not isinstance(jitter, int) or isinstance(jitter, bool)):
            raise ValueError(f"jitter must be an integer seed or None, got {jitter!r}")
        if pin is not None and not isinstance(pin, bool):
            raise ValueError(f"pin must be True, False or None, got {pin!r}")
        if pin and torch_threads != 1:
            raise ValueError(f"pin=True runs every rank on one CPU, which needs torch_threads=1, got "
                             f"torch_threads={torch_threads!r}; pass pin=False")
        if cache_kernels is not None and not isinstance(cache_kernels, bool):
            raise ValueError(f"cache_kernels must be True, False or None, got {cache_kernels!r}")
        if cache_kernels and torch.device(device).type != "meta":
            raise ValueError(f"cache_kernels=True answers meta kernels from their arguments' "
                             f"metadata, which holds no values: device must be meta, got {device!r}")
        if transport not in TRANSPORTS:
            raise ValueError(f"unknown transport {transport!r}; accepted: {', '.join(TRANSPORTS)}")
        self.n_ranks = n_ranks
        self.device = torch.device(device)
        self.timeout = timeout
        self.torch_threads = torch_threads
        self.jitter = jitter                # seed of the random schedule (see Baton); None: off
        self.comm_ledger = CommLedger(n_ranks, gpus_per_node)
        self.gpus_per_node = gpus_per_node
        self.wire = Wire(n_ranks, gpus_per_node) if transport == "ring" else None   # per-link counts, ring only
        self.memory = [MemoryLedger(self.device) for _ in range(n_ranks)]
        self.contexts: list[RankContext] = []
        self.observe = observe
        self.observed: list[Observation] = []
        self.pin = torch_threads == 1 if pin is None else pin
        self.cache_kernels = self.device.type == "meta" if cache_kernels is None else cache_kernels

    def run(self, fn: Callable[..., Any], *args, **kwargs) -> list[Any]:
        baton = Baton(self.n_ranks, self.timeout,
                      random.Random(self.jitter) if self.jitter is not None else None)
        backend = SimBackend(baton, RingTransport(self.wire) if self.wire is not None else None)
        self.contexts = [
            RankContext(r, self.n_ranks, self.memory[r], None) for r in range(self.n_ranks)]
        for ctx in self.contexts:
            ctx.comm = Interconnect(ctx, backend, self.comm_ledger)
        results: list[Any] = [None] * self.n_ranks
        observers = [Observer(ctx) if self.observe else contextlib.nullcontext()
                     for ctx in self.contexts]
        if self.observe:   # the completing rank's thread moves every rank's data
            backend.around_move = lambda rank: observers[rank].paused()
        # one mode per rank thread (a dispatch mode is per thread); the table is the process's: the
        # ranks take turns (Baton), and a dict's get and set are atomic besides
        kernels = [MetaKernelCache(shared()) if self.cache_kernels else contextlib.nullcontext()
                   for _ in self.contexts]
        all_done = threading.Event()
        remaining = [self.n_ranks]
        cpu = ranks_cpu() if self.pin else None

        def body(ctx: RankContext) -> None:
            r = ctx.rank
            if cpu is not None:
                pin_thread({cpu})
            try:
                baton.wait_turn(r, lambda: f"rank {r} never got its first turn")
                ctx.timeline.restart()
                with kernels[r], observers[r]:
                    results[r] = fn(ctx, *args, **kwargs)
                backend.rank_finished(r)
            except ClusterAborted:
                pass
            except ClusterError as exc:
                baton.abort(r, exc)
            except BaseException as exc:  # noqa: BLE001 - any failure must reach the caller
                last = ctx.comm.last_op or "no collective yet"
                phase = ctx.failed_phase or ctx.phase_name
                err = RankError(f"rank {r} failed in phase {phase!r} (step {ctx.step}, "
                                f"last collective: {last}): {type(exc).__name__}: {exc}", r)
                err.__cause__ = exc
                baton.abort(r, err)
            finally:
                with baton.lock:
                    remaining[0] -= 1
                    if remaining[0] == 0:
                        all_done.set()
                if baton.error is not None:
                    all_done.set()

        threads = [threading.Thread(target=body, args=(ctx,), name=f"zerospec-rank{ctx.rank}",
                                    daemon=True) for ctx in self.contexts]
        with torch_threads(self.torch_threads):
            for t in threads:
                t.start()
            all_done.wait()
            if baton.error is not None:
                # Give the woken ranks a moment to unwind; a rank stuck outside a collective is a
                # daemon thread and cannot block the caller.
                deadline = time.perf_counter() + 0.2
                for t in threads:
                    t.join(timeout=max(0.0, deadline - time.perf_counter()))
                raise baton.error
            for t in threads:
                t.join()
        self.observed = [o.observation for o in observers] if self.observe else []
        return results


_HOME: list = [None]     # the process's own CPU for its clusters' ranks (home_cpu)


def home_cpu(cpu: int | None) -> None:
    """Run the ranks of every pinned cluster of this process on ``cpu`` (None: on the caller's CPU
    at each ``run``). For processes that run clusters side by side, each on a CPU of its own (the
    test suite's xdist workers: tests/support/scheduling.py): pinned where their callers happened
    to be, two processes' ranks shared one CPU for most of the time both ran clusters, while
    another CPU idled."""
    if cpu is not None and (not isinstance(cpu, int) or isinstance(cpu, bool) or cpu < 0):
        raise ValueError(f"cpu must be a CPU number >= 0 or None, got {cpu!r}")
    _HOME[0] = cpu


def ranks_cpu() -> int | None:
    """The CPU a pinned cluster's ranks run on: the process's own (:func:`home_cpu`) if it is
    one this process may use, else the caller's (:func:`caller_cpu`)."""
    home = _HOME[0]
    if home is not None and hasattr(os, "sched_getaffinity") and home in os.sched_getaffinity(0):
        return home
    return caller_cpu()


def caller_cpu() -> int | None:
    """The CPU the calling thread runs on now, if the OS says and lets threads be pinned."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    allowed = os.sched_getaffinity(0)
    try:
        cpu = ctypes.CDLL(None).sched_getcpu()
    except (AttributeError, OSError):   # no such libc function: any allowed CPU will do
        cpu = -1
    return cpu if cpu in allowed else min(allowed)


def pin_thread(cpus: set[int]) -> None:
    """Confine the calling thread (not the process: Linux sets a thread's own mask) to ``cpus``;
    threads and processes it starts inherit the mask."""
    try:
        os.sched_setaffinity(0, cpus)
    except OSError:   # none of them is allowed since (a cgroup changed): run unpinned,
        pass          # which changes the speed, never a result


@contextlib.contextmanager
def torch_threads(n: int | None):
    if n is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
