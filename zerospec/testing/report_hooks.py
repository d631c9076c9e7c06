"""A hook for tests of ``zerospec report``: ``with report_in_one_process(): measure(cfg)``.

Inside the block the report runs its meta steps in its own process, as on a machine with one CPU,
instead of in a helper process beside its trainings (zerospec/cluster/helper.py). The test run
enters it for every test (tests/conftest.py): pytest-xdist's workers already keep every CPU busy,
so a helper would take its CPU from the other worker, and would trace C30's case again where the
worker holds the traces memoised. The helper itself is tested on its own
(tests/unit/cluster/test_helper.py). The seam is the name ``Beside`` in
:mod:`zerospec.report.measure`; the library never imports this module.
"""
from __future__ import annotations

import contextlib
from unittest import mock

from ..report import measure
from ..cluster.helper import Beside


class _Here(Beside):
    """:class:`Beside` that never starts a helper: the work runs here when its result is asked."""

    def __enter__(self):
        return self


@contextlib.contextmanager
def report_in_one_process():
    """Inside the block, ``measure`` runs its meta steps in this process."""
    with mock.patch.object(measure, "Beside", _Here):
        yield
