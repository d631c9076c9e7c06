"""spec/validation.md: zerospec's predictions beside measurements published from real GPUs
(zerospec/evaluation/validation.py, zerospec/paper/measurements.py).

The table needs paper-scale meta steps (torchtitan's two FSDP runs, ZeRO-Offload's search and
Figure 6's allocator search, minutes): slow. The default run checks the rows' arithmetic on
hand-made predictions and the published values against their sources' units.
"""
from __future__ import annotations

from fractions import Fraction

import pytest

from zerospec.evaluation import validation as v
from zerospec.paper import measurements as pm

PAGE = "spec/validation.md"


def test_published_readings_are_gib_of_two_to_the_thirty_bytes():
    """torchtitan prints GiB = 2^30 B to one decimal (torchtitan/metrics.py, _to_gib): 82.4 GiB is
    82.4 · 2^30 B = 88,476,194,406.4 B, about 88.5 GB; a model size has no bytes."""
    tt8 = next(m for m in pm.ALL if m.key == "torchtitan-8gpu")
    assert tt8.bytes == Fraction(824, 10) * 1024**3 and 88.4e9 < tt8.bytes < 88.5e9
    assert all(m.kind == "published measurement" for m in pm.ALL)
    with pytest.raises(ValueError, match="model size"):
        pm.ZERO_OFFLOAD[0].bytes


def test_a_row_is_within_10_percent_up_to_the_boundary_and_names_its_residual_past_it():
    """reserved / published to 2 decimals; the last whole byte at or below 1.1× the published
    bytes is within 10%, the next is not and the row names its residual; a size row reads
    parameters."""
    tt8 = pm.TORCHTITAN[0]
    edge = tt8.bytes * Fraction(11, 10)                  # not a whole number of bytes
    assert edge.denominator > 1
    at = v.row(tt8, v.Prediction(0, edge.numerator // edge.denominator, "bytes"))
    past = v.row(tt8, v.Prediction(0, edge.numerator // edge.denominator + 1, "bytes"))
    assert at[-3:] == ["1.10", "yes", ""] and past[-3:-1] == ["1.10", "no"]
    assert past[-1] == v.RESIDUALS["torchtitan"] != ""
    c1 = pm.ZERO_FIGURE6[0]
    row = v.row(c1, v.Prediction(44 * 10**9, 42 * 10**9, "parameters"))
    assert row[4:9] == ["40B", "44.00B", "42.00B", "1.05", "yes"]
    exact = v.row(c1, v.Prediction(0, 44 * 10**9, "parameters"))      # exactly 1.1 × 40B: within
    assert exact[7:10] == ["1.10", "yes", ""]
    assert v.row(c1, v.Prediction(0, 44 * 10**9 + 1, "parameters"))[8] == "no"


@pytest.mark.slow   # torchtitan's two runs and ZeRO-Offload's search: ~20 s on 2 cores
def test_validation_table(md_snapshot):
    """spec/validation.md's table: torchtitan's readings and ZeRO-Offload's size beside zerospec's
    allocated and reserved prediction, the ratio to 2 decimals, within 10% or the residual named."""
    from zerospec.evaluation.tables import bare
    assert md_snapshot == bare(v.validation_table())


@pytest.mark.slow   # torchtitan's two runs (cached with the table's)
def test_validation_residual_table(md_snapshot):
    """spec/validation.md's parts of torchtitan's reserved reading: the allocated peak, the
    reserved peak on one stream and with the owners' streams, and what is left to the reading."""
    from zerospec.evaluation.tables import bare
    assert md_snapshot == bare(v.residual_table())


TT_COMMAND = ("plan", "--explain", "--preset", "llama-3.1-8b", "--gpus", "8", "--machine",
              "grand-teton-h100", "--stage", "3", "--flavour", "fsdp2", "--precision", "bf16",
              "--seq", "8192", "--micro-batch", "2", "--activation-checkpointing", "selective-op",
              "--format", "json")


@pytest.mark.slow   # two meta steps of Llama 3.1 8B at N = 8
def test_the_pages_command_prints_the_tables_torchtitan_cells(capsys):
    """spec/validation.md's `plan --explain ... --expandable-segments --format json` prints the
    8-GPU row's allocated and reserved peaks, to the byte; without --expandable-segments (the
    allocator's default: segments from cudaMalloc) the reserved peak is within 10% of 82.4 GiB
    too."""
    import json
    from tests.support.cli import run_cli
    rc, out, _ = run_cli(capsys, *TT_COMMAND, "--expandable-segments")
    s = json.loads(out)["summary"]
    p = v.torchtitan_step(8)
    assert rc == 0 and (s["peak_allocated_bytes"], s["peak_reserved_bytes"]) == (p.allocated,
                                                                                  p.reserved)
    rc, out, _ = run_cli(capsys, *TT_COMMAND)
    s = json.loads(out)["summary"]
    assert rc == 0 and s["peak_allocated_bytes"] == p.allocated
    assert abs(Fraction(s["peak_reserved_bytes"]) / pm.TORCHTITAN[0].bytes - 1) <= v.WITHIN


@pytest.mark.slow   # ZeRO-Offload's search (cached with the table's) and one more step
def test_validation_offload_table(md_snapshot):
    """spec/validation.md's ZeRO-Offload row in parts: the fits in layers, Ψ, and the checkpoint
    bytes the GPU holds at the allocator's fit (DeepSpeed's example keeps them on the host)."""
    from zerospec.evaluation.tables import bare
    assert md_snapshot == bare(v.offload_residual_table())

