"""ZeRO-R's fragmentation (C30) and memory defragmentation M_D (C37), measured.

Paper scale on meta tensors: one step of GPT-2 1.5B is traced storage by storage
(``measure(..., trace=True)``: every storage the rank makes and lets go, temporaries included) and
replayed through the model of PyTorch's caching allocator (zerospec/runtime/allocator.py) on a
32 GB V100. M_D's exactness and bytes on the tiny GPTs, on threads. spec/allocator.md shows the
numbers and what other configurations give.
"""
from __future__ import annotations

import pytest
import torch

from tests.claims.test_model_parallel import mp_run
from tests.support.runs import SCALER, assert_same_training, odd_run, stage_id
from tools import specfigures
from zerospec.model.gpt import SMALL
from zerospec.model.presets import preset
from zerospec.paper import theory
from zerospec.evaluation.cached_memory import C30_BATCH, c30_trace
from zerospec.runtime.trace import replay
from zerospec.training.config import TrainConfig
from zerospec.training.sections import MeshOptions, ZeroROptions
from zerospec.training.sections import ZeroROptions
from zerospec.training.scale import measure

GB, CAP = theory.GB, theory.V100_BYTES       # a 32 GB V100: 32e9 bytes the allocator may reserve
GPT2 = preset("1.5B").model                  # 48 × 1600, vocabulary 50257, sequence 1024
PAGE = "spec/allocator.md#m_d-c37"


def need(trace) -> int:
    """The most bytes the step ever holds (allocated, after rounding): what a device must have
    were there no fragmentation."""
    return max(p.peak_allocated for p in replay(trace).phases)


@pytest.mark.claim("C30")
def test_a_step_that_needs_29gb_runs_out_on_a_32gb_gpu_with_32_percent_free(claim_values):
    """44 sequences per GPU never hold more than 31.15 GB, yet in backward an fp32 gradient of
    the logits (44·1024·50257·4 B = 9.06 GB: the loss is computed in fp32) finds no block:
    9.91 GB (31.0%) is free, in pieces — free blocks of split segments (the largest 1.33 GB) and
    8.18 GB never reserved (C30: out of memory with over 30% still free). One sequence fewer
    fits."""
    assert C30_BATCH == 44
    trace = c30_trace(44, False)
    oom = replay(trace, CAP).oom
    assert need(trace) == 31_150_251_520 < CAP
    assert oom.phase == "backward@1" and oom.error.requested == 44 * 1024 * 50257 * 4
    assert (oom.free, oom.error.reserved, oom.error.largest_free) == (
        9_907_347_968, 23_815_258_112, 1_332_215_808)
    assert oom.free_fraction > 0.30
    assert replay(c30_trace(43, False), CAP).oom is None
    claim_values(f"OOM with {oom.free / GB:.2f} GB = {oom.free_fraction:.1%} free (step needs "
                 f"{need(trace) / GB:.2f} GB)", "over 30% free in extreme cases (C30)",
                 "1.5B, P_os+g+p, N_d=400, k=2, b=44, 32 GB")


def test_c30_out_of_memory_table(md_snapshot):
    """spec/allocator.md's C30 row, the numbers its sentence quotes: what the step needs, the
    request that fails and where, what the allocator holds then and what is free (bytes)."""
    trace = c30_trace(C30_BATCH, False)
    oom = replay(trace, CAP).oom
    never = CAP - oom.error.reserved                 # never reserved: the device's untouched rest
    fewer = "runs" if replay(c30_trace(C30_BATCH - 1, False), CAP).oom is None else "runs out"
    rows = ["| sequences | the step needs (B) | request that fails (B) | in phase | reserved (B) "
            "| free in segments (B) | largest free block (B) | never reserved (B) | free (B) "
            "| free share | one sequence fewer |", "|---|---|---|---|---|---|---|---|---|---|---|",
            f"| {C30_BATCH} | {need(trace):,} | {oom.error.requested:,} | {oom.phase} | {oom.error.reserved:,} "
            f"| {oom.free - never:,} | {oom.error.largest_free:,} | {never:,} | {oom.free:,} "
            f"| {oom.free_fraction:.1%} | {fewer} |"]
    assert md_snapshot == "\n".join(rows)


def test_fragmentation_figure_data(md_snapshot):
    """spec/figures/fragmentation.svg's data (tools/specfigures.py draws it only from these): C30's
    step replayed on 32 GB without and with M_D, the samples' count, peaks and digest."""
    assert md_snapshot == specfigures.c30_figure_data()


