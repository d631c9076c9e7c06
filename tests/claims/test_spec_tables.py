"""The measured tables, pinned by snapshots and shown verbatim in spec/ (kept fresh by a test).

Update after an intended change: ``pytest tests/claims/test_spec_tables.py --snapshot-update``,
then ``python tools/specsync.py`` (``tox -e spec`` does both).
"""
from __future__ import annotations

import pathlib


from tests.runs import run
from tools import specsync
from zerospec.report import spec_tables as tables

ROOT = pathlib.Path(__file__).resolve().parents[2]
SEED = [(0, {}), (1, {}), (1, {"zero1_comm": "all_reduce"}), (2, {}), (3, {})]


def _seed_runs(n_d=32):
    return [run(s, n_d, **kw) for s, kw in SEED]


def test_memory_table_at_32_gpus(md_snapshot):
    """Seed table 1: per-GPU model states per stage at N = 32, measured vs the paper's formula."""
    assert tables.memory_table(_seed_runs()) == md_snapshot


def test_comm_table_at_32_gpus(md_snapshot):
    """Elements per step per GPU in Ψ units, split by collective, and collectives per step."""
    assert tables.comm_table(_seed_runs()) == md_snapshot


def test_equivalence_table_at_32_gpus(md_snapshot):
    """Losses per step and the largest difference from DP (zero in every stage)."""
    assert tables.equivalence_table(_seed_runs()) == md_snapshot


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
    """Every table in spec/*.md is its snapshot's content (run tools/specsync.py to refresh)."""
    stale = {p.name: s for p in sorted((ROOT / "spec").glob("*.md")) if (s := specsync.sync(p, write=False))}
    assert not stale, f"stale tables in spec/ (run python tools/specsync.py): {stale}"


def test_scale_7_5b_on_64_gpus(md_snapshot):
    """Figure 1 measured: one step of every stage for the 7.5B preset on 64 meta GPUs."""
    from tests.claims.test_scale import one_step
    from zerospec.training.scale import markdown
    assert markdown({s: one_step("7.5B", s, 64) for s in range(4)}) + "\n" == md_snapshot


def test_scale_table1_measured(md_snapshot):
    """Table 1 measured on meta tensors at the paper's round Ψ, bold where a stage first fits."""
    from tests.claims.test_scale import _at_round_psi
    assert tables.measured_table1_md(_at_round_psi) == md_snapshot
