"""Wiring only: the hooks and fixtures of tests/support/ that the tests under tests/ use (a run of
benchmarks/ gets none of them). The claims plugin is loaded for every run by the root conftest.py.

- tests/support/snapshots.py: ``md_snapshot``, ``md_table_snapshot`` (Markdown snapshots, exact
  or within a derived tolerance);
- tests/support/scheduling.py: xdist's grouped-file scheduler, garbage-collection tuning, one
  compute thread per worker, ``zerospec report`` in the worker's own process.
"""
from __future__ import annotations

from tests.support.scheduling import (_report_in_one_process, pytest_configure, pytest_sessionfinish,
                                      pytest_xdist_make_scheduler)
from tests.support.snapshots import md_snapshot, md_table_snapshot

# pytest finds hooks and fixtures by name among a conftest's attributes
__all__ = ["_report_in_one_process", "pytest_configure", "pytest_sessionfinish",
           "pytest_xdist_make_scheduler", "md_snapshot", "md_table_snapshot"]
