"""A hook for tests of the FLOP counts:
``with flop_counter_mode_alongside() as totals: train(...)``.

zerospec counts FLOPs with its own :class:`~zerospec.runtime.opcount.OpCounter` (torch's FLOP
formulas, ``FlopCounterMode``'s rule for which ops they apply to) and does not enter
``FlopCounterMode``, which doubles a paper-scale meta step's time. Inside this block every counted
phase also runs under ``FlopCounterMode``, entered after the counter (so it sees each op first, as
it would alone), and ``totals`` receives one ``(FlopCounterMode's total, the counter's total)`` pair
per phase; the tests check the two are equal. The seam is the name ``flop_oracle`` in
:mod:`zerospec.training.step`; the library never imports this module.
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
    def beside(counter):
        with FlopCounterMode(display=False) as fc:
            yield
        with lock:   # the counter is still entered below: it has seen every op of the phase
            totals.append((fc.get_total_flops(), counter.flops))

    with mock.patch.object(step, "flop_oracle", beside):
        yield totals
