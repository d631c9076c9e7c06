"""The numbers spec/models.md shows: the presets' exact Ψ, and the worked `plan --explain`
(Llama-3-70B on 64 H100s), pinned as integers the ledgers count."""
from __future__ import annotations

import pytest

from zerospec.model.presets import PAPER, PUBLISHED


def presets_table() -> str:
    rows = ["| preset | layers | d | heads | kv heads | d_ff | vocab | context | Ψ |",
            "|---|---|---|---|---|---|---|---|---|"]
    for name, p in {**PAPER, **PUBLISHED}.items():
        m = p.model
        rows.append(f"| {name} | {m.n_layer} | {m.n_embd:,} | {m.n_head} | {m.kv_heads} | {m.ff:,} "
                    f"| {m.vocab_size:,} | {m.block_size:,} | {p.psi:,} |")
    return "\n".join(rows)


def test_presets_table(md_snapshot):
    """Each paper and published preset's shape and exact Ψ (the decoder family's closed form)."""
    assert md_snapshot == presets_table()


@pytest.mark.slow   # one traced meta step of Llama-3-70B: ~4 s
def test_worked_example(md_snapshot):
    """`plan --explain` of Llama-3-70B, ZeRO-3, 64 H100s, seq 8192, a checkpoint every block: its
    tables as the command prints them (bytes from the ledgers; GB from those integers)."""
    from tools import specfigures
    from zerospec.plan.explain import tables
    from zerospec.render.format import render
    assert md_snapshot == render(tables(specfigures.explain_example()), "markdown")


@pytest.mark.slow   # the same step (cached when run with test_worked_example)
def test_explain_figure_data(md_snapshot):
    """What spec/figures/explain_memory.svg draws: the step's curve, its peak, the GPU's memory."""
    from tools import specfigures
    assert md_snapshot == specfigures.explain_figure_data()


SUGGEST = ("plan", "--preset", "llama-3-70b", "--gpus", "64", "--machine", "dgx-h100", "--stage",
           "3", "--seq", "8192", "--explain")


def suggestions_example() -> str:
    """The suggestion table and the verdict `zerospec plan <SUGGEST>` prints."""
    from zerospec.__main__ import build_parser
    from zerospec.cli.plan import _resolve_machine
    from zerospec.cli.plan_explain import explain_run
    from zerospec.render.format import render
    args = build_parser("plan").parse_args(list(SUGGEST))
    tables, summary = explain_run(args, _resolve_machine(args))
    verdict = f"peak_bytes {summary['peak_bytes']:,}, fits {summary['fits']}, " \
              f"attention {summary['attention']}"
    return verdict + "\n\n" + render([t for t in tables if t.name == "explain_suggestions"],
                                     "markdown")


@pytest.mark.slow   # Llama-3-70B's step and a dozen changed steps: ~20 s
def test_suggestions_example(md_snapshot):
    """What `plan --explain` suggests for Llama-3-70B at 8,192 tokens on 64 H100s without
    checkpointing: each change with its measured peak, fitting first."""
    assert md_snapshot == suggestions_example()
