"""zerospec.render.format, the one table and number-formatting module: rounding, the Markdown
renderer every table goes through, and the largest difference that the Δ columns show."""
from __future__ import annotations

from fractions import Fraction

import pytest
import torch

from zerospec.render.format import Table, markdown, max_delta, render_markdown, sig


@pytest.mark.parametrize("x,digits,text", [
    (Fraction(8375, 2), 3, "4188"), (Fraction(165, 4), 3, "41.3"), (Fraction(15, 2), 3, "7.5"),
    (30, 3, "30"), (Fraction(1171875, 10**7), 3, "0.117"), (Fraction(1875, 1000), 3, "1.88"),
    (Fraction(285, 8), 4, "35.63"), (0, 3, "0"), (Fraction(-165, 4), 3, "-41.3"),
])
def test_sig_rounds_half_up_exactly_and_drops_trailing_zeros(x, digits, text):
    """The report's style: 41.25 -> 41.3 and 35.625 -> 35.63 (half up, on the exact value), 30 -> 30."""
    assert sig(x, digits) == text


@pytest.mark.parametrize("x,digits,text", [
    (1, 4, "1.000"), (52.5, 4, "52.50"), (35.625, 4, "35.62"), (4187.5, 4, "4188"),
    (1.866e-6, 4, "1.866e-06"), (0.46875, 4, "0.4688"), (6.804502, 6, "6.80450"), (0.0, 4, "0"),
])
def test_sig_keeping_zeros_is_the_spec_pages_fixed_precision(x, digits, text):
    """spec/'s style: every digit shown (1.000), ties to even on the float (35.625 -> 35.62), 1.866e-06."""
    assert sig(x, digits, keep_zeros=True) == text


def test_markdown_escapes_pipes_and_bolds_the_marked_cells():
    """One header, one rule, one line per row; a | in a cell is escaped; (row, col) in bold gets **."""
    assert markdown(["a", "max |Δ|"], [[1, "x"], [2.5, "y|z"]], {(0, 1)}) == (
        "| a | max \\|Δ\\| |\n|---|---|\n| 1 | **x** |\n| 2.5 | y\\|z |\n")


def test_a_table_renders_as_its_title_its_markdown_and_its_notes():
    """render_markdown = "### title", the same markdown() as spec/'s bare tables, then the notes."""
    t = Table("t", "Title", ["Stage", "Bytes"], fmt={1: lambda v: f"{v:,}"}, notes=["Note."],
              bold={(1, 1)})
    t.add("DP", 16_000)
    t.add("P_os", None)
    body = markdown(["Stage", "Bytes"], [["DP", "16,000"], ["P_os", "—"]], {(1, 1)})
    assert render_markdown([t], header=["# H"]) == f"# H\n\n### Title\n\n{body}\nNote.\n"


def test_max_delta_is_the_largest_difference_over_every_tensor_in_float64():
    """1 − 2⁻³⁰ between fp32 1.0 and 2⁻³⁰ (fp32 subtraction rounds it to 1.0); 0.0 when equal."""
    a = {"w": torch.tensor([1.0, 0.0]), "b": torch.tensor([0.5])}
    b = {"w": torch.tensor([2.0 ** -30, 0.0]), "b": torch.tensor([0.25])}
    assert max_delta(a, b) == 1 - 2.0 ** -30
    assert max_delta(a, {k: v.clone() for k, v in a.items()}) == 0.0
    assert max_delta({"b": a["b"], "w": a["w"]}, {"b": torch.tensor([-2.0]), "w": a["w"]}) == 2.5
