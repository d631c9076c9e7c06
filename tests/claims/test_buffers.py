"""ZeRO-R's constant-size buffers, measured on meta (C29, C36; spec/buffers.md): the naive fused fp32
buffer grows as 4Ψ; a C_B bucket stays B elements at every size, for the same bytes on the wire."""
from __future__ import annotations

import functools

import pytest

from zerospec.model.gpt import SMALL
from zerospec.model.presets import gpt, preset
from zerospec.paper import theory
from zerospec.training.scale import measure

GB = theory.GB
N = 64
B = 2 ** 28          # elements: 512 MB of fp16, the order of DeepSpeed's reduce_bucket_size (5e8)
MODELS = {"tiny": SMALL, "1.5B": preset("1.5B").model,
          "3B": gpt(36, 2560, 32),     # C36 names no shape: GPT-2-wide, Ψ = 2,963,637,760
          "1T": preset("1T").model}


@functools.lru_cache(maxsize=None)
def step(name: str, stage: int, bucket):
    """One meta step of ``name`` at N = 64 with ``bucket_elements=bucket``."""
    return measure(MODELS[name], stage, N, bucket_elements=bucket)


def bucket_peak(r) -> int:
    """The bucket category's peak, the same on every rank class."""
    peaks = {c.memory.peak["bucket"] for c in r.classes}
    assert len(peaks) == 1
    return peaks.pop()


@pytest.mark.claim("C29")
def test_a_fused_fp32_gradient_buffer_is_4psi_6gb_at_1_5b(claim_values):
    """Fusing all gradients into one fp32 buffer costs 4Ψ: 6 GB for a 1.5B model (C29)."""
    r = step("1.5B", 0, "model")
    peak = bucket_peak(r)
    claim_values(f"{peak / GB:.2f} GB (Ψ = {r.psi:,})", "6 GB (C29)", "stage 0, meta, ledger")
    assert peak == 4 * r.psi and round(peak / GB) == 6


@pytest.mark.claim("C36")
def test_the_naive_buffer_is_12gb_at_3b_while_cb_stays_at_b(claim_values):
    """A 3B model needs a 12 GB fp32 fused buffer; C_B's stays B elements (C36)."""
    naive, cb = bucket_peak(step("3B", 0, "model")), bucket_peak(step("3B", 0, B))
    claim_values(f"{naive / GB:.2f} GB naive, {cb / GB:.3f} GB with C_B (B = 2^28)",
                 "12 GB naive (C36)", "3B = 36 × 2560, stage 0, meta")
    assert naive == 4 * MODELS["3B"].psi and round(naive / GB) == 12
    assert cb == 2 * B


CASES = [pytest.param(m, s, id=f"{m}/{theory.stage(s).label}",
                      marks=[pytest.mark.slow] if m == "1T" else [])
         for m in ("tiny", "1.5B", "1T") for s in range(4)]


def rows(stage: int) -> int:
    return 1 if stage == 0 else N


@pytest.mark.claim("C36")
@pytest.mark.parametrize("name,stage", CASES)
def test_cb_buffer_peak_is_b_elements_at_every_model_size(name, stage):
    """C_B: the fused buffer's peak is N·⌊B/N⌋ fp16 elements (B when N | B), whatever Ψ — or
    the whole stream, for a model smaller than one bucket (the tiny GPT)."""
    r = step(name, stage, B)
    stream = sum(u.padded for u in r.units)     # every gradient element passes once
    assert bucket_peak(r) == 2 * min(rows(stage) * (B // rows(stage)), stream)
    assert all(c.memory.current["bucket"] == 0 for c in r.classes)   # freed after the step


@pytest.mark.claim("C36")
@pytest.mark.parametrize("name,stage", CASES)
def test_cb_moves_the_same_elements_in_ceil_stream_over_bucket_collectives(name, stage):
    """C_B trades nothing in volume: the same elements per rank (all-reduce: the same cluster
    total); ⌈T/⌊B/rows⌋⌉ collectives per stream of T columns; stage 3's per-use gathers unchanged."""
    on, off = step(name, stage, B), step(name, stage, None)
    a, b = on.comm_ledger(), off.comm_ledger()
    if stage == 0:   # the ring's uneven all-reduce chunks move with the bucket boundaries
        assert sum(a.elements(k) for k in range(N)) == sum(b.elements(k) for k in range(N))
    else:
        assert all(a.elements(k) == b.elements(k) for k in range(N))
    per_stream = theory.bucket_collectives(
        sum(u.padded if stage == 0 else u.chunk for u in on.units), B, rows(stage))
    streams = {0: 1, 1: 2, 2: 2, 3: 1}[stage]     # gradients; + parameters after the step (1, 2)
    gathers = b.count(0, op="all_gather") if stage == 3 else 0
    assert a.count(0) == streams * per_stream + gathers


@pytest.mark.slow
def test_buffers_table(md_snapshot):
    """spec/buffers.md's table: per model at stage 3, N = 64, the bucket peak per mode and the
    collectives and elements per rank of one step."""
    out = ["| model | Ψ | naive fp32 buffer (bytes) | C_B buffer, B = 2^28 (bytes) "
           "| collectives per unit | collectives C_B | elements sent per rank (both) |",
           "|---|---|---|---|---|---|---|"]
    for name in MODELS:
        naive, on, off = step(name, 3, "model"), step(name, 3, B), step(name, 3, None)
        sent = off.comm_elements(0)
        assert on.comm_elements(0) == sent
        out.append(f"| {name} | {on.psi:,} | {bucket_peak(naive):,} | {bucket_peak(on):,} "
                   f"| {off.collectives(0):,} | {on.collectives(0):,} | {sent:,} |")
    assert md_snapshot == "\n".join(out)