@pytest.mark.claim("C37")
def test_md_removes_that_oom_the_checkpoints_in_one_buffer(claim_values):
    """The same step with M_D: its 24 checkpoints (44·1024·1600·2 B each) are copied into one
    buffer allocated at the first; the step fits on the 32 GB GPU, holding no more than without
    M_D (C37: no OOM from a lack of contiguous memory)."""
    off, on = c30_trace(44, False), c30_trace(44, True)
    r = replay(on, CAP)
    ckpt = [e.nbytes for e in on if e.op == "alloc" and e.category == "checkpoints"]
    assert ckpt == [24 * 44 * 1024 * 1600 * 2]
    assert r.oom is None and need(on) == 31_149_202_944 <= need(off)
    claim_values("the 31%-free OOM of C30 gone", "M_D avoids OOM from lack of contiguous "
                 "memory (C37)", "same step, M_D on")


@pytest.mark.slow
@pytest.mark.claim("C37")
def test_md_grows_the_largest_micro_batch_on_32gb_from_43_to_45():
    """Without M_D 44 sequences run out (above); with it 45 fit, and 46 run out only because
    the step then needs more than the GPU has (32.55 GB): a shortage, not fragmentation."""
    assert replay(c30_trace(45, True), CAP).oom is None
    assert replay(c30_trace(46, True), CAP).oom is not None and need(c30_trace(46, True)) > CAP


# -- the table of spec/allocator.md: other configurations at their largest micro-batch ---------------
LABELS = {1: "P_os", 2: "P_os+g", 3: "P_os+g+p"}
# (preset, stage, N_d, N_m, P_a, k, largest micro-batch without M_D, with M_D)
CONFIGS = [("1.5B", 3, 400, 1, False, 2, 43, 45), ("1.5B", 2, 400, 1, False, 3, 40, 41),
           ("1.5B", 2, 400, 1, False, 2, 38, 40), ("1.5B", 3, 400, 1, False, 1, 39, 40),
           ("1.5B", 2, 400, 1, False, 1, 35, 36), ("1.5B", 1, 400, 1, False, 1, 31, 32),
           ("t4-40B-88x6144", 1, 25, 16, True, 1, 111, 107),
           ("t4-100B-125x8192", 2, 25, 16, True, 1, 52, 51)]


def step_on_32gb(name, stage, n_d, n_m, p_a, k, b, md):
    """(need, oom) of one step of rank 0 at micro-batch ``b`` replayed on the 32 GB device."""
    r = measure(TrainConfig(stage=stage, n_d=n_d, model=preset(name).model,
                            zero_r=ZeroROptions(checkpoint_activations=k, partition_activations=p_a,
                                                contiguous_checkpoints=md),
                            mesh=MeshOptions(n_m=n_m)), micro_batch=b, trace=True)
    trace = r.classes[0].allocations
    return need(trace), replay(trace, CAP).oom


def batch_cells(cfg, b: int, md: bool) -> list[str]:
    """"b" if b fits (else says it does not), and how b + 1 runs out: a shortage (needs > 32 GB)
    or fragmentation (needs less; GB free at the OOM)."""
    _, oom = step_on_32gb(*cfg, b, md)
    n, oom1 = step_on_32gb(*cfg, b + 1, md)
    fits = str(b) if oom is None else f"{b}: runs out"
    if oom1 is None:
        return [fits, f"{b + 1}: fits"]
    if n > CAP:
        return [fits, f"{b + 1}: needs {n / GB:.2f} (a shortage)"]
    return [fits, f"{b + 1}: needs {n / GB:.2f}, {oom1.free / GB:.2f} GB ({oom1.free_fraction:.1%}) free"]


def fragmentation_table() -> str:
    lines = ["| configuration | fits without M_D | runs out without M_D | fits with M_D | "
             "runs out with M_D | M_D's gain |", "|---|---|---|---|---|---|"]
    for name, stage, n_d, n_m, p_a, k, off, on in CONFIGS:
        cfg = (name, stage, n_d, n_m, p_a, k)
        label = f"{name.split('-')[1] if name.startswith('t4-') else name}, {LABELS[stage]}, N_d={n_d}"
        label += (f", N_m={n_m}" if n_m > 1 else "") + (", P_a" if p_a else "") + f", k={k}"
        gain = f"{on - off:+d}" if on != off else "0"
        lines.append(f"| {label} | " + " | ".join(batch_cells(cfg, off, False) + batch_cells(cfg, on, True))
                     + f" | {gain} |")
    return "\n".join(lines)


