"""Fixtures shared by the test suite: Markdown snapshots, shared training runs, axes."""
from __future__ import annotations

import pytest
from syrupy.extensions.single_file import SingleFileSnapshotExtension, WriteMode


class MarkdownSnapshotExtension(SingleFileSnapshotExtension):
    """One small, reviewable ``.md`` file per snapshot: a rendered table of exact integers.

    Snapshots pin *rendered tables*, not objects, so a reviewer reads exactly what spec/ shows.
    Update with ``pytest --snapshot-update`` (or ``tox -e spec``).
    """

    _write_mode = WriteMode.TEXT
    file_extension = "md"

    def serialize(self, data, **kwargs) -> str:
        if not isinstance(data, str):
            raise TypeError(f"Markdown snapshots take a rendered str, got {type(data).__name__}")
        return data if data.endswith("\n") else data + "\n"


@pytest.fixture
def md_snapshot(snapshot):
    return snapshot.use_extension(MarkdownSnapshotExtension)
