"""ZeRO-R's constant-size buffers, measured on meta (C29, C36; spec/buffers.md): the naive fused fp32
buffer grows as 4Ψ; a C_B bucket stays B elements at every size, for the same bytes on the wire.

The naive buffer's size and the buckets' constancy are read off the memory observer
(zerospec/runtime/observe.py, through ``measure(..., trace=True)``): every storage the rank made
and let go, at the storage's own size, from its birth to its death — not what the stage code told
its ledger. The ledger's ``bucket`` category only names which storages are the buffer."""
from __future__ import annotations

import functools

import pytest

from zerospec.model.gpt import SMALL
from zerospec.model.presets import gpt, preset
from zerospec.paper import theory
from zerospec.training.scale import measure
from zerospec.training.config import TrainConfig
from zerospec.training.sections import ZeroROptions

GB = theory.GB
N = 64
B = 2 ** 28          # elements: 512 MB of fp16, the order of DeepSpeed's reduce_bucket_size (5e8)
MODELS = {"tiny": SMALL, "1.5B": preset("1.5B").model,
          "3B": gpt(36, 2560, 32),     # C36 names no shape: GPT-2-wide, Ψ = 2,963,637,760
          "7.5B": preset("7.5B").model,
          "1T": preset("1T").model}


@functools.lru_cache(maxsize=None)
def step(name: str, stage: int, bucket):
    """One meta step of ``name`` at N = 64 with ``bucket_elements=bucket``."""
    return measure(TrainConfig(stage=stage, n_d=N, model=MODELS[name],
                               zero_r=ZeroROptions(bucket_elements=bucket)))


@functools.lru_cache(maxsize=None)
def observed(name: str, stage: int, bucket):
    """:func:`step`, with the observer recording every storage of each rank class."""
    return measure(TrainConfig(stage=stage, n_d=N, model=MODELS[name],
                               zero_r=ZeroROptions(bucket_elements=bucket)), trace=True)


def bucket_peak(r) -> int:
    """The bucket category's peak in the ledger, the same on every rank class."""
    peaks = {c.memory.peak["bucket"] for c in r.classes}
    assert len(peaks) == 1
    return peaks.pop()


def observed_peak(r, category: str = "bucket") -> int:
    """The most bytes of the storages the ledger files under ``category`` that the observer saw
    alive at once (each at its own size, from its birth to its death), the same on every class."""
    peaks = set()
    for c in r.classes:
        live = peak = 0
        for ev in c.allocations:
            if ev.op in ("alloc", "free") and ev.category == category:
                live += ev.nbytes if ev.op == "alloc" else -ev.nbytes
                peak = max(peak, live)
        peaks.add(peak)
    assert len(peaks) == 1
    return peaks.pop()


def largest_storage(r):
    """The largest storage the observer saw made in the step, on rank 0's class (an alloc event:
    its bytes and the ledger's category for it, "" when the ledger never counted it)."""
    return max((ev for ev in r.classes[0].allocations if ev.op == "alloc"), key=lambda ev: ev.nbytes)


PAPER_GB = {"1.5B": 6, "3B": 12}     # C29: 6 GB at 1.5B; C36: 12 GB at 3B (4 B × the round Ψ)


@pytest.mark.claim("C29")
@pytest.mark.parametrize("name", [pytest.param("1.5B"), pytest.param("3B", marks=pytest.mark.claim("C36"))])
def test_a_fused_fp32_gradient_buffer_is_observed_as_4psi_6gb_at_1_5b_12gb_at_3b(name, claim_values):
    """Fusing all gradients into one fp32 buffer costs 4Ψ: 6 GB for a 1.5B model (C29), 12 GB for
    a 3B one (C36). A buffer of Ψ fp32 elements is 4Ψ by construction; what is measured is what
    it costs: observed, the largest storage of a DP step with the fused buffer, and the most bytes
    of buffer alive at once, are 4Ψ (the ledger's bucket peak says the same), and the step's peak
    is the model states plus all of it — the buffer sits whole on top of them, nothing freed."""
    r = observed(name, 0, "model")
    big = largest_storage(r)
    claim_values(f"{big.nbytes / GB:.2f} GB observed (Ψ = {r.psi:,})",
                 f"{PAPER_GB[name]} GB ({'C29' if name == '1.5B' else 'C36'})",
                 "stage 0, N = 64, meta, observer")
    seen = {"largest storage": big.nbytes, "buffer alive at once": observed_peak(r),
            "ledger's bucket peak": bucket_peak(r)}
    assert seen == dict.fromkeys(seen, 4 * r.psi)
    assert big.category == "bucket"
    assert {c.memory.peak_total for c in r.classes} == {r.model_states(0) + 4 * r.psi}
    assert round(big.nbytes / GB) == PAPER_GB[name]


