"""Shared test setup: Markdown snapshots (exact, or within a derived tolerance) and xdist workers.

Snapshots pin what is the same on every machine (design property 7, spec/determinism.md, "What a
snapshot pins on every machine"): integers, equalities and decisions exactly; values measured by
training (losses, norms) within a tolerance derived from fp32 rounding and the step they were
measured at, because their last digits depend on which CPU vector kernels torch runs.
"""
from __future__ import annotations

import math
import re

import pytest
from syrupy.extensions.single_file import SingleFileSnapshotExtension, WriteMode

# The derivation is spec/determinism.md's ("What a snapshot pins on every machine").
U_FP32 = 2.0 ** -24        # fp32 unit roundoff
LAMBDA = 4                 # n roundings add like a random walk, λ·√n·u (Higham–Mary 2019), not n·u
N_LONGEST = 2 ** 12        # the longest reduction in any pinned run: a loss mean over 32·2·64 tokens
PER_STEP = 2 * LAMBDA * math.sqrt(N_LONGEST) * U_FP32   # two builds, each off by λ√n·u: 2^-15
assert PER_STEP == 2.0 ** -15


# Young collections every 20,000 net container allocations instead of CPython's 700: a training run's
# objects that live for one forward and backward then die young, instead of reaching the old
# generation and bringing on full collections of the worker's whole heap (the figures:
# docs/performance.md, "Garbage collection in the test workers").
GC_THRESHOLD = (20_000, 20, 20)


