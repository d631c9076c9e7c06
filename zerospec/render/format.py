"""The one table and number-formatting module: every table zerospec prints goes through here.

A :class:`Table` holds raw cell values (ints, exact Fractions, floats, strings) and, per column, how
to show them in Markdown; it renders three ways: Markdown for people, CSV and JSON for programs.
CSV and JSON get the raw values (integral Fractions as ints, others as floats), so nothing is lost
to display rounding. ``bold`` marks cells by (row, column), as the paper's Table 1 marks the
configurations that fit (C15). The bare tables pinned in spec/ use :func:`markdown` directly.
Numbers: :func:`sig` is the one significant-digits rounding; :func:`max_delta` the one "largest
difference" that every Δ column shows.
"""
from __future__ import annotations

import csv
import dataclasses
import io
import json
from decimal import ROUND_HALF_UP, Decimal
from fractions import Fraction
from typing import Any, Callable

GB, GIB = 10**9, 2**30
MB = 10**6
UNITS = {"GB": GB, "GiB": GIB}


@dataclasses.dataclass
class Table:
    name: str                                   # short key: csv/json section, --tables filter
    title: str
    columns: list[str]
    rows: list[list[Any]] = dataclasses.field(default_factory=list)
    fmt: dict[int, Callable[[Any], str]] = dataclasses.field(default_factory=dict)
    notes: list[str] = dataclasses.field(default_factory=list)
    bold: set[tuple[int, int]] = dataclasses.field(default_factory=set)

    def add(self, *cells) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"table {self.name!r}: row has {len(cells)} cells, expected "
                             f"{len(self.columns)} ({', '.join(self.columns)})")
        self.rows.append(list(cells))

    def cell_text(self, i: int, value: Any) -> str:
        if value is None:
            return "—"
        if i in self.fmt:
            return self.fmt[i](value)
        return plain(value)


# -- number formatting -------------------------------------------------------------------------------
def round_half_up(x, places: int) -> Decimal:
    """``x`` (int, Fraction or float) rounded half up to ``places`` decimals, exactly."""
    x = Fraction(x)
    q = Decimal(1).scaleb(-places)
    d = Decimal(x.numerator) / Decimal(x.denominator) if x.denominator != 1 else Decimal(x.numerator)
    # Decimal division carries 28 significant digits: plenty for table cells.
    return d.quantize(q, rounding=ROUND_HALF_UP)


def sig(x, digits: int = 3, *, keep_zeros: bool = False) -> str:
    """``x`` at ``digits`` significant digits, the one rounding every table uses.

    Default (the report and ``plan``): exact, half up, never fewer digits than the integer part,
    trailing zeros dropped: 4187.5 -> 4188, 41.25 -> 41.3, 7.5 -> 7.5, 30 -> 30, 0.1171875 -> 0.117.

    ``keep_zeros=True`` (the pinned tables of spec/): Python's ``#g`` on the float, so a column reads
    at one precision (1 -> 1.000 at 4 digits); ties go to even on the binary value (35.625 -> 35.62),
    below 1e-4 an exponent (1.866e-06), at or above 10^(digits−1) no decimals (4187.5 -> 4188).
    """
    if keep_zeros:
        x = float(x)
        if x == 0:
            return "0"
        if abs(x) < 1e-4:
            return f"{x:.{digits - 1}e}"
        if abs(x) >= 10 ** (digits - 1):
            return f"{x:.0f}"
        return f"{x:#.{digits}g}"
    x = Fraction(x)
    if x == 0:
        return "0"
    mag = len(str(abs(int(x)))) if abs(x) >= 1 else 0
    if abs(x) < 1:
        places, y = 0, abs(x)
        while y < Fraction(1, 10):
            y *= 10
            places += 1
        places += digits
    else:
        places = max(0, digits - mag)
    return _trimmed(x, places)


def plain(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, Fraction):
        return f"{value:,}" if value.denominator == 1 else sig(value, 4)
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def fmt_int(v) -> str:
    return f"{int(v):,}"


def fmt_bytes(v, unit: str = "GB") -> str:
    """Bytes in decimal GB (the paper's unit) or GiB, 3 significant digits."""
    return f"{sig(Fraction(v) / UNITS[unit], 3)} {unit}"


def fmt_mb(v) -> str:
    return f"{round_half_up(Fraction(v) / MB, 2)} MB"


