"""plan/explain.py: each phase's peak and the buffers that make it, read from one meta step."""
from __future__ import annotations

import dataclasses

import pytest

from zerospec.model.presets import preset
from zerospec.paper import theory
from zerospec.paper.estimators import deepspeed_bytes
from zerospec.plan.explain import explain, estimate_table
from zerospec.runtime.memory import MODEL_STATES
from zerospec.training.scale import measure
from zerospec.training.config import TrainConfig
from zerospec.training.sections import ZeroROptions

NAME, STAGE, GPUS, SEQ = "llama-3-8b", 3, 8, 1024


@pytest.fixture(scope="module")
def ex():
    return explain(NAME, STAGE, GPUS, 80 * 10**9, "dgx-a100-80gb", seq=SEQ, checkpoint_activations=1)


@pytest.fixture(scope="module")
def ledger():
    """The same step's ledger, measured here without the explainer."""
    model = dataclasses.replace(preset(NAME).model, block_size=SEQ)
    return measure(TrainConfig(stage=STAGE, n_d=GPUS, model=model,
                               zero_r=ZeroROptions(checkpoint_activations=1))).memory(0)


def test_each_phase_breakdown_sums_to_its_peak_exactly(ex):
    """Every phase's buffers add up to that phase's peak, byte for byte."""
    assert [p.phase for p in ex.phases] == ["setup", "forward", "backward", "grad_sync", "step",
                                            "param_sync"]
    for p in ex.phases:
        assert sum(p.buffers.values()) == p.peak, p.phase


def test_the_highest_phase_peak_is_the_measured_ledger_peak(ex, ledger):
    """The highest phase's peak is the ledger's own peak_total, and the highest phase is the one
    whose end-of-phase snapshot first shows that peak."""
    assert ex.peak == ledger.peak_total
    first = next(s for s in ledger.snapshots if s.peak_total == ledger.peak_total)
    assert ex.highest.phase == first.label.partition("@")[0]


def test_phase_peaks_agree_with_the_ledger_snapshots(ex, ledger):
    """Where the ledger's running peak rose during a phase, that phase's peak is the new peak;
    every phase's peak is at least what is held at its start and its end; model states at every
    phase's peak are what the ledger held after setup."""
    before = 0
    held = 0
    for p, s in zip(ex.phases, ledger.snapshots, strict=True):
        if s.peak_total > before:
            assert p.peak == s.peak_total, p.phase
        assert p.peak >= max(held, s.total)
        before, held = s.peak_total, s.total
        for c in MODEL_STATES:
            assert p.buffers[c] == ledger.snapshots[0].current[c]
    for c, b in ex.highest.buffers.items():
        assert b <= ledger.peak[c], c


def test_fits_flips_at_the_capacity(ex):
    """The step fits a GPU of exactly its peak and not one byte less."""
    assert dataclasses.replace(ex, capacity=ex.peak).fits
    assert not dataclasses.replace(ex, capacity=ex.peak - 1).fits


def test_closed_form_rows_are_the_papers_and_deepspeeds_formulas(ex):
    """The estimate rows equal theory's 16Ψ/N_d and DeepSpeed's 4L + 18Ψ/N_d for the preset's Ψ."""
    psi = preset(NAME).psi
    rows = {r[0]: r for r in estimate_table(ex, largest_layer=1000).rows}
    assert rows["paper (model states)"][2] == theory.model_state_bytes(STAGE, psi, GPUS)
    assert rows["deepspeed (model states)"][2] == 4 * 1000 + (18 * psi) // GPUS
    assert rows["deepspeed (model states)"][2] == deepspeed_bytes(STAGE, psi, GPUS, 1000)
    assert rows["measured: step peak"][2] == ex.peak


def test_seq_beyond_the_context_names_both():
    """--seq past the preset's context is refused, naming the value and the context."""
    with pytest.raises(ValueError, match=r"--seq 9000 is outside 1\.\.8192, llama-3-8b's context"):
        explain(NAME, STAGE, GPUS, 10**9, "x", seq=9000)


# what each estimator's number counts, beside the model states (MODEL_STATES) every one counts
COUNTED_BESIDE_MODEL_STATES = {("paper", 3): set(), ("deepspeed", 3): {"gathered"},
                               ("megatron", 3): set()}


