"""A hook for tests of the FLOP counts:
``with flop_counter_mode_alongside() as totals: train(...)``.

zerospec counts FLOPs with its own :class:`~zerospec.runtime.opcount.OpCounter` (torch's FLOP
formulas, ``FlopCounterMode``'s rule for which ops they apply to) and does not enter
``FlopCounterMode``, which doubles a paper-scale meta step's time. Inside this block every counted
phase also runs under ``FlopCounterMode``, entered below the counter: the counter sees each op
first and decomposes what it must exactly as it does alone, and ``FlopCounterMode`` counts what
reaches it, so an op the counter failed to decompose or to count shows as a difference. ``totals``
receives one ``(FlopCounterMode's total, the counter's total)`` pair per counted phase of every
rank of this process; ranks in other processes (the gloo engine, the report's helper) are out of
its reach. The seam is the name ``flop_oracle`` in :mod:`zerospec.training.step`; the library
never imports this module.
"""
from __future__ import annotations

import contextlib
import threading
from unittest import mock

from torch.utils.flop_counter import FlopCounterMode

from ..training import step


@contextlib.contextmanager
def flop_counter_mode_alongside():
    """Yields a list that fills with ``(FlopCounterMode's total, OpCounter's total)`` per counted
    phase of every rank (virtual GPUs are threads, so appends are locked)."""
    totals: list[tuple[int, int]] = []
    lock = threading.Lock()

    @contextlib.contextmanager
    def beneath(counter):
        with FlopCounterMode(display=False) as fc:
            yield
            with lock:   # the counter, entered above, has left: it saw every op of the phase
                totals.append((fc.get_total_flops(), counter.flops))

    with mock.patch.object(step, "flop_oracle", beneath):
        yield totals