def _trimmed(v, places: int = 6) -> str:
    """Half-up to ``places`` decimals, trailing zeros dropped: exact values print exactly (1.9375),
    and a ratio off by padding shows it (1.000011) instead of rounding to 1.0000."""
    text = f"{round_half_up(v, places):f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def fmt_delta(v) -> str:
    """A largest difference (:func:`max_delta`) at 4 digits: "0" means bit-identical, never "small"."""
    return sig(v, 4, keep_zeros=True)


def max_delta(a: dict, b: dict) -> float:
    """Largest |a − b| over every tensor of two weight dicts, in float64 (0.0: every bit agrees)."""
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


def fmt_psi(v) -> str:
    """A multiple of Ψ: 1.9375Ψ, 2.90625Ψ, 2Ψ."""
    return f"{_trimmed(v)}Ψ"


def fmt_ratio(v) -> str:
    return _trimmed(v)


def fmt_seconds(v) -> str:
    return f"{v * 1000:.1f} ms" if v < 1 else f"{v:.2f} s"


def fmt_count(v) -> str:
    """A parameter count with a decimal suffix: 7.64B, 128B, 1.02T."""
    v = Fraction(v)
    for unit, scale in (("T", 10**12), ("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if v >= scale:
            return f"{sig(v / scale, 3)}{unit}"
    return f"{int(v)}"


# -- renderers --------------------------------------------------------------------------------------
def _md_escape(text: str) -> str:
    return text.replace("|", "\\|")


def markdown(header: list[str], rows: list[list], bold=frozenset()) -> str:
    """The one Markdown table renderer: a header, a separator, one line per row. Cells are
    ``str()``-ed with ``|`` escaped; (row, column) pairs in ``bold`` are wrapped in ``**``."""
    lines = ["| " + " | ".join(_md_escape(str(c)) for c in header) + " |", "|" + "---|" * len(header)]
    for r, row in enumerate(rows):
        cells = [_md_escape(str(c)) for c in row]
        lines.append("| " + " | ".join(f"**{c}**" if (r, i) in bold else c
                                       for i, c in enumerate(cells)) + " |")
    return "\n".join(lines) + "\n"


def render_markdown(tables: list[Table], header: list[str] | None = None) -> str:
    """Each table as ``### title``, its Markdown, then its notes, after an optional header."""
    out: list[str] = list(header or [])
    for t in tables:
        if out:
            out.append("")
        out += [f"### {t.title}", ""]
        rows = [[t.cell_text(i, v) for i, v in enumerate(row)] for row in t.rows]
        out.append(markdown(t.columns, rows, t.bold).rstrip("\n"))
        if t.notes:
            out.append("")
            out.extend(t.notes)
    return "\n".join(out) + "\n"


def _raw(value: Any) -> Any:
    if isinstance(value, Fraction):
        return value.numerator if value.denominator == 1 else float(value)
    return value


def render_csv(tables: list[Table]) -> str:
    """One CSV block per table, headed by ``# name: title``, blocks separated by a blank line."""
    buf = io.StringIO()
    for k, t in enumerate(tables):
        if k:
            buf.write("\n")
        buf.write(f"# {t.name}: {t.title}\n")
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(t.columns)
        for row in t.rows:
            w.writerow(["" if v is None else _raw(v) for v in row])
    return buf.getvalue()


def to_json(tables: list[Table], meta: dict | None = None, summary: dict | None = None) -> str:
    doc = {"meta": meta or {}, **({"summary": summary} if summary is not None else {}),
           "tables": [{"name": t.name, "title": t.title, "columns": t.columns,
                       "rows": [[_raw(v) for v in row] for row in t.rows], "notes": t.notes,
                       "bold": sorted(t.bold)}
                      for t in tables]}
    return json.dumps(doc, indent=2, default=str) + "\n"


def render(tables: list[Table], fmt: str, header: list[str] | None = None,
           meta: dict | None = None, summary: dict | None = None) -> str:
    """``summary``: a dict a script reads (json only: ``"summary"`` beside the tables)."""
    if fmt == "markdown":
        return render_markdown(tables, header)
    if fmt == "csv":
        return render_csv(tables)
    if fmt == "json":
        return to_json(tables, meta, summary)
    raise ValueError(f"unknown format {fmt!r}; accepted: markdown, json, csv")


FORMATS = ("markdown", "json", "csv")