@pytest.mark.parametrize("estimator", ["paper", "deepspeed", "megatron"])
def test_leaves_out_names_exactly_what_the_estimate_lacks(ex, estimator):
    """An estimator's "leaves out" names every category held at the highest peak that its formula
    does not count, and no other; with what it counts they add up to the step's peak, and
    "fragmentation" is the allocator model's reserve above that peak."""
    from zerospec.plan.explain import left_out
    miss = left_out(ex, estimator)
    counted = set(MODEL_STATES) | COUNTED_BESIDE_MODEL_STATES[(estimator, STAGE)]
    held = {c for c, b in ex.highest.buffers.items() if b}
    assert set(miss) - {"fragmentation"} == held - counted
    assert sum(ex.highest.buffers[c] for c in counted) + sum(
        b for c, b in miss.items() if c != "fragmentation") == ex.peak
    assert miss["fragmentation"] == ex.reserved - ex.peak


def test_the_figure_curve_is_the_ledger_trace(ex):
    """--out's curve: per category after every event, its highest total is the step's peak, the
    phases in step order; the points drawn keep that peak."""
    from zerospec.plan.explain_figure import memory_over_step, turning_points
    cls = max(ex.result.classes, key=lambda c: c.memory.peak_total)
    curve = memory_over_step(cls.memory.trace)
    assert max(curve.totals) == ex.peak
    assert [p[0] for p in curve.phases] == [p.phase for p in ex.phases]
    kept = turning_points(curve)
    assert max(curve.totals[i] for i in kept) == ex.peak and len(kept) < len(curve.totals)
    assert {a for _, a, _ in curve.phases} <= set(kept)     # each phase's line is drawn at its start


@pytest.mark.slow   # two drawings: ~1.4 s
def test_the_figure_is_the_same_bytes_twice(ex, tmp_path):
    """--out draws the same SVG from the same step (no date, fixed ids)."""
    from zerospec.plan.explain_figure import save
    a, b = save(ex, tmp_path / "a"), save(ex, tmp_path / "b")
    assert a.read_bytes() == b.read_bytes()


@pytest.mark.slow   # one meta step per preset at seq 128: ~70 s in all
@pytest.mark.parametrize("name", sorted(__import__("zerospec.model.presets", fromlist=["PRESETS"]).PRESETS))
def test_explain_answers_for_every_preset(name):
    """--explain runs for every preset (ZeRO-3, 64 GPUs): its phases' buffers sum to their peaks
    and its highest is the ledger's peak of the explained rank class."""
    e = explain(name, 3, 64, 80 * 10**9, "x", seq=128)
    assert all(sum(p.buffers.values()) == p.peak for p in e.phases)
    assert e.peak == max(c.memory.peak_total for c in e.result.classes)


def test_every_ledger_category_has_a_label():
    """The explainer names every category the memory ledger books (a new one, e.g. hpZ's
    secondary shards, would otherwise fail the breakdown table with a KeyError)."""
    from zerospec.plan.explain import LABELS
    from zerospec.runtime.memory import CATEGORIES
    assert set(LABELS) == set(CATEGORIES)


def test_the_rank_class_explained_is_the_one_with_the_highest_peak(monkeypatch):
    """explain reads the rank class whose peak is highest, wherever it sits. The classes of one
    step hold the same device bytes (padding is allocated), so the step measured here is stitched
    from two real ones: ranks 0–2 from a micro-batch of 1, rank 3 from a micro-batch of 2 (more
    activations, a higher peak); the explanation must be rank 3's, peak and phases."""
    import zerospec.plan.explain as explainer
    from zerospec.model.gpt import GPTConfig
    small = GPTConfig(vocab_size=32, block_size=8, n_layer=1, n_head=2, n_embd=16)
    steps = {}

    def stitched(cfg, **how):
        lo, hi = (measure(cfg, **{**how, "micro_batch": b}) for b in (1, 2))
        steps.update(lo=lo.classes[0], hi=hi.classes[0])
        n_d = cfg.n_d
        return dataclasses.replace(lo, classes=[
            dataclasses.replace(lo.classes[0], ranks=range(0, n_d - 1)),
            dataclasses.replace(hi.classes[0], ranks=range(n_d - 1, n_d))])

    monkeypatch.setattr(explainer, "measure", stitched)
    e = explainer.explain("small", 3, 4, 10**9, "x", model=small)
    lo, hi = steps["lo"].memory.peak_total, steps["hi"].memory.peak_total
    assert hi > lo
    assert (e.rank, e.peak) == (3, hi)
    assert [(p.phase, p.peak, p.buffers) for p in e.phases] == [
        (p.phase, p.peak, p.buffers) for p in explainer.phase_peaks(steps["hi"].memory.trace)]
TINY_LLAMA = dataclasses.replace(preset("llama-3-8b").model, n_layer=2, n_embd=256, n_head=4,
                                 n_kv_head=2, d_ff=512, vocab_size=512, block_size=128)


@pytest.mark.parametrize("attention,source", [(None, "sdpa"), ("eager", "eager"),
                                              ("sdpa", "sdpa")])