@pytest.mark.slow
def test_fragmentation_table_of_eight_configurations(md_snapshot):
    """spec/allocator.md's table: per configuration, the largest micro-batch that fits on 32 GB
    without and with M_D, how one more runs out (fragmentation with GB free, or a shortage), and
    M_D's gain in sequences — every cell measured, rounded to 0.01 GB / 0.1%."""
    assert fragmentation_table() == md_snapshot

# -- M_D's exactness and bytes on threads -----------------------------------------------------------
VARIANTS = {"N_m=1": (1, {}), "N_m=2": (2, {}), "P_a": (2, {"partition_activations": True}),
            "P_a+cpu": (2, {"partition_activations": True, "cpu_checkpointing": True})}


@pytest.mark.claim("P12")
@pytest.mark.parametrize("stage,variant", [   # the default run: each variant once, each stage once
    pytest.param(s, v, id=f"{stage_id(s)}-{v}", marks=[pytest.mark.slow] * (s != i))
    for i, v in enumerate(VARIANTS) for s in range(4)])
def test_md_changes_no_bit_and_no_checkpoint_byte(stage, variant):
    """Checkpoints copied into one buffer and copied out for the recompute: every rank's losses
    and the final weights equal the run without M_D bit for bit, and the ledger's checkpoint
    peak is the same (the buffer holds exactly the checkpoints; none left after the run)."""
    n_m, kw = VARIANTS[variant]
    off = mp_run(stage, 2, n_m, checkpoint_activations=1, **kw)
    on = mp_run(stage, 2, n_m, checkpoint_activations=1, contiguous_checkpoints=True, **kw)
    assert_same_training(off, on)
    for a, b in zip(off.memory, on.memory, strict=True):
        assert a.peak["checkpoints"] == b.peak["checkpoints"] and b.current["checkpoints"] == 0
    assert on.memory[0].peak["checkpoints"] > 0 or variant == "P_a+cpu"


def test_md_allocates_one_checkpoint_buffer_per_step_of_all_checkpoints():
    """A checkpoint per block (SMALL: 2 blocks, 2 checkpoints of b·s·d fp16): the ledger sees one
    "checkpoints" allocation per step, of both, freed in that step's backward."""
    r = measure(TrainConfig(stage=2, n_d=4, model=SMALL,
                            zero_r=ZeroROptions(checkpoint_activations=1,
                                                contiguous_checkpoints=True)), micro_batch=2,
                trace=True)
    events = [e for e in r.classes[0].memory.trace if e.category == "checkpoints"]
    size = 2 * SMALL.n_layer * 2 * SMALL.block_size * SMALL.n_embd
    assert [(e.op, e.nbytes) for e in events] == [("alloc", size), ("free", size)]


def test_md_without_checkpointing_is_refused():
    """M_D arranges checkpoints: without checkpointing (Megatron's or torchtitan's) there are
    none, and the config says so."""
    with pytest.raises(ValueError, match=r"contiguous_checkpoints \(M_D\).*needs "
                                         r"checkpoint_activations >= 1 or an "
                                         r"activation_checkpointing mode, got neither"):
        TrainConfig(zero_r=ZeroROptions(contiguous_checkpoints=True))


# -- M_D for gradients (contiguous_gradients) ------------------------------------------------------
# buckets of 313 elements: every unit boundary inside a bucket (tests/unit/zero_r/test_buffers.py's B)
GRAD_CASES = {"plain": {}, "buckets": {"bucket_elements": 313},
              "clip+scale": {"clip_grad_norm": 0.5, "loss_scale": SCALER}}
KEPT_SLOT = {(3, "buckets"), (2, "clip+scale")}


@pytest.mark.claim("P12")
@pytest.mark.parametrize("stage,case", [   # the default run: buckets in stage 3, clip+scale in stage 2
    pytest.param(s, c, id=f"{stage_id(s)}-{c}", marks=[pytest.mark.slow] * ((s, c) not in KEPT_SLOT))
    for c in GRAD_CASES for s in (2, 3)])
def test_one_reused_gradient_slot_changes_no_bit(stage, case):
    """Every unit's gradient written into one slot allocated at setup, its padding zeroed per
    use: the same values reach the same reduce-scatters, so losses, weights and (with clipping and
    loss scaling, which read the padded shards) norms and scales are bit-identical."""
    off = odd_run(stage, **GRAD_CASES[case])
    on = odd_run(stage, contiguous_gradients=True, **GRAD_CASES[case])
    assert_same_training(off, on)
    assert off.grad_norms == on.grad_norms and off.loss_scales == on.loss_scales


