"""The measured tables, pinned by snapshots and shown verbatim in spec/ (kept fresh by a test).

Update after an intended change: ``pytest tests/claims/test_tables_spec.py -m "not deepspeed"
--snapshot-update`` (the ``-m`` brings back the tables measured at N = 32, which the default run
leaves to the slow cases), then ``python tools/specsync.py`` (``tox -e spec`` does both).
"""
from __future__ import annotations

import pathlib

import pytest

from tests.support.runs import STEPS, run
from tools import specfigures, specsync
from zerospec.render import spec_tables as tables

ROOT = pathlib.Path(__file__).resolve().parents[2]
SEED = [(0, {}), (1, {}), (1, {"zero1_comm": "all_reduce"}), (2, {}), (3, {})]


def _seed_runs(n_d=32):
    return [run(s, n_d, **kw) for s, kw in SEED]


@pytest.mark.slow   # N = 32 (the FLOPs: 8), the wider sizes (tests/support/runs.py, N_DS_DEFAULT)
def test_memory_table_at_32_gpus(md_snapshot):
    """Seed table 1: per-GPU model states per stage at N = 32, measured vs the paper's formula."""
    assert tables.memory_table(_seed_runs()) == md_snapshot


@pytest.mark.slow   # N = 32 (the FLOPs: 8), the wider sizes (tests/support/runs.py, N_DS_DEFAULT)
def test_comm_table_at_32_gpus(md_snapshot):
    """Elements per step per GPU in Ψ units, split by collective, and collectives per step."""
    assert tables.comm_table(_seed_runs()) == md_snapshot


@pytest.mark.slow   # N = 32 (the FLOPs: 8), the wider sizes (tests/support/runs.py, N_DS_DEFAULT)
def test_equivalence_table_at_32_gpus(md_table_snapshot):
    """Losses per step and the largest difference from DP (zero in every stage)."""
    # losses within fp32 rounding per step (spec/determinism.md); Δ = 0 exactly
    assert tables.equivalence_table(_seed_runs()) == md_table_snapshot(steps=["loss at steps 1…"])


@pytest.mark.slow   # N = 32 (the FLOPs: 8), the wider sizes (tests/support/runs.py, N_DS_DEFAULT)
def test_flops_table_at_8_gpus(md_snapshot):
    """Forward/backward FLOPs per GPU (unchanged) and optimizer elements (Ψ → Ψ/N)."""
    assert tables.flops_table([run(s, 8, steps=1, count_flops=True) for s in range(4)]) == md_snapshot


def test_paper_table1(md_snapshot):
    """The paper's Table 1 recomputed from theory.py."""
    assert tables.table1_md() == md_snapshot


def test_paper_table2(md_snapshot):
    """The paper's Table 2 recomputed from theory.py."""
    assert tables.table2_md() == md_snapshot


def test_spec_pages_show_the_snapshots_verbatim():
    """Every table in spec/*.md is its snapshot's content, and every number a sentence quotes from
    a snapshot (a cell marker) is that cell (run tools/specsync.py to refresh)."""
    stale = {p.name: s for p in sorted((ROOT / "spec").glob("*.md")) if (s := specsync.sync(p, write=False))}
    assert not stale, f"stale tables or numbers in spec/ (run python tools/specsync.py): {stale}"


def test_spec_figures_are_drawn_from_the_current_snapshots():
    """Every figure in spec/figures/ records the sha256 of the snapshot files its data are, and
    tools/specfigures.py draws it only from data equal to them: a snapshot that changed since (or
    a figure drawn from other data) fails here. Every figure is committed, and embedded by its page."""
    stale = {n: why for n, f in specfigures.FIGURES.items() if (why := specfigures.stale(f))}
    assert not stale, f"stale figures in spec/figures/ (run python tools/specfigures.py): {stale}"
    assert {p.name for p in (ROOT / "spec" / "figures").iterdir()} == {
        f"{n}.svg" for n in specfigures.FIGURES}
    for name, fig in specfigures.FIGURES.items():
        assert f"](figures/{name}.svg)" in (ROOT / "spec" / fig.page).read_text(), \
            f"spec/{fig.page} does not show figures/{name}.svg"


