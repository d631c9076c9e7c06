"""Work beside the report's trainings, in a second process: :class:`Beside`.

A training runs its N ranks one at a time on one CPU (the baton). The report's other work, one-step
meta runs that count FLOPs and sweep memory, needs no real tensors and reads little memory, so on a
machine with a second CPU it runs there, in a helper process, while the trainings run here. (A
training in a peer process would share the memory bus with these and slow their measured steps; meta
steps are Python on metadata.) The helper comes from the
launcher's forkserver (:func:`zerospec.cluster.processes.mp_context`), started from a thread, so
this process starts training at once while the server imports torch.

With one usable CPU, or where the OS gives no CPU affinity, the work runs here when its result is
asked for, as before; also, with a warning, when the helper cannot be started or dies before it
answers. Either way the result is the same: meta steps compute shapes, and every figure they give
is an integer. A script that measures when imported (no ``if __name__ == "__main__":``) is run
again by the helper's start, as multiprocessing does: there the measuring stops with an error
naming the fix, and the script's own run does the work itself.

While both work, each keeps a CPU of its own: this thread is pinned to the CPU it is on (the
clusters it starts pin their ranks there) and the helper to the others; the forkserver keeps the
mask it started with (rank launches reuse it). The helper's exception is raised here; when this
process fails inside the block the helper is killed (also when its result was never asked for),
so no helper outlives the block.
"""
from __future__ import annotations

import multiprocessing.connection
import os
import pickle
import threading
import traceback
import warnings
from typing import Any, Callable

import torch

from .processes import mp_context
from .threads import caller_cpu, pin_thread


def usable_cpus() -> list[int]:
    """The CPUs this thread may run on."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def _helper_main(conn, cpus: set[int], fn, args) -> None:
    """The helper process: the other CPUs, one intra-op thread (as the report); ``fn(*args)``'s
    value or exception back through ``conn``."""
    pin_thread(cpus)
    torch.set_num_threads(1)
    try:
        reply = ("value", fn(*args))
    except BaseException as exc:   # noqa: BLE001 - every failure goes back to the caller
        reply = ("error", exc, traceback.format_exc())
    try:
        if reply[0] == "error":    # small: check that it comes back whole (a custom __init__)
            pickle.loads(pickle.dumps(reply))
        conn.send(reply)
    except Exception as exc:       # noqa: BLE001 - a value or exception that does not pickle
        conn.send(("error", RuntimeError(f"the report's helper could not send back its "
                                         f"{reply[0]} {reply[1]!r:.300}: {exc}"),
                   reply[2] if reply[0] == "error" else traceback.format_exc()))


def _death(code: int) -> str:
    return f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"


class Beside:
    """``fn(*args)`` in a helper process while this one works (module doc); ``fn`` and ``args``
    must pickle (a module-level function)::

        with Beside(fn, *args) as side:
            ...                     # the trainings
            value = side.result()   # waits for the helper; or runs fn here
    """

    def __init__(self, fn: Callable[..., Any], *args):
        self.fn, self.args = fn, args
        self.process = self.conn = self.starter = self.start_error = None
        self._affinity = None
        self._reply = None

    @property
    def in_helper(self) -> bool:
        """Whether ``fn`` was given to a helper process (decided on entering)."""
        return self.starter is not None

    def __enter__(self):
        if getattr(multiprocessing.current_process(), "_inheriting", False):
            # multiprocessing's own test (spawn._check_not_importing_main): this process is a
            # new one importing the caller's script, which then measures again
            raise RuntimeError("zerospec report ran while a new process imported the main script "
                               "(a script that measures on import): put the call under "
                               "`if __name__ == \"__main__\":`")
        cpus = usable_cpus()
        mine = caller_cpu() if len(cpus) > 1 else None   # None also where threads cannot be pinned
        if mine is None:
            return self
        free = set(cpus) - {mine}
        # the first process from the forkserver waits for it to import torch (seconds): started
        # from a thread, so this one works meanwhile; started before this thread is pinned, so a
        # forkserver it starts keeps this process's whole mask
        self.starter = threading.Thread(target=self._start, args=(free,), daemon=True,
                                        name="zerospec-report-helper")
        self.starter.start()
        self._affinity = os.sched_getaffinity(0)
        pin_thread({mine})
        return self

    def _start(self, free: set[int]) -> None:
        theirs = None
        try:
            ctx = mp_context(None)
            self.conn, theirs = ctx.Pipe(duplex=False)
            process = ctx.Process(target=_helper_main, args=(theirs, free, self.fn, self.args),
                                  name="zerospec-report-helper", daemon=True)
            process.start()
            self.process = process
        except BaseException as exc:   # noqa: BLE001 - result() runs the work here instead
            self.start_error = exc
        finally:
            if theirs is not None:      # the helper holds its own end now
                theirs.close()

    def result(self) -> Any:
        """``fn(*args)``'s value (its exception, if it raised); the same on a second call."""
        if self.starter is None:
            return self.fn(*self.args)
        if self._reply is None:
            self._reply = self._wait()
        kind, value, *text = self._reply
        if kind == "error":
            raise value from RuntimeError(f"in the report's helper process:\n{text[0]}")
        return value

    def _wait(self) -> tuple:
        """The helper's reply, or ("value", fn(*args)) computed here when it has none."""
        self.starter.join()
        if self.start_error is not None:
            warnings.warn(f"the report could not start its helper process ({self.start_error}); "
                          f"its meta steps run in this process", RuntimeWarning, stacklevel=3)
            return "value", self.fn(*self.args)
        multiprocessing.connection.wait([self.conn, self.process.sentinel])
        if self.conn.poll(0):           # it answered (once it has exited, all it sent is here)
            try:
                return self.conn.recv()
            except EOFError:
                pass
            except Exception as exc:    # noqa: BLE001 - a reply that does not unpickle here
                raise RuntimeError(f"the report's helper process sent a reply this process "
                                   f"cannot read: {exc}") from exc
        self.process.join()             # it died before it answered: the work is done here
        warnings.warn(f"the report's helper process {_death(self.process.exitcode)} before it "
                      f"returned; its meta steps run in this process", RuntimeWarning, stacklevel=3)
        return "value", self.fn(*self.args)

    def __exit__(self, *exc):
        try:
            if self.starter is not None:
                self.starter.join()
            if self.process is not None:
                if self._reply is None and self.process.is_alive():
                    self.process.kill()          # failed here (or never asked): not wanted
                self.process.join()
            if self.conn is not None:
                self.conn.close()
        finally:
            if self._affinity is not None:
                try:
                    os.sched_setaffinity(0, self._affinity)
                except OSError:                  # every CPU of it left the cpuset meanwhile
                    pin_thread(set(range(os.cpu_count() or 1)))
        return False