@pytest.mark.claim("C36")
@pytest.mark.parametrize("stage", [0, pytest.param(3, marks=pytest.mark.slow)],   # ~1 s each
                         ids=lambda s: theory.stage(s).label)
def test_the_observed_cb_buffer_is_constant_from_1_5b_to_7_5b_while_the_naive_one_grows(
        stage, claim_values):
    """C_B: the fused buffer's observed peak is 2B bytes at 1.5B and at 7.5B (Ψ ×4.8), where the
    naive fp32 buffer's grows with Ψ, 4Ψ at each (C36). A bucket is B elements by construction;
    what the observer shows is that one is alive at a time (two in flight would make 4B)."""
    small, large = "1.5B", "7.5B"
    assert MODELS[large].psi >= 4 * MODELS[small].psi
    cb = {m: observed_peak(observed(m, stage, B)) for m in (small, large)}
    naive = {m: observed_peak(observed(m, stage, "model")) for m in (small, large)}
    claim_values(f"C_B {cb[small] / GB:.3f} GB at {small} and {cb[large] / GB:.3f} GB at {large}; "
                 f"naive {naive[small] / GB:.2f} → {naive[large] / GB:.2f} GB",
                 "a fixed-size buffer, where the naive one grows (12 GB at 3B) (C36)",
                 f"{theory.stage(stage).label}, N = 64, B = 2^28, meta, observer")
    assert cb[small] == cb[large] == 2 * B       # N | B: every bucket N·⌊B/N⌋ = B fp16 elements
    assert naive == {m: 4 * MODELS[m].psi for m in (small, large)}
    assert naive[large] > naive[small] > cb[small]


def test_observed_buffer_table(md_snapshot):
    """spec/buffers.md's observed table: per model, DP on 64 meta GPUs, the largest storage of the
    step and the most bytes of buffer alive at once, naive and with C_B (B = 2^28), observed."""
    out = ["| model | Ψ | 4Ψ | naive: largest storage (B) | naive: buffer peak (B) "
           "| C_B: buffer peak (B) |", "|---|---|---|---|---|---|"]
    for name in ("1.5B", "3B", "7.5B"):
        naive, cb = observed(name, 0, "model"), observed(name, 0, B)
        out.append(f"| {name} | {naive.psi:,} | {4 * naive.psi:,} | {largest_storage(naive).nbytes:,} "
                   f"| {observed_peak(naive):,} | {observed_peak(cb):,} |")
    assert md_snapshot == "\n".join(out)


CASES = [pytest.param(m, s, id=f"{m}/{theory.stage(s).label}",   # the default run: every stage on the
                      marks=[pytest.mark.slow] if m == "1T" or (m == "1.5B" and s != 2) else [])
         for m in ("tiny", "1.5B", "1T") for s in range(4)]       # tiny GPT, one at paper scale


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
    for name in ("tiny", "1.5B", "3B", "1T"):
        naive, on, off = step(name, 3, "model"), step(name, 3, B), step(name, 3, None)
        sent = off.comm_elements(0)
        assert on.comm_elements(0) == sent
        out.append(f"| {name} | {on.psi:,} | {bucket_peak(naive):,} | {bucket_peak(on):,} "
                   f"| {off.collectives(0):,} | {on.collectives(0):,} | {sent:,} |")
    assert md_snapshot == "\n".join(out)
