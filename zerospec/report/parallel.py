"""Work beside the report's trainings, in a second process: :class:`Beside`.

A training runs its N ranks one at a time on one CPU (the baton). The report's other work, one-step
meta runs that count FLOPs and sweep memory, needs no real tensors and reads little memory, so on a
machine with a second CPU it runs there, in a helper process, while the trainings run here (a
trainings' peer process would share the memory bus with them and slow their measured steps by
10–25%; meta steps are Python on metadata). The helper comes from the launcher's forkserver
(:func:`zerospec.cluster.processes.mp_context`), started from a thread, so this process starts
training at once while the server imports torch.

With one usable CPU the work runs here when its result is asked for, as before. Either way the
result is the same: meta steps compute shapes, and every figure they give is an integer.

Each process keeps a CPU of its own while both work: this thread is pinned to the CPU it is on
(the clusters it starts pin their ranks there) and the helper to the others. A helper's error is
raised here; a helper that dies is named; no helper outlives the ``with`` block.
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable

import torch

from ..cluster.processes import mp_context
from ..cluster.threads import caller_cpu


def usable_cpus() -> list[int]:
    """The CPUs this thread may run on."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def _pin(cpus: set[int]) -> None:
    try:
        os.sched_setaffinity(0, cpus)   # the calling thread; what it starts inherits the mask
    except OSError:                     # a CPU left the allowed set: run where the OS puts it
        pass


def _start_helper(cpus: set[int]) -> None:
    """The helper process's initializer: the other CPUs, one intra-op thread (as the report)."""
    _pin(cpus)
    torch.set_num_threads(1)


class Beside:
    """``fn(*args)`` in a helper process while this one works (module doc)::

        with Beside(fn, *args) as side:
            ...                     # the trainings
            value = side.result()   # waits for the helper; or runs fn here (one CPU)
    """

    def __init__(self, fn: Callable[..., Any], *args):
        self.fn, self.args = fn, args
        self.pool = self.future = self.starter = self.start_error = None
        self._affinity = None

    @property
    def in_helper(self) -> bool:
        """Whether ``fn`` runs in a helper process (decided on entering)."""
        return self.starter is not None

    def __enter__(self):
        cpus = usable_cpus()
        mine = caller_cpu() if len(cpus) > 1 and hasattr(os, "sched_setaffinity") else None
        if mine is None:
            return self
        free = set(cpus) - {mine}
        # the first process from the forkserver waits for it to import torch (seconds): started
        # from a thread, so this one works meanwhile. The thread starts before this one is pinned:
        # the forkserver outlives the report (rank launches reuse it), with the mask it started with
        self.starter = threading.Thread(target=self._start, args=(free,), daemon=True,
                                        name="zerospec-report-helper")
        self.starter.start()
        self._affinity = os.sched_getaffinity(0)
        _pin({mine})
        return self

    def _start(self, free: set[int]) -> None:
        try:
            self.pool = ProcessPoolExecutor(1, mp_context=mp_context(None),
                                            initializer=_start_helper, initargs=(free,))
            self.future = self.pool.submit(self.fn, *self.args)
        except BaseException as exc:   # noqa: BLE001 - raised in the caller's thread by result()
            self.start_error = exc

    def result(self) -> Any:
        """``fn(*args)``'s value (its exception, if it raised)."""
        if self.starter is None:
            return self.fn(*self.args)
        self.starter.join()
        if self.start_error is not None:
            raise RuntimeError(f"the report could not start its helper process: "
                               f"{self.start_error}") from self.start_error
        try:
            return self.future.result()
        except BrokenProcessPool:
            raise RuntimeError("the report's helper process died (killed, or out of memory) "
                               "before it returned its meta steps") from None

    def __exit__(self, *exc):
        try:
            if self.starter is not None:
                self.starter.join()
            if self.pool is not None:   # on a failure here: the helper's running step is awaited
                self.pool.shutdown(wait=True, cancel_futures=True)
        finally:
            if self._affinity is not None:
                os.sched_setaffinity(0, self._affinity)
        return False