def pytest_configure(config):
    """Young garbage collections less often (GC_THRESHOLD). An xdist worker computes on one thread:
    -n auto starts one worker per CPU already, and a worker's second OpenMP thread would only spin
    against the other workers (as the virtual cluster does for its ranks, spec/engine.md)."""
    import gc

    gc.set_threshold(*GC_THRESHOLD)
    if hasattr(config, "workerinput"):
        import torch    # here, not at the top: the xdist controller runs no test and needs no torch

        torch.set_num_threads(1)


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
    tests/unit/test_report_helper.py)."""
    from zerospec.testing.report_hooks import report_in_one_process
    with report_in_one_process():
        yield


# Files that train the shared stage × N_d × model grid (tests/runs.py, cached per process). Kept on
# one xdist worker, each run is trained once per session instead of once per worker (about 25 s
# of CPU on 2 workers); the other worker takes the remaining files, of about the same total.
SHARED_GRID = frozenset({"tests/claims/test_communication.py", "tests/claims/test_memory.py",
                         "tests/claims/test_equivalence.py", "tests/claims/test_spec_tables.py",
                         "tests/claims/test_compute.py",
                         "tests/claims/test_scale.py"})   # its meta steps, which the tables read

# Files that start rank processes (zerospec/cluster/processes.py: a forkserver per test process,
# which imports torch and the library once before it forks a rank, 3–4 s of CPU). Kept on one
# worker, only that worker starts a forkserver.
PROCESS_LAUNCHES = frozenset({f"tests/engine/test_{name}.py" for name in (
    "backend", "cli", "deepspeed", "faults", "gpu", "parity", "peers", "robust_engine")}
    | {"spec/engine.md", "tests/unit/test_report_helper.py"})   # and the report's helper process
# Files that read C30's storage trace (zerospec/evaluation/memory.py's c30_trace, memoised per
# process: two paper-scale meta steps, ~3 s of CPU): the claim tests and the report's figure; and
# the model-parallel runs M_D's tests compare against (test_model_parallel.py's mp_run, ~2.5 s).
C30_TRACES = frozenset({"tests/claims/test_fragmentation.py", "tests/unit/test_cli_report.py",
                        "tests/claims/test_model_parallel.py"})
UNITS = {**dict.fromkeys(SHARED_GRID, "the shared grid"),
         **dict.fromkeys(PROCESS_LAUNCHES, "the process launches"),
         **dict.fromkeys(C30_TRACES, "the C30 traces and M_D's runs")}


@pytest.hookimpl(optionalhook=True)   # xdist's hook: `pytest -p no:xdist` must still run
def pytest_xdist_make_scheduler(config, log):
    """--dist loadfile, with the files of each of SHARED_GRID, PROCESS_LAUNCHES and C30_TRACES as
    one unit (None: xdist's own choice)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class GroupedFileScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            return UNITS.get(scope, scope)
    return GroupedFileScheduling(config, log)


def step_rtol(step: int) -> float:
    """Relative tolerance for a value measured at training step ``step`` (1-based): the per-step
    rounding budget, accumulated once per step that fed it."""
    return step * PER_STEP


def _number(text: str) -> tuple[float, float]:
    """A printed number and one unit of its last printed digit (``6.80450`` → 1e-5)."""
    m = re.fullmatch(r"-?\d+(?:\.(\d+))?(?:e([-+]\d+))?", text)
    if m is None:
        raise ValueError(f"not a printed number: {text!r}")
    return float(text), 10.0 ** (int(m.group(2) or 0) - len(m.group(1) or ""))


def _digits(text: str) -> str:
    """The printed shape of a number (``6.80450`` → ``0.00000``): formatting stays exact."""
    return re.sub(r"\d", "0", text)


def steps_cell_mismatch(snap: str, got: str) -> str | None:
    """Why ``got`` is not ``snap`` within tolerance (None if it is): the k-th number of the cell was
    measured at step k and may differ by step_rtol(k) plus one unit of its last printed digit
    (both sides were rounded to it once)."""
    a, b = snap.split(), got.split()
    if len(a) != len(b):
        return f"{len(b)} values, the snapshot has {len(a)}"
    for k, (x, y) in enumerate(zip(a, b), 1):
        if _digits(x) != _digits(y):
            return f"step {k}: {y} is printed unlike {x}"
        (vx, unit), (vy, _) = _number(x), _number(y)
        tol = step_rtol(k) * max(abs(vx), abs(vy)) + unit
        if not abs(vx - vy) <= tol:
            return f"step {k}: {y} vs {x}: |Δ| = {abs(vx - vy):.3g} > {tol:.3g} (step_rtol({k}) + 1 printed unit)"
    return None


def nonzero_cell_mismatch(snap: str, got: str) -> str | None:
    """A Δ column: "0" (bit-identical) is pinned exactly; a nonzero Δ is rounding noise whose size
    no model pins, so only that it is nonzero is."""
    if snap == "0" or got == "0":
        return None if snap == got else f"{got} where the snapshot has {snap}"
    return None if _number(got)[0] != 0 else f"{got} is not a nonzero difference"


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


class MarkdownSnapshotExtension(SingleFileSnapshotExtension):
    """One small, reviewable ``.md`` file per snapshot: a rendered table.

    Snapshots pin *rendered tables*, not objects, so a reviewer reads exactly what spec/ shows.
    Without named columns the text must match exactly. Update with ``pytest --snapshot-update``
    (or ``tox -e spec``); a value within tolerance matches and so is never rewritten.
    """

    _write_mode = WriteMode.TEXT
    file_extension = "md"
    steps_columns: frozenset[str] = frozenset()     # cells "v1 v2 …": value at steps 1, 2, …
    nonzero_columns: frozenset[str] = frozenset()   # Δ cells: 0 exactly, else only "nonzero"
    mismatch: str | None = None

    def serialize(self, data, **kwargs) -> str:
        if not isinstance(data, str):
            raise TypeError(f"Markdown snapshots take a rendered str, got {type(data).__name__}")
        return data if data.endswith("\n") else data + "\n"

    def matches(self, *, serialized_data, snapshot_data) -> bool:
        if not (self.steps_columns or self.nonzero_columns):
            return serialized_data == snapshot_data
        self.mismatch = self._table_mismatch(str(snapshot_data), str(serialized_data))
        return self.mismatch is None

    def _table_mismatch(self, snap: str, got: str) -> str | None:
        """Cell by cell: every line outside a table, every header and every cell exactly, except
        the cells of the named columns."""
        a, b = snap.splitlines(), got.splitlines()
        if len(a) != len(b):
            return f"{len(b)} lines, the snapshot has {len(a)}"
        header, seen = None, set()
        for i, (x, y) in enumerate(zip(a, b), 1):
            in_table = x.startswith("|")
            header = header if in_table else None
            if header is None or set(x) <= set("|-"):   # text, a header or the |---| rule: exact
                if x != y:
                    return f"line {i} differs"
                if in_table and header is None:
                    header = _cells(x)
                    seen |= set(header)
                continue
            cx, cy = _cells(x), _cells(y)
            if len(cx) != len(cy):
                return f"line {i}: {len(cy)} cells, the snapshot has {len(cx)}"
            for name, p, q in zip(header, cx, cy):
                why = (steps_cell_mismatch(p, q) if name in self.steps_columns else
                       nonzero_cell_mismatch(p, q) if name in self.nonzero_columns else
                       None if p == q else f"{q!r} where the snapshot has {p!r}")
                if why:
                    return f"line {i}, column {name!r}: {why}"
        unknown = (self.steps_columns | self.nonzero_columns) - seen
        if unknown:   # a renamed column would silently fall back to exact text
            raise ValueError(f"columns {sorted(unknown)} are in no table header; headers: {sorted(seen)}")
        return None

    def diff_lines(self, serialized_data, snapshot_data):
        if self.mismatch:
            yield f"outside tolerance: {self.mismatch}"
        yield from super().diff_lines(serialized_data, snapshot_data)


@pytest.fixture
def md_snapshot(snapshot):
    """A Markdown snapshot compared as exact text."""
    return snapshot.use_extension(MarkdownSnapshotExtension)


@pytest.fixture
def md_table_snapshot(snapshot):
    """``md_table_snapshot(steps=[...], nonzero=[...])``: a Markdown table snapshot whose named
    columns hold measured floats — ``steps``: one value per training step, within step_rtol;
    ``nonzero``: a Δ that is 0 exactly or merely nonzero. Every other cell is exact."""
    def use(*, steps=(), nonzero=()):
        ext = type("MeasuredTableExtension", (MarkdownSnapshotExtension,),
                   {"steps_columns": frozenset(steps), "nonzero_columns": frozenset(nonzero)})
        return snapshot.use_extension(ext)
    return use
