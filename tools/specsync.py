"""Rewrite the measured tables in spec/*.md from the syrupy snapshots (or check they match).

A table in a spec page sits between two markers naming its snapshot file:

    <!-- snapshot: tests/claims/__snapshots__/test_tables_spec/test_memory_table_at_32_gpus.md -->
    | ... the snapshot's content ... |
    <!-- /snapshot -->

Usage: ``python tools/specsync.py`` rewrites every block; ``--check`` only lists stale ones
(exit 1). Tables are never typed by hand: update a snapshot with ``pytest --snapshot-update``
(or ``tox -e spec``), then run this.
"""
from __future__ import annotations

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"(<!-- snapshot: (?P<path>\S+) -->\n)(?P<body>.*?)(<!-- /snapshot -->)", re.S)


def blocks(text: str):
    for m in BLOCK.finditer(text):
        yield m.group("path"), m.group("body")


def sync(page: pathlib.Path, write: bool) -> list[str]:
    """Stale snapshot paths in ``page``; with ``write``, the page is rewritten from them."""
    text = page.read_text()
    stale = []

    def replace(m):
        snap = ROOT / m.group("path")
        if not snap.exists():
            raise FileNotFoundError(f"{page.name}: snapshot {m.group('path')} does not exist")
        body = snap.read_text()
        if body != m.group("body"):
            stale.append(m.group("path"))
        return m.group(1) + body + m.group(4)

    new = BLOCK.sub(replace, text)
    if write and new != text:
        page.write_text(new)
    return stale


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = {p.name: s for p in sorted((ROOT / "spec").glob("*.md")) if (s := sync(p, not check))}
    for page, paths in stale.items():
        print(f"{'stale' if check else 'rewrote'}: spec/{page}: {', '.join(paths)}")
    return 1 if (check and stale) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
