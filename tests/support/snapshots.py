"""Markdown snapshots: exact, or within a derived tolerance (the ``md_snapshot`` and
``md_table_snapshot`` fixtures, wired in tests/conftest.py).

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
