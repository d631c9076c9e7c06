"""Rewrite the measured tables and numbers in spec/*.md from the syrupy snapshots (or check they match).

A table in a spec page sits between two markers naming its snapshot file:

    <!-- snapshot: tests/claims/__snapshots__/test_tables_spec/test_memory_table_at_32_gpus.md -->
    | ... the snapshot's content ... |
    <!-- /snapshot -->

A number in a sentence is one cell of a snapshot's table, named by its row and its column:

    the baseline falls to <!-- cell: test_evaluation/test_figure2_baseline_table.md :: 40B ::
    baseline TFLOPS/GPU, one IB link -->7.9<!-- /cell --> TFLOPS/GPU

(on one line). The path is the repository's, or under tests/claims/__snapshots__/ when it does not
start with ``tests/``; the row is the leading cells of exactly one row, `` & ``-separated
(``40B & C1``); the column is its header (``TFLOPS/GPU#2``: the second of that name); an optional
fourth part formats the cell: ``GB1`` (bytes as GB, 10⁹, one decimal), ``GB2``, …

Usage: ``python tools/specsync.py`` rewrites every block and cell; ``--check`` only lists stale
ones (exit 1); ``--tests`` lists the test files whose snapshots spec/ shows (its pages and its
figures, tools/specfigures.py); ``--refresh`` runs those tests with ``--snapshot-update -m "not
deepspeed"``, then rewrites the pages and redraws the stale figures (``tox -e spec``);
``--refresh --quick`` does the same for the default run's pins only (``-m "not slow and not
deepspeed"``, ``tox -e spec-quick``). Tables and numbers are never typed by hand.
"""
from __future__ import annotations

import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
SNAPSHOTS = "tests/claims/__snapshots__"
BLOCK = re.compile(r"(<!-- snapshot: (?P<path>\S+) -->\n)(?P<body>.*?)(<!-- /snapshot -->)", re.S)
CELL = re.compile(r"(?P<open><!-- cell: (?P<path>\S+) :: (?P<row>[^\n]+?) :: (?P<col>[^\n]+?)"
                  r"(?: :: (?P<fmt>GB\d))? -->)(?P<value>[^\n]*?)(?P<close><!-- /cell -->)")
MARKS = {"full": "not deepspeed", "quick": "not slow and not deepspeed"}


def snapshot_path(path: str) -> str:
    """A marker's path as the repository's: ``test_x/y.md`` is under tests/claims/__snapshots__/."""
    return path if path.startswith("tests/") else f"{SNAPSHOTS}/{path}"


def tables(text: str) -> list[tuple[list[str], list[list[str]]]]:
    """The Markdown tables of ``text``: (header cells, data rows' cells) each."""
    out, lines = [], text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("|") and i + 1 < len(lines) and set(lines[i + 1]) <= set("|- ") \
                and (i == 0 or not lines[i - 1].startswith("|")):
            rows = []
            for row in lines[i + 2:]:
                if not row.startswith("|"):
                    break
                rows.append(_cells(row))
            out.append((_cells(line), rows))
    return out


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def cell(text: str, row: str, col: str) -> str:
    """The cell in column ``col`` of the one row whose leading cells are ``row``'s ``&`` parts;
    ``col#2`` is the second column of that name in its table."""
    key = [k.strip() for k in row.split("&")]
    name, _, nth = col.partition("#")
    n = int(nth or 1)
    found = [r[[i for i, c in enumerate(h) if c == name][n - 1]]
             for h, rows in tables(text) if h.count(name) >= n
             for r in rows if r[:len(key)] == key]
    if len(found) != 1:
        raise LookupError(f"{len(found)} rows match {row!r} in a table with column {col!r}")
    return found[0]


def formatted(value: str, fmt: str | None) -> str:
    """A cell as a sentence quotes it: as printed, or bytes as GB to ``GB<n>``'s n decimals."""
    if fmt is None:
        return value
    return f"{int(value.replace(',', '')) / 1e9:.{int(fmt[2:])}f}"


def sync(page: pathlib.Path, write: bool) -> list[str]:
    """Stale snapshot paths (and cells) in ``page``; with ``write``, the page is rewritten from them."""
    text = page.read_text()
    stale = []

    def read(path: str) -> str:
        snap = ROOT / snapshot_path(path)
        if not snap.exists():
            raise FileNotFoundError(f"{page.name}: snapshot {path} does not exist")
        return snap.read_text()

    def block(m):
        body = read(m.group("path"))
        if body != m.group("body"):
            stale.append(m.group("path"))
        return m.group(1) + body + m.group(4)

    def one_cell(m):
        try:
            value = formatted(cell(read(m.group("path")), m.group("row"), m.group("col")), m.group("fmt"))
        except LookupError as e:
            raise LookupError(f"{page.name}: {m.group('path')}: {e}") from None
        if value != m.group("value"):
            stale.append(f"{m.group('path')} ({m.group('row')} :: {m.group('col')})")
        return m.group("open") + value + m.group("close")

    new = CELL.sub(one_cell, BLOCK.sub(block, text))
    if write and new != text:
        page.write_text(new)
    return stale


def pages() -> list[pathlib.Path]:
    return sorted((ROOT / "spec").glob("*.md"))


def shown_snapshots() -> set[str]:
    """Every snapshot file spec/ shows (its pages' blocks and cells, its figures' data) and the
    README's verified block reads."""
    try:
        from tools import readme, specfigures
    except ImportError:         # run as a script: tools/ is on the path, the repository may not be
        import readme
        import specfigures
    paths = {snapshot_path(m.group("path")) for p in pages() for pattern in (BLOCK, CELL)
             for m in pattern.finditer(p.read_text())}
    return (paths | {s for f in specfigures.FIGURES.values() for s in f.snapshots}
            | set(readme.SNAPSHOTS))


def test_file(snapshot: str) -> str:
    """The test file that writes ``snapshot``: ``tests/x/__snapshots__/<stem>/<name>.md`` is
    ``tests/x/<stem>.py``'s."""
    parts = pathlib.PurePosixPath(snapshot).parts
    i = parts.index("__snapshots__")
    return str(pathlib.PurePosixPath(*parts[:i], parts[i + 1] + ".py"))


def refresh(quick: bool) -> int:
    """Update the snapshots spec/ shows, then rewrite the pages and redraw the stale figures."""
    files = sorted({test_file(s) for s in shown_snapshots()})
    cmd = [sys.executable, "-m", "pytest", *files, "-m", MARKS["quick" if quick else "full"],
           "--snapshot-update", "-q", "-p", "no:randomly"]
    print(" ".join(cmd), flush=True)
    rc = subprocess.call(cmd, cwd=ROOT)
    if rc:
        return rc
    main([])
    for tool in ("readme.py", "specfigures.py"):     # the README's verified block, then the figures
        rc = subprocess.call([sys.executable, str(ROOT / "tools" / tool)], cwd=ROOT)
        if rc:
            return rc
    return 0


def main(argv: list[str]) -> int:
    if "--tests" in argv:
        print("\n".join(sorted({test_file(s) for s in shown_snapshots()})))
        return 0
    if "--refresh" in argv:
        return refresh("--quick" in argv)
    check = "--check" in argv
    stale = {p.name: s for p in pages() if (s := sync(p, not check))}
    for page, paths in stale.items():
        print(f"{'stale' if check else 'rewrote'}: spec/{page}: {', '.join(paths)}")
    return 1 if (check and stale) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