def test_every_explanation_names_the_attention_it_assumed(attention, source):
    """The phase table's title and notes say which kernel ran: a published model's default is
    the memory-efficient one, labelled modelled; --attention overrides it."""
    from zerospec.plan.explain import phase_table
    ex = explain("tiny-llama", 3, 4, 80 * 10**9, "x", model=TINY_LLAMA, seq=128,
                 attention=attention)
    t = phase_table(ex)
    assert ex.attention == source and f"{source} attention" in t.title
    note = next(n for n in t.notes if n.startswith("Attention:"))
    assert note.startswith(f"Attention: {source}") and (("modelled" in note) == (source == "sdpa"))


def test_the_paper_presets_keep_eager_attention_and_the_published_ones_do_not():
    from zerospec.model.presets import PAPER, PUBLISHED, TABLE4
    assert {p.model.attention for p in (*PAPER.values(), *TABLE4.values())} == {"eager"}
    assert {p.model.attention for p in PUBLISHED.values()} == {"sdpa"}


def test_eager_attention_keeps_the_scores_sdpa_does_not():
    """At forward's peak (every block's activations held) eager attention holds more activations
    by at least the probabilities it keeps per layer (B·H·T² fp16 elements on meta)."""
    act = {}
    for k in ("eager", "sdpa"):
        ex = explain("tiny-llama", 3, 4, 80 * 10**9, "x", model=TINY_LLAMA, seq=128, attention=k)
        act[k] = next(p for p in ex.phases if p.phase == "forward").buffers["activations"]
    m = TINY_LLAMA
    assert act["eager"] - act["sdpa"] >= m.n_layer * m.n_head * 128 * 128 * 2


def test_a_sequence_not_given_is_stated_as_the_models_context():
    """Without --seq the step runs at the model's context and the explanation says so."""
    from zerospec.plan.explain import phase_table
    ex = explain("tiny-llama", 3, 4, 80 * 10**9, "x", model=TINY_LLAMA)
    assert ex.seq == 128 and not ex.seq_given
    assert "Sequence: 128 tokens, the model's full context (no --seq given)." in phase_table(ex).notes
    given = explain("tiny-llama", 3, 4, 80 * 10**9, "x", model=TINY_LLAMA, seq=128)
    assert not any(n.startswith("Sequence:") for n in phase_table(given).notes)


def test_fit_also_searches_with_a_checkpoint_every_block():
    """`--fit` on a run without checkpointing: the largest micro-batch and sequence with a
    checkpoint every block are the edge of fitting too (fresh steps at the value and the next)."""
    from zerospec.plan.explain_fit import fit_table, step_peak
    ex = explain("tiny-llama", 3, 4, 0, "x", model=TINY_LLAMA, seq=64)
    cap = step_peak(ex, 3, 64, 1)                  # micro-batch 3 with checkpointing fits exactly
    ex = dataclasses.replace(ex, capacity=cap)
    rows = {r[0]: r for r in fit_table(ex).rows}
    mb = int(rows["micro-batch at seq 64, a checkpoint every block"][1].replace(",", ""))
    assert step_peak(ex, mb, 64, 1) <= cap < step_peak(ex, mb + 1, 64, 1)
    assert "sequence length at micro-batch 1, a checkpoint every block" in rows


def test_selective_op_checkpointing_shows_the_kept_tensors_and_the_loss_in_the_phases():
    """--activation-checkpointing selective-op: at forward's peak the checkpoints are, per block,
    its input and the kept outputs (fused qkv, attention output and fp32 log-sum-exp, w1, w2;
    fp16 on meta), and the notes name the mode and the loss's fp32 log-softmax output."""
    from zerospec.plan.explain import phase_table
    m, B, T = TINY_LLAMA, 2, 128
    ex = explain("tiny-llama", 3, 4, 80 * 10**9, "x", model=m, seq=T, micro_batch=B,
                 settings={"activation_checkpointing": "selective-op"})
    hd = m.n_embd // m.n_head
    block = 2 * B * T * (m.n_embd + (m.n_embd + 2 * m.n_kv_head * hd) + m.n_embd + m.d_ff
                         + m.n_embd) + 4 * B * m.n_head * T
    fwd = next(p for p in ex.phases if p.phase == "forward")
    assert fwd.buffers["checkpoints"] == m.n_layer * block
    t = phase_table(ex)
    assert "selective-op activation checkpointing" in t.title
    assert any(n.startswith("Activation checkpointing: torchtitan's selective-op") for n in t.notes)
    assert any(f"fp32 output ({B * T * m.vocab_size * 4:,} B" in n for n in t.notes)
