"""Library code holds the contract, not a log: no dates in zerospec/ but a cited source's."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "zerospec"
DATE = re.compile(r"\b(?:19|20)\d\d-[01]\d-[0-3]\d\b")
CITED = re.compile(r"\bPR #\d+|\barXiv\b|\bv\d+\b")   # a pull request's or a paper version's date


def dated_lines(text: str) -> list[str]:
    """The lines of ``text`` that carry a date no citation on the same line accounts for."""
    return [line.strip() for line in text.splitlines() if DATE.search(line) and not CITED.search(line)]


def test_no_docstring_or_comment_in_the_library_carries_a_date():
    """A date in a docstring or comment is history (git keeps it); a cited source's date stays."""
    found = {str(p.relative_to(ROOT.parent)): lines for p in sorted(ROOT.rglob("*.py"))
             if (lines := dated_lines(p.read_text()))}
    assert not found, f"dates in library code: {found}"


def test_a_cited_pull_requests_date_is_allowed_and_a_log_entrys_is_not():
    """The rule itself: 'in PR #5099, 2024-06-04' passes, '(measured 2026-12-05)' does not."""
    assert dated_lines("changed in PR #5099, 2024-06-04") == []
    assert dated_lines("    13.2 s on 2 cores (measured 2026-12-05)") == ["13.2 s on 2 cores (measured 2026-12-05)"]
