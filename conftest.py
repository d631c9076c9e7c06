"""Project-wide pytest setup: spec/*.md examples (Sybil) and the claims plugin.

The ``claim`` marker, its statuses and the claims summary are tests/support/claims.py's, loaded
here so that they apply to every run (tests/, spec/ and benchmarks/); what only the tests under
tests/ use (snapshots, xdist scheduling) is wired in tests/conftest.py.
"""
from __future__ import annotations

import doctest

from sybil import Sybil
from sybil.parsers.markdown import PythonCodeBlockParser, SkipParser

pytest_plugins = ["tests.support.claims", "tests.support.workcount", "pytester"]   # pytester: the plugin's own tests

# spec/*.md: ```python blocks run; `>>>` examples inside them are doctests. Sybil (rather than
# pytest's --doctest-glob) because it runs fenced Markdown blocks in one namespace per page and
# reports each block as its own test item with its line number.
pytest_collect_file = Sybil(
    parsers=[PythonCodeBlockParser(doctest_optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE),
             SkipParser()],
    patterns=["spec/*.md"],
).pytest()
