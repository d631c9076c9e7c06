"""tools/specfigures.py: a figure of spec/ is drawn only from data equal to its snapshots, records
their sha256 in its SVG, and is stale as soon as one of them changes."""
from __future__ import annotations

import pytest

from tools import specfigures

SNAP = "tests/claims/__snapshots__/test_x/test_data.md"


@pytest.fixture
def tree(tmp_path, monkeypatch):
    """A repository with one snapshot file, as specfigures' ROOT, and a figure of a line whose
    data are that file's."""
    (tmp_path / SNAP).parent.mkdir(parents=True)
    (tmp_path / SNAP).write_text("| x | y |\n|---|---|\n| 1 | 2 |\n")
    monkeypatch.setattr(specfigures, "ROOT", tmp_path)
    monkeypatch.setattr(specfigures, "OUT", tmp_path / "spec" / "figures")
    data = {"text": "| x | y |\n|---|---|\n| 1 | 2 |"}

    def draw(out):
        from zerospec.render.savefig import pyplot, save_figure
        fig, ax = pyplot().subplots(figsize=(2, 2))
        ax.plot([0, 1], [1, 2])
        return save_figure(fig, out, "line")
    return specfigures.Figure("line", "p.md", (SNAP,), lambda: {SNAP: data["text"]}, draw), data


def test_a_figure_records_the_sha256_of_its_snapshots_and_is_fresh_until_one_changes(tree):
    fig, _ = tree
    assert specfigures.stale(fig) == "not drawn"
    path = specfigures.draw(fig)
    assert specfigures.recorded(path) == {SNAP: specfigures.digest(SNAP)}
    assert specfigures.stale(fig) is None
    snap = specfigures.ROOT / SNAP
    snap.write_text(snap.read_text().replace("| 2 |", "| 3 |"))          # the data changed
    assert specfigures.stale(fig) == f"drawn before {SNAP} changed"


def test_a_figure_whose_data_differ_from_its_snapshot_is_not_drawn(tree):
    fig, data = tree
    data["text"] = "| x | y |\n|---|---|\n| 1 | 3 |"
    with pytest.raises(SystemExit, match=f"line: its data differ from {SNAP}"):
        specfigures.draw(fig)
    assert not fig.path.exists()


def test_a_figure_without_the_record_of_its_snapshots_is_stale(tree):
    fig, _ = tree
    fig.path.parent.mkdir(parents=True)
    fig.path.write_text("<svg/>")
    assert specfigures.stale(fig) == f"records [], its data are ['{SNAP}']"


def test_every_figure_names_snapshot_files_of_its_own_pinned_data():
    """The registry: each figure's snapshots exist and are what its ``pinned`` renders (by name)."""
    for fig in specfigures.FIGURES.values():
        assert fig.snapshots and all((specfigures.ROOT / s).exists() for s in fig.snapshots), fig.name
        assert fig.name != "timeline"      # measured wall time: not the same on every machine
