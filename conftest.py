"""Project-wide pytest setup: spec/*.md examples (Sybil), the `claim` marker, the claims summary.

Every test that checks a paper claim carries ``@pytest.mark.claim("C9")`` (ids from
docs/claims.md; ``P1``… are properties of ZeRO the paper relies on without numbering
them, listed in spec/README.md). A test may record what it measured and what the paper says with
the ``claim_values`` fixture; at the end of the run pytest prints one line per claim id, grouped by
section of the paper, like the paper's own tables.
"""
from __future__ import annotations

import doctest
import re
from collections import defaultdict

import pytest
from sybil import Sybil
from sybil.parsers.markdown import PythonCodeBlockParser, SkipParser

# spec/*.md: ```python blocks run; `>>>` examples inside them are doctests. Sybil (rather than
# pytest's --doctest-glob) because it runs fenced Markdown blocks in one namespace per page and
# reports each block as its own test item with its line number.
pytest_collect_file = Sybil(
    parsers=[PythonCodeBlockParser(doctest_optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE),
             SkipParser()],
    patterns=["spec/*.md"],
).pytest()

SECTIONS = [  # (first id, last id, section of the paper)
    ("C1", "C5", "A.1 Memory model"),
    ("C6", "C13", "A.2 ZeRO-DP stage formulas"),
    ("C14", "C14", "A.3 Figure 1 (7.5B, N_d = 64)"),
    ("C15", "C16", "A.4 Table 1"),
    ("C17", "C19", "A.5 Table 2"),
    ("C20", "C26", "A.6 Communication volume"),
    ("C27", "C37", "A.7 ZeRO-R"),
    ("C38", "C57", "A.8-A.10 Evaluation and notes"),
    ("P1", "P9", "Properties ZeRO relies on (not numbered in the paper)"),
]


def _key(cid: str) -> tuple[str, int]:
    m = re.fullmatch(r"([A-Z]+)(\d+)", cid)
    return (m.group(1), int(m.group(2))) if m else (cid, 0)


def section_of(cid: str) -> str:
    for lo, hi, name in SECTIONS:
        if _key(lo)[0] == _key(cid)[0] and _key(lo) <= _key(cid) <= _key(hi):
            return name
    return "Other"


@pytest.fixture
def claim_values(request):
    """``claim_values(measured, paper)``: what this claim test measured, for the summary."""
    def record(measured, paper, note: str = "") -> None:
        request.node.user_properties.append(("claim_values", (str(measured), str(paper), note)))
    return record


def pytest_collection_modifyitems(config, items):
    """Make claim ids keywords, so ``pytest -k C9`` selects the tests that check C9."""
    for item in items:
        for mark in item.iter_markers("claim"):
            item.extra_keyword_matches.add(mark.args[0])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    ids = [m.args[0] for m in item.iter_markers("claim")]
    if ids and (report.when == "call" or report.outcome != "passed"):
        report.user_properties.append(("claim_ids", ids))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    rows: dict[str, dict] = {}
    for status in ("passed", "failed", "error", "skipped"):
        for rep in terminalreporter.stats.get(status, []):
            props = dict(getattr(rep, "user_properties", []))
            for cid in props.get("claim_ids", []):
                row = rows.setdefault(cid, {"passed": 0, "failed": 0, "skipped": 0, "values": None})
                row["failed" if status in ("failed", "error") else status] += 1
                if "claim_values" in props:   # the last case recorded (largest N_d) speaks for the row
                    row["values"] = props["claim_values"]
    if not rows:
        return
    tw = terminalreporter
    tw.section("claims summary (ids from docs/claims.md)")
    by_section = defaultdict(list)
    for cid in sorted(rows, key=_key):
        by_section[section_of(cid)].append(cid)
    for name, _, _ in [(s[2], 0, 0) for s in SECTIONS] + [("Other", 0, 0)]:
        if name not in by_section:
            continue
        tw.write_line(name)
        for cid in by_section[name]:
            r = rows[cid]
            status = "FAIL" if r["failed"] else ("ok" if r["passed"] else "skipped")
            measured, paper, note = r["values"] or ("", "", "")
            vals = f"measured {measured} | paper {paper}" if r["values"] else ""
            tw.write_line(f"  {cid:<5} {status:<7} {r['passed']:>3} passed {r['failed']:>2} failed  "
                          f"{vals}{'  ' + note if note else ''}")
