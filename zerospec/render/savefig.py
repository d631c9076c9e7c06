"""Figure set-up and saving, shared by every figure the project draws (matplotlib, Agg backend).

A figure is written as PNG and SVG; the same data draw the same bytes (no date, a fixed SVG salt),
so a committed figure can be checked for staleness.
"""
from __future__ import annotations

import contextlib
import contextvars
from pathlib import Path


def pyplot():
    """matplotlib's pyplot on the Agg backend, imported on first use (the package imports nothing
    heavy until asked)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


DPI = 110
# a context variable, not a module dict: a block's fields reach only the saves of its own thread
_SVG_METADATA: contextvars.ContextVar[dict[str, str]] = contextvars.ContextVar("svg_metadata",
                                                                               default={})


@contextlib.contextmanager
def svg_metadata(**fields: str):
    """Every SVG saved inside the block carries ``fields`` in its metadata (matplotlib's keys:
    ``Description``, ``Title``, …): tools/specfigures.py records there the snapshots a figure of
    spec/ was drawn from."""
    token = _SVG_METADATA.set({**_SVG_METADATA.get(), **fields})
    try:
        yield
    finally:
        _SVG_METADATA.reset(token)


def save_figure(fig, out: Path, name: str) -> list[Path]:
    """``fig`` written to ``out`` as ``name``.png and ``name``.svg, then closed; the paths."""
    # bbox_inches="tight" lays the figure out again for every file to measure its box: once here
    # (the PNG is the same to the pixel; the SVG's box, measured by Agg, within ~0.5 pt)
    from matplotlib.layout_engine import PlaceHolderLayoutEngine
    fig.set_dpi(DPI)
    fig.draw_without_rendering()
    box = fig.get_tightbbox().padded(pyplot().rcParams["savefig.pad_inches"])
    if isinstance(fig.get_layout_engine(), PlaceHolderLayoutEngine):
        fig.set_layout_engine("none")   # tight_layout() ran and left it; savefig would draw again
    paths = []
    # an SVG's element ids are salted at random and its metadata carry the date unless told
    # otherwise: a fixed salt and no date make the same figure the same bytes
    with pyplot().rc_context({"svg.hashsalt": "zerospec"}):
        for ext in ("png", "svg"):
            p = out / f"{name}.{ext}"
            metadata = {"Date": None, **_SVG_METADATA.get()} if ext == "svg" else None
            fig.savefig(p, dpi=DPI, bbox_inches=box, metadata=metadata)
            paths.append(p)
    pyplot().close(fig)
    return paths


def save_svg(fig, out, name: str) -> Path:
    """:func:`save_figure` into ``out`` (made if missing); the SVG's path, for a command's note."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    return next(p for p in save_figure(fig, out, name) if p.suffix == ".svg")