def test_scale_7_5b_on_64_gpus(md_snapshot):
    """Figure 1 measured: one step of every stage for the 7.5B preset on 64 meta GPUs."""
    from tests.claims.test_scale import one_step
    assert tables.scale_table({s: one_step("7.5B", s, 64) for s in range(4)}) == md_snapshot


def test_scale_table1_measured(md_snapshot):
    """Table 1 measured on meta tensors at the paper's round Ψ, bold where a stage first fits."""
    from tests.claims.test_scale import at_round_psi
    assert tables.measured_table1_md(at_round_psi) == md_snapshot


SNAPSHOTS = ROOT / "tests" / "claims" / "__snapshots__"


def _cells(table: str, row: int) -> list[str]:
    """The cells of data row ``row`` (0: the first row under the |---| rule)."""
    return [c.strip() for c in table.splitlines()[2 + row].strip("|").split("|")]


def _with_cell(table: str, row: int, col: int, text: str) -> str:
    """``table`` with the cell at data row ``row``, column ``col`` replaced by ``text``."""
    lines = table.splitlines()
    cells = _cells(table, row)
    cells[col] = text
    lines[2 + row] = "| " + " | ".join(cells) + " |"
    return "\n".join(lines) + "\n"


def test_a_measured_loss_may_move_within_its_step_budget_but_not_by_a_visible_digit(md_table_snapshot):
    """Losses match within t·2⁻¹⁵ at step t (spec/determinism.md); a third-digit error or a Δ of 1e-3 for 0 fails."""
    ext = md_table_snapshot(steps=["loss at steps 1…"]).extension
    snap = (SNAPSHOTS / "test_tables_spec" / "test_equivalence_table_at_32_gpus.md").read_text()
    losses = [float(x) for x in _cells(snap, 0)[1].split()]

    def dp_losses_times(*factors):   # DP's row with each step's loss scaled, printed as the table does
        return _with_cell(snap, 0, 1, " ".join(f"{x * f:.5f}" for x, f in zip(losses, factors)))

    def matches(table):
        return ext.matches(serialized_data=table, snapshot_data=snap)
    assert matches(_with_cell(snap, 0, 1, _cells(snap, 0)[1]))          # the rebuilt row is the row
    assert len(losses) == STEPS == 3                                  # the claim grid's steps
    assert matches(dp_losses_times(1, 1, 1 + 6e-5))                    # step 3: within 3·2⁻¹⁵ = 9.2e-5
    assert not matches(dp_losses_times(1 + 6e-5, 1, 1))                # step 1: beyond 2⁻¹⁵ = 3.1e-5
    assert not matches(dp_losses_times(1, 1, 1 + 1e-3))                # a wrong third significant digit
    assert not matches(_with_cell(snap, 0, 2, "0.001"))                 # Δloss 1e-3 where it is 0
    assert not matches(_with_cell(snap, 0, 1, _cells(snap, 0)[1] + "0"))  # printed with another digit


def test_a_nonzero_delta_is_pinned_as_nonzero_and_a_zero_delta_exactly(md_table_snapshot):
    """A Δ from other micro-batches may take any nonzero size; it may not become 0, nor a 0 become 1e-3."""
    ext = md_table_snapshot(nonzero=["max Δmaster vs uninterrupted N run"]).extension
    snap = (SNAPSHOTS / "test_checkpoints" / "test_checkpoint_continuation_table.md").read_text()
    other = next(i for i in range(len(snap.splitlines()) - 2) if _cells(snap, i)[6] != "0")

    def matches(table):
        return ext.matches(serialized_data=table, snapshot_data=snap)
    assert matches(_with_cell(snap, other, 6, "3.1e-06"))
    assert not matches(_with_cell(snap, other, 6, "0"))
    assert not matches(_with_cell(snap, other, 6, "0.0"))              # a zero, printed otherwise
    assert not matches(_with_cell(snap, 0, 6, "0.001"))
