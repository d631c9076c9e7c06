"""What the tests of ``zerospec report`` share (tests/unit/report/test_measure.py,
tests/unit/cli/test_report.py, tests/claims/test_memory_report.py): one small measurement, cached
per process, a table's column, and a look at the measurements the CLI makes."""
from __future__ import annotations

import pytest

from tests.support.runs import cached
from zerospec.report.measure import ReportConfig, measure
from zerospec.report.writeup import build_tables

N = 4
SMALL_RUN = ["report", "--ranks", "2", "--steps", "1"]   # the CLI's small runs: 2 virtual GPUs, 1 step


def measurement():
    """One small measurement serves every test that reads it: every variant, 4 ranks, 1 step (~4 s
    CPU), made once per process (tests/support/runs.py's cache). One step is enough for every claim
    here: the step's update is what the master-weight comparison sees."""
    return cached(("report", N, 1), lambda: measure(ReportConfig(ranks=N, steps=1), quiet=True))


@pytest.fixture(scope="module")
def m():
    """The small measurement (:func:`measurement`), for a test module that imports this fixture."""
    return measurement()


@pytest.fixture(scope="module")
def tables(m):
    """Its tables by name."""
    return {t.name: t for t in build_tables(m)}


def column(table, name):
    i = table.columns.index(name)
    return [row[i] for row in table.rows]


def measured_calls(monkeypatch) -> list:
    """The Measurements each ``measure`` call of the CLI returns, with its ``c30`` argument."""
    import zerospec.report.measure as measure
    seen, real = [], measure.measure
    monkeypatch.setattr(measure, "measure", lambda *a, **k: seen.append((k, real(*a, **k)))
                        or seen[-1][1])
    return seen
