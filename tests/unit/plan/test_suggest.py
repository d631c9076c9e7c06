"""plan/suggest.py: when a step does not fit, each suggested change's flags, run afresh, give the
peak it states, and the changes that fit come first."""
from __future__ import annotations

import dataclasses
import json

import pytest

from tests.support.cli import run_cli
from zerospec.model.family import GPTConfig
from zerospec.plan.explain import explain
from zerospec.plan.suggest import KINDS, suggestions, summary
from zerospec.training.config import TrainConfig
from zerospec.training.scale import measure

TINY = GPTConfig(vocab_size=128, block_size=64, n_layer=2, n_head=2, n_embd=32)
STAGE, GPUS, MICRO = 2, 4, 4


def _peak(model, stage, n_d, micro_batch=1, **kw) -> int:
    cfg = TrainConfig.of(model=model, stage=stage, n_d=n_d, **kw)
    return max(c.memory.peak_total for c in measure(cfg, micro_batch=micro_batch).classes)


def _flags_to_step(flags) -> dict:
    """The changed run, read from the flags as the command line reads them (an independent
    mapping: flag → measure()'s keyword)."""
    kw = {"model": TINY, "stage": STAGE, "n_d": GPUS, "micro_batch": MICRO}
    it = iter(flags)
    for flag in it:
        value = next(it)
        if flag == "--seq":
            kw["model"] = dataclasses.replace(TINY, block_size=int(value))
        else:
            key = {"--checkpoint-activations": "checkpoint_activations", "--stage": "stage",
                   "--gpus": "n_d", "--micro-batch": "micro_batch",
                   "--offload-optimizer": "offload_optimizer",
                   "--offload-params": "offload_params"}[flag]
            kw[key] = value if key.startswith("offload") else int(value)
    return kw


@pytest.fixture(scope="module")
def case():
    """The tiny model at micro-batch 4 on a GPU half-way between its checkpointed peak and its
    plain one: over, but checkpointing fits."""
    full = _peak(TINY, STAGE, GPUS, micro_batch=MICRO)
    ckpt = _peak(TINY, STAGE, GPUS, micro_batch=MICRO, checkpoint_activations=1)
    assert ckpt < full
    ex = explain("tiny", STAGE, GPUS, (full + ckpt) // 2, "--gpu-mem", micro_batch=MICRO,
                 model=TINY)
    assert not ex.fits
    return ex, suggestions(ex)


def test_each_suggestion_is_its_flags_run_afresh(case):
    """A fresh meta step of the run each suggestion's flags describe has the stated peak, and
    fits exactly when the suggestion says so."""
    ex, items = case
    assert {s.kind for s in items} >= {"checkpointing", "stage", "offload", "gpus",
                                       "micro-batch", "sequence"}
    for s in items:
        kw = _flags_to_step(s.flags)
        model, stage, n_d = kw.pop("model"), kw.pop("stage"), kw.pop("n_d")
        peak = _peak(model, stage, n_d, **kw)
        assert peak == s.peak, s
        assert s.fits == (peak <= ex.capacity), s


def test_fitting_changes_come_first_then_the_stated_order(case):
    ex, items = case
    keys = [(not s.fits, KINDS.index(s.kind), -s.kept, s.peak) for s in items]
    assert keys == sorted(keys)
    assert items[0].fits and items[0].flags == ("--checkpoint-activations", "1")


def test_a_step_that_fits_has_no_suggestions(case):
    ex, _ = case
    fits = dataclasses.replace(ex, capacity=ex.peak)
    assert suggestions(fits) == [] and summary(fits, [])["suggestions"] == []


def test_the_json_summary_carries_what_a_script_needs(capsys, tmp_path):
    """`plan --explain --format json`: psi, attention, peak_bytes, fits, not_modelled,
    suggestions (flags, peak_bytes, fits), and the allocator model's peak_allocated_bytes and
    peak_reserved_bytes beside the tables."""
    from tests.support.cli import tiny_hf_config
    rc, out, _ = run_cli(capsys, "plan", "--hf-config", tiny_hf_config(tmp_path), "--gpus", "4",
                         "--stage", "1", "--micro-batch", "64", "--gpu-mem", "1MB",
                         "--explain", "--format", "json")
    doc = json.loads(out)
    s = doc["summary"]
    assert rc == 0 and doc["tables"]
    assert s["attention"] == "sdpa" and s["fits"] is False
    assert s["peak_bytes"] > s["capacity_bytes"] == 10**6
    assert s["psi"] == GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=64).psi
    assert isinstance(s["not_modelled"], dict) and s["seq_from"] == "the model's context"
    assert s["suggestions"] and all({"flags", "peak_bytes", "fits"} <= set(x) for x in
                                    s["suggestions"])
    # the step's storage trace (temporaries included, 512-B blocks) through the allocator model:
    # the ledger's peak (counted tensors, unrounded) <= allocated <= reserved, in whole blocks
    assert s["peak_bytes"] < s["peak_allocated_bytes"] <= s["peak_reserved_bytes"]
    assert s["peak_allocated_bytes"] % 512 == 0 and s["peak_reserved_bytes"] % (2 << 20) == 0
    assert s["peak_reserved_bytes"] == s["reserved_bytes"]