@pytest.mark.parametrize("stage", [2, 3], ids=stage_id)
def test_the_gradient_slot_is_one_buffer_of_the_largest_unit_and_no_slot_is_made_in_backward(stage):
    """The ledger: one "buffer" of the largest padded unit in fp16 from setup on, and grad16 never
    moves in backward (without it, each unit's slot comes and goes there); model states unchanged."""
    off, on = odd_run(stage), odd_run(stage, contiguous_gradients=True)
    largest = max(u.padded for u in on.units) * 2
    for a, b in zip(off.memory, on.memory, strict=True):
        assert b.peak["buffer"] == b.current["buffer"] == largest
        assert b.peak["grad16"] == b.current["grad16"] < a.peak["grad16"]
    assert on.model_states(0) == off.model_states(0)


def test_contiguous_gradients_where_there_is_no_slot_to_reuse_is_refused():
    with pytest.raises(ValueError, match=r"contiguous_gradients \(M_D for gradients\).*needs "
                                         r"stage 2 or 3, got stage=1"):
        TrainConfig.of(contiguous_gradients=True, stage=1)


@pytest.mark.claim("C37", status="differs", page=PAGE)
def test_a_reused_gradient_slot_alone_does_not_remove_c30s_oom():
    """C30's step with only the gradients in one slot still runs out in backward with over 30%
    free: its fragmentation comes from the checkpoints and the logits' temporaries, not from the
    per-unit gradient slots; with both M_D's buffers it fits (as with the checkpoints' alone)."""
    r = measure(TrainConfig(stage=3, n_d=400, model=GPT2,
                            zero_r=ZeroROptions(checkpoint_activations=2, contiguous_gradients=True)),
                micro_batch=C30_BATCH, trace=True)
    oom = replay(r.classes[0].allocations, CAP).oom
    assert oom is not None and oom.phase == "backward@1" and oom.free_fraction > 0.30
    both = measure(TrainConfig(stage=3, n_d=400, model=GPT2,
                               zero_r=ZeroROptions(checkpoint_activations=2,
                                                   contiguous_gradients=True,
                                                   contiguous_checkpoints=True)),
                   micro_batch=C30_BATCH,
                   trace=True)
    assert replay(both.classes[0].allocations, CAP).oom is None


def test_a_reused_gradient_slot_hands_out_zero_padding_whatever_it_held_before():
    """A unit's padding enters its reduce-scatter and the overflow vote reads the padded shard: a
    slot reused after a larger unit (here holding an inf from an overflowed step) must give a
    fresh slot's zeros past the unit's real elements."""
    from zerospec.model.gpt import ODD
    from zerospec.runtime.memory import MemoryLedger
    from zerospec.zero_r.defrag import GradientSlot
    units = ODD.units(4)                                   # ln_f: 30 real of 32; h.0: 2896
    g = GradientSlot(MemoryLedger(), units, torch.float16)
    g.slot(1).fill_(float("inf"))
    ln_f = g.slot(3)
    assert ln_f.numel() == 32 and torch.equal(ln_f[30:], torch.zeros(2, dtype=torch.float16))


def test_p_a_cpu_host_copies_are_not_in_the_device_allocation_trace():
    """P_a+cpu's parts live in host memory: the device trace has P_a's allocations less the kept
    parts (their clones) plus the parts brought back before each recompute — as many, and none
    of them a checkpoint (the host copies themselves are made off the device's books)."""
    from zerospec.model.gpt import GPTConfig
    tiny = GPTConfig(vocab_size=37, block_size=12, n_layer=4, n_head=4, n_embd=16)

    def allocs(cpu: bool):
        r = measure(TrainConfig(stage=3, n_d=2, model=tiny,
                                zero_r=ZeroROptions(checkpoint_activations=1,
                                                    partition_activations=True,
                                                    cpu_checkpointing=cpu), mesh=MeshOptions(n_m=2)),
                    trace=True)
        return [e for e in r.classes[0].allocations if e.op == "alloc"]
    pa, cpu = allocs(False), allocs(True)
    assert len(cpu) == len(pa)
    assert sum(e.category == "checkpoints" for e in pa) == 4
    assert not any(e.category == "checkpoints" for e in cpu)
