"""How the tests run on xdist workers: files grouped onto one worker where they share expensive
work, garbage collection tuned, one compute thread per worker (the hooks and the fixture are wired
in tests/conftest.py).

The file lists below are kept by hand: each names a test file that must exist (checked at import,
so a renamed file fails the run loudly instead of silently leaving its group).
"""
from __future__ import annotations

import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

# Young collections every 20,000 net container allocations instead of CPython's 700: a training run's
# objects that live for one forward and backward then die young, instead of reaching the old
# generation and bringing on full collections of the worker's whole heap.
GC_THRESHOLD = (20_000, 20, 20)


def pytest_configure(config):
    """Young garbage collections less often (GC_THRESHOLD). A process that runs tests computes on
    one thread: -n auto starts one worker per CPU already, and a worker's second OpenMP thread would
    only spin against the other workers (as the virtual cluster does for its ranks, spec/engine.md).
    So does a run in one process (-n 0): it then computes as the default run's workers do, and a
    targeted run next to other work does not spin (docs/performance.md)."""
    import gc

    gc.set_threshold(*GC_THRESHOLD)
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None):
        import torch    # here, not at the top: the xdist controller runs no test and needs no torch

        torch.set_num_threads(1)
    if hasattr(config, "workerinput"):
        _own_cpu(int(config.workerinput["workerid"].removeprefix("gw")))


def _own_cpu(worker: int) -> None:
    """Worker k's thread clusters run their ranks on allowed CPU k (cyclically), never on another
    worker's: pinned where their caller happened to be, two workers' ranks shared one CPU for most
    of the time both ran clusters while the other CPU idled (zerospec/cluster/threads.py,
    home_cpu). Only the ranks: the worker's own thread, its subprocesses and rank processes still
    run where the OS puts them."""
    import os

    from zerospec.cluster import threads

    if hasattr(os, "sched_getaffinity"):
        allowed = sorted(os.sched_getaffinity(0))
        threads.home_cpu(allowed[worker % len(allowed)])


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session):
    """Collect until a pass finds nothing (as pytest's exit-time check does in its five passes:
    a pass that finds nothing leaves nothing for the next), then freeze what is left: pytest's
    five passes and interpreter shutdown then no longer walk torch's heap (0.16 s a pass, more with
    the cached runs; the run's tail went from 2.5–4.7 s to under a second). Garbage collected
    here, while pytest's unraisable-exception check still listens, is reported as before;
    garbage made after this hook would no longer be."""
    import gc

    for _ in range(5):
        if not gc.collect():
            break
    gc.freeze()


@pytest.fixture(autouse=True, scope="session")
def _report_in_one_process():
    """``zerospec report``'s meta steps in the worker itself, not in a helper process: the workers
    keep every CPU busy already (zerospec/testing/report_hooks.py; the helper's own tests:
    tests/unit/cluster/test_helper.py)."""
    from zerospec.testing.report_hooks import report_in_one_process
    with report_in_one_process():
        yield


# Files that train the shared stage × N_d × model grid (tests/support/runs.py, cached per process).
# Kept on one xdist worker, each run is trained once per session instead of once per worker (about
# 25 s of CPU on 2 workers); the other worker takes the remaining files, of about the same total.
SHARED_GRID = frozenset({"tests/claims/test_communication.py", "tests/claims/test_memory.py",
                         "tests/claims/test_equivalence.py", "tests/claims/test_tables_spec.py",
                         "tests/claims/test_compute.py", "tests/claims/test_activations.py",
                         "tests/claims/test_accumulation.py",
                         "tests/claims/test_scale.py"})   # its meta steps, which the tables read

# Files that start rank processes (zerospec/cluster/processes.py: a forkserver per test process,
# which imports torch and the library once before it forks a rank, 3–4 s of CPU). Kept on one
# worker, only that worker starts a forkserver.
PROCESS_LAUNCHES = frozenset({f"tests/engine/test_{name}.py" for name in (
    "backend", "cli", "decoder_family", "deepspeed", "faults", "gpu", "parity", "peers",
    "robust_engine")}
    | {"spec/engine.md", "tests/unit/cluster/test_helper.py"})   # and the report's helper process
# Files that read C30's storage trace (zerospec/evaluation/cached_memory.py's c30_trace, memoised per
# process: two paper-scale meta steps, ~3 s of CPU): the claim tests and the report's figure; and
# the model-parallel runs M_D's tests compare against (test_model_parallel.py's mp_run, ~2.5 s);
# and the odd runs test_allocator.py's slot tests share with tests/unit/zero_r/test_buffers.py and
# tests/unit/zero/test_stage3_deepspeed.py.
C30_TRACES = frozenset({"tests/claims/test_allocator.py", "tests/unit/cli/test_report.py",
                        "tests/claims/test_model_parallel.py", "tests/unit/zero_r/test_buffers.py",
                        "tests/unit/zero/test_stage3_deepspeed.py"})
# Files that read the report's small measurement (tests/support/report.py: every variant on 4
# ranks, cached per process, up to 1.5 s of CPU): on one worker it is measured once, not twice.
REPORT_MEASUREMENT = frozenset({"tests/claims/test_memory_report.py",
                                "tests/unit/report/test_measure.py"})
# The units that cost most CPU in the default run (docs/performance.md, "Where the time goes"),
# most first: handed out before the rest, so that the run ends on small files and both workers
# finish together (xdist alone orders units by their number of tests, and a unit of few, long
# tests, handed out last, held one worker while the other idled). The rest follow in xdist's order.
START_FIRST = ("the process launches", "the C30 traces and M_D's runs", "the shared grid",
               *(f"tests/{path}.py" for path in (
                   "claims/test_memory_observed", "claims/test_buffers", "test_spec_meta",
                   "claims/test_model_parallel_at_scale", "unit/training/test_scale",
                   "unit/cli/test_plan", "claims/test_checkpoints",
                   "claims/test_model_parallel_training", "claims/test_offload")),
               "the report's measurement",
               "tests/unit/comm/test_posted.py")
UNITS = {**dict.fromkeys(SHARED_GRID, "the shared grid"),
         **dict.fromkeys(PROCESS_LAUNCHES, "the process launches"),
         **dict.fromkeys(C30_TRACES, "the C30 traces and M_D's runs"),
         **dict.fromkeys(REPORT_MEASUREMENT, "the report's measurement")}
_MISSING = sorted(path for path in [*UNITS, *START_FIRST]
                  if path not in UNITS.values() and not (ROOT / path).is_file())
assert not _MISSING, f"tests/support/scheduling.py groups files that do not exist: {_MISSING}"


def next_unit(waiting) -> str:
    """The unit to hand out next: the first of START_FIRST still waiting, else the first waiting
    (xdist's order)."""
    rank = {unit: i for i, unit in enumerate(START_FIRST)}
    return min(waiting, key=lambda unit: rank.get(unit, len(START_FIRST)))   # min: first of equals


@pytest.hookimpl(optionalhook=True)   # xdist's hook: `pytest -p no:xdist` must still run
def pytest_xdist_make_scheduler(config, log):
    """--dist loadfile, with the files of each of SHARED_GRID, PROCESS_LAUNCHES, C30_TRACES and
    REPORT_MEASUREMENT as one unit, START_FIRST's units handed out first (None: xdist's own choice)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class GroupedFileScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            return UNITS.get(scope, scope)

        def _assign_work_unit(self, node) -> None:
            self.workqueue.move_to_end(next_unit(self.workqueue), last=False)
            super()._assign_work_unit(node)
    return GroupedFileScheduling(config, log)


