"""A figure is the same bytes every time it is drawn from the same data, SVG included."""
from __future__ import annotations

from zerospec.render.savefig import svg_metadata
from zerospec.report.figures import pyplot, save_figure


def _draw(out):
    out.mkdir()
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(3, 2))
    ax.plot([0, 1, 2], [0, 2, 1], label="line")   # a clipped line: the SVG names its clip path
    ax.legend()
    return save_figure(fig, out, "f")


def test_the_same_figure_is_the_same_bytes_on_another_day(tmp_path, monkeypatch):
    """Drawn twice on different dates (matplotlib reads SOURCE_DATE_EPOCH), PNG and SVG are
    byte-identical: no date in the files, a fixed salt for the SVG's ids."""
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "0")
    first = _draw(tmp_path / "a")
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1000000000")
    second = _draw(tmp_path / "b")
    for p, q in zip(first, second, strict=True):
        assert p.read_bytes() == q.read_bytes(), f"{p.name} differs between two drawings"


def test_svg_metadata_is_written_into_the_svg_inside_the_block_only(tmp_path):
    """tools/specfigures.py records a figure's snapshots in its SVG's Description: inside
    ``svg_metadata(...)`` the SVG carries it (the PNG is unchanged), after the block no longer."""
    with svg_metadata(Description="from tests/x.md sha256:00"):
        svg = next(p for p in _draw(tmp_path / "a") if p.suffix == ".svg")
    assert "<dc:description>from tests/x.md sha256:00</dc:description>" in svg.read_text()
    svg = next(p for p in _draw(tmp_path / "b") if p.suffix == ".svg")
    assert "dc:description" not in svg.read_text()
