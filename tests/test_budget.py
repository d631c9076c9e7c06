"""The default run's budget machinery: the count of its expensive work (tests/support/workcount.py,
pinned in tests/work_count.md) and the order the xdist workers take the files in
(tests/support/scheduling.py)."""
from __future__ import annotations

import collections
import functools
import json
import subprocess
import sys
import types

import pytest
import torch

from tests.support import scheduling, workcount
from zerospec.model.family import ODD
from zerospec.training.config import TrainConfig
from zerospec.training.scale import measure

TINY = ODD


@functools.cache
def _cached_step(stage: int):
    return measure(TrainConfig(stage=stage, n_d=2, model=TINY))


def test_a_meta_step_is_booked_to_its_file_and_a_cached_one_to_its_key_once(monkeypatch):
    """A meta step a test makes counts in the test's file; one a cache makes counts under the
    cache's key, once, however often it is read."""
    counts = collections.defaultdict(collections.Counter)
    monkeypatch.setattr(workcount, "_counts", counts)
    monkeypatch.setitem(workcount._where, "file", "tests/test_budget.py")
    monkeypatch.setattr(workcount, "_cached_codes", {_cached_step.__wrapped__.__code__})
    workcount.install()
    _cached_step.cache_clear()
    classes = len(measure(TrainConfig(stage=3, n_d=2, model=TINY)).classes)
    for _ in range(3):
        _cached_step(0)
    assert counts["tests/test_budget.py"] == {"meta steps": 1, "meta rank steps": classes}
    assert dict(counts).keys() == {"tests/test_budget.py", "cache _cached_step (tests/test_budget.py): {'stage': 0}"}
    assert counts["cache _cached_step (tests/test_budget.py): {'stage': 0}"]["meta steps"] == 1


def test_a_python_subprocess_is_a_fresh_interpreter_and_another_program_is_not_counted(monkeypatch):
    """A subprocess running Python imports everything again and counts; git (pytest-benchmark
    asks it for the commit) costs milliseconds and does not."""
    counts = collections.defaultdict(collections.Counter)
    monkeypatch.setattr(workcount, "_counts", counts)
    monkeypatch.setitem(workcount._where, "file", "tests/test_budget.py")
    workcount.install()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    subprocess.run(["git", "--version"], capture_output=True, check=True)
    assert counts == {"tests/test_budget.py": {"fresh interpreters": 1}}


def test_workers_counts_add_up_per_file_and_a_cache_key_counts_once(monkeypatch):
    """Two workers' reports: a file ran on one of them, so its rows add; a cached run both made
    counts once (the run needs it once; the second is the scheduling's cost)."""
    counts = collections.defaultdict(collections.Counter)
    monkeypatch.setattr(workcount, "_counts", counts)
    key = "cache run: {'key': ('threads', 1)}"
    for worker in ({"tests/a.py": {"cluster runs": 2}, key: {"cluster runs": 1}},
                   {"tests/b.py": {"cluster runs": 3}, key: {"cluster runs": 1}}):
        node = types.SimpleNamespace(workeroutput={"workcount": json.dumps(worker)})
        workcount.pytest_testnodedown(node, None)
    assert counts == {"tests/a.py": {"cluster runs": 2}, "tests/b.py": {"cluster runs": 3},
                      key: {"cluster runs": 1}}
    assert "| **the default run** | 0 | 0 | 6 | 0 | 0 |" in workcount.table(counts)


class _Reporter:
    """What pytest_terminal_summary uses of pytest's terminal reporter."""
    def __init__(self, skipped: int):
        self.stats, self.lines = {"skipped": [None] * skipped}, []
        self._session = types.SimpleNamespace(exitstatus=pytest.ExitCode.OK)

    def write_line(self, line):
        self.lines.append(line)

    def write_sep(self, sep, title, **kw):
        self.lines.append(title)


def test_a_full_run_whose_count_differs_fails_naming_the_row_unless_it_skipped_other_tests(
        monkeypatch, tmp_path):
    """The end of a full default run: a count unlike the pinned one fails the run and prints the
    changed row; the same count passes; a run that skipped another number of tests (a GPU,
    torchrun) ran other tests, and is not checked."""
    monkeypatch.setattr(workcount, "_counts", {"tests/a.py": collections.Counter({"cluster runs": 2})})
    monkeypatch.setattr(workcount, "_full_default_run", lambda config: True)
    monkeypatch.setattr(workcount, "PINNED", tmp_path / "work_count.md")
    config = types.SimpleNamespace(getoption=lambda name: False)
    workcount.PINNED.write_text(workcount.HEADER.format(skipped=1)
                                + workcount.table({"tests/a.py": {"cluster runs": 1}}))
    differs, other_tests = _Reporter(skipped=1), _Reporter(skipped=2)
    workcount.pytest_terminal_summary(differs, 0, config)
    workcount.pytest_terminal_summary(other_tests, 0, config)
    assert differs._session.exitstatus == pytest.ExitCode.TESTS_FAILED
    assert "+ | tests/a.py | 0 | 0 | 2 | 0 | 0 |" in differs.lines
    assert other_tests._session.exitstatus == pytest.ExitCode.OK
    workcount.PINNED.write_text(workcount.HEADER.format(skipped=1)
                                + workcount.table({"tests/a.py": {"cluster runs": 2}}))
    same = _Reporter(skipped=1)
    workcount.pytest_terminal_summary(same, 0, config)
    assert same._session.exitstatus == pytest.ExitCode.OK and same.lines == []


def test_the_costliest_units_are_handed_out_first_then_xdists_order():
    """The scheduler hands out START_FIRST's units before the rest, in its order; the others keep
    xdist's order (by number of tests)."""
    waiting = collections.OrderedDict.fromkeys(
        ["tests/unit/test_layers.py", "tests/claims/test_buffers.py", "tests/unit/test_no_dates.py",
         "the shared grid"])
    order = []
    while waiting:
        order.append(scheduling.next_unit(waiting))
        del waiting[order[-1]]
    assert order == ["the shared grid", "tests/claims/test_buffers.py", "tests/unit/test_layers.py",
                     "tests/unit/test_no_dates.py"]


def test_the_files_that_take_the_reports_measurement_share_one_worker():
    """Every test file that imports the report's cached measurement (tests/support/report.py's
    ``m`` fixture) is in one scheduling unit, so that a run measures it once, not once a worker."""
    import re
    readers = sorted(path.relative_to(scheduling.ROOT).as_posix()
                     for path in (scheduling.ROOT / "tests").rglob("test_*.py")
                     if re.search(r"^from tests\.support\.report import [^\n]*\bm\b", path.read_text(),
                                  re.MULTILINE))
    assert len(readers) >= 2, readers
    assert {scheduling.UNITS.get(path) for path in readers} == {"the report's measurement"}, readers


def test_a_process_that_runs_tests_computes_on_one_thread():
    """In an xdist worker and in a run in one process (-n 0) alike, torch computes on one thread."""
    assert torch.get_num_threads() == 1
