"""Property tests in two sizes: a few examples in the default run, many with the slow cases.

``test_x, test_x_more = examples(50, 200, st.integers())(body)`` gives two hypothesis tests of the
same property: ``test_x`` draws 50 examples in the default run, ``test_x_more`` 200 (marked slow).
A module binds both names; pytest collects each under the name it is bound to.
"""
from __future__ import annotations

import pytest
from hypothesis import given, settings


def examples(default: int, slow: int, *args, **kwargs):
    """The property ``body`` (``@given(*args, **kwargs)``'s test) with ``default`` examples, and
    again with ``slow`` examples marked slow: each its own @given test, so each has its settings."""
    if not 0 < default < slow:
        raise ValueError(f"want 0 < default < slow examples, got {default} and {slow}")

    def both(body):
        fast = settings(max_examples=default, deadline=None)(given(*args, **kwargs)(body))
        more = settings(max_examples=slow, deadline=None)(given(*args, **kwargs)(body))
        return fast, pytest.mark.slow(more)
    return both