@pytest.mark.slow   # four meta steps of Llama-3-70B and the searches: ~20 s
def test_the_issues_command_names_a_change_that_fits_and_that_change_fits(capsys):
    """Issue 55's command: its JSON names a change that fits; the command with that change's
    flags fits, at the peak the suggestion stated."""
    cmd = ("plan", "--preset", "llama-3-70b", "--gpus", "64", "--machine", "dgx-h100", "--stage",
           "3", "--seq", "8192", "--explain", "--format", "json")
    rc, out, _ = run_cli(capsys, *cmd)
    s = json.loads(out)["summary"]
    assert rc == 0 and not s["fits"]
    best = s["suggestions"][0]
    assert best["fits"]
    changed = list(cmd)
    for flag, value in zip(best["flags"][::2], best["flags"][1::2]):
        if flag in changed:
            changed[changed.index(flag) + 1] = value
        else:
            changed += [flag, value]
    rc, out, _ = run_cli(capsys, *changed)
    again = json.loads(out)["summary"]
    assert rc == 0 and again["fits"] and again["peak_bytes"] == best["peak_bytes"]
    assert again["suggestions"] == []


def test_changes_tried_with_checkpointing_carry_its_flag(case):
    """The second round (each change with a checkpoint every block, tried when no single change
    fits): every suggestion's flags include checkpointing, and run afresh give its peak."""
    from zerospec.plan.suggest import _singles
    ex, _ = case
    items = _singles(ex, {"checkpoint_activations": 1}, config_given=False)
    assert items and all(s.flags[:2] == ("--checkpoint-activations", "1") for s in items)
    for s in items:
        kw = _flags_to_step(s.flags)
        model, stage, n_d = kw.pop("model"), kw.pop("stage"), kw.pop("n_d")
        assert _peak(model, stage, n_d, **kw) == s.peak, s


def _hpz_offload_kinds() -> tuple[set, list]:
    """At stage 3 with hpZ, a GPU one byte short of the optimizer offload's peak: the kinds
    suggested, and the offload suggestions."""
    hpz = {"hpz": 2, "gpus_per_node": 2}
    off = _peak(TINY, 3, GPUS, micro_batch=MICRO, offload_optimizer="cpu", **hpz)
    ex = explain("tiny", 3, GPUS, off - 1, "--gpu-mem", micro_batch=MICRO, model=TINY,
                 settings=hpz)
    found = suggestions(ex)
    return {s.kind for s in found}, [s for s in found if s.kind == "offload"]


def test_with_hpz_the_parameters_offload_is_suggested_at_its_measured_peak():
    """Offloading the optimizer alone does not fit beside hpZ; the parameters' offload composes
    with hpZ (spec/combine.md), so ZeRO-Infinity is suggested, at the peak measure() gives it."""
    kinds, off = _hpz_offload_kinds()
    assert [s.flags for s in off] == [("--offload-optimizer", "cpu", "--offload-params", "cpu")]
    assert off[0].peak == _peak(TINY, 3, GPUS, micro_batch=MICRO, offload_optimizer="cpu",
                                offload_params="cpu", hpz=2, gpus_per_node=2)
    assert {"checkpointing", "sequence"} <= kinds


@pytest.mark.slow
def test_a_change_the_stages_refuse_is_not_suggested(monkeypatch):
    """Were the parameters' offload refused beside hpZ (the table's entry put back for this
    test), no offload would be suggested, and the others still would."""
    from zerospec.training import combine
    monkeypatch.setitem(combine.REFUSED, combine._pair("params", "hpz"), "refused for a test")
    kinds, off = _hpz_offload_kinds()
    assert not off and {"checkpointing", "sequence"} <= kinds


def test_with_checkpointing_a_longer_sequence_fits_and_comes_first():
    """Below the checkpointed peak, the sequence that fits with a checkpoint every block is
    longer than the one without, and is listed first; each is the edge (its next value does not
    fit, run afresh)."""
    ckpt = _peak(TINY, STAGE, GPUS, micro_batch=MICRO, checkpoint_activations=1)
    ex = explain("tiny", STAGE, GPUS, ckpt - 1, "--gpu-mem", micro_batch=MICRO, model=TINY)
    seqs = [s for s in suggestions(ex) if s.kind == "sequence" and s.fits]
    assert len(seqs) == 2 and seqs[0].kept > seqs[1].kept
    assert seqs[0].flags[:2] == ("--checkpoint-activations", "1")
    for s in seqs:
        kw = _flags_to_step(s.flags)
        kw["model"] = dataclasses.replace(TINY, block_size=s.kept + 1)
        model, stage, n_d = kw.pop("model"), kw.pop("stage"), kw.pop("n_d")
        assert _peak(model, stage, n_d, **kw) > ex.capacity


def test_expandable_segments_replays_the_same_allocations_under_the_other_setting(capsys, tmp_path):
    """`--expandable-segments` changes only how the allocator model reserves: the allocated peak
    (the same storages, the same 512-B blocks) is identical, the reserved one differs (20 MiB
    pages of one growing segment instead of cudaMalloc'd segments); without --explain the flag
    is refused, naming it."""
    from tests.support.cli import tiny_hf_config
    cfg = tiny_hf_config(tmp_path)
    argv = ("plan", "--hf-config", cfg, "--gpus", "4", "--stage", "3", "--micro-batch", "2048",
            "--explain", "--format", "json")
    plain = json.loads(run_cli(capsys, *argv)[1])["summary"]
    exp = json.loads(run_cli(capsys, *argv, "--expandable-segments")[1])["summary"]
    assert exp["peak_allocated_bytes"] == plain["peak_allocated_bytes"]
    assert exp["peak_reserved_bytes"] != plain["peak_reserved_bytes"]
    rc, _, err = run_cli(capsys, "plan", "--params", "1e9", "--gpus", "8", "--expandable-segments")
    assert rc == 2 and "--expandable-segments" in err
