"""The combination table (zerospec/training/combine.py, spec/combine.md): every pair of features
composes or is refused with the table's reason. A composing pair builds; on the thread simulator
it trains (the slow walk), bit-identically to its reference where one of the two only moves bytes
(the pair without it); a refused pair raises the table's message before any rank starts.

Runs: a 2-block GPT whose every split divides (4 heads, d_ff 64) on N = 4 virtual GPUs, 2 steps.
"""
from __future__ import annotations

import dataclasses
import itertools

import pytest

from tests.support.runs import assert_same_training
from zerospec.model.gpt import GPTConfig
from zerospec.training import checkpoint, combine
from zerospec.training.config import TrainConfig
from zerospec.training.run import train, train_processes

M = GPTConfig(vocab_size=37, block_size=12, n_layer=2, n_head=4, n_embd=16)
N = 4
NAMES = [f.name for f in combine.FEATURES]
PAIRS = list(itertools.combinations(NAMES, 2))


def _config(pair, **kw) -> TrainConfig | None:
    """The pair's TrainConfig (run-level features add nothing to it); None: no shared stage."""
    s = combine.settings([n for n in pair if n not in combine.RUN_LEVEL] or ["accum"], N)
    if all(n in combine.RUN_LEVEL for n in pair):
        s = {"stage": 3, "n_d": N}
    return None if s is None else TrainConfig.of(model=M, steps=2, **s, **kw)


def _run(pair, cfg, tmp_path):
    """Train ``cfg`` as the pair asks: on processes, and/or saved after step 1 and resumed (the
    saving run is the whole run: a run of one step could not hold a DPU that starts later)."""
    if "checkpoints" in pair:
        if "torch" in pair:
            train_processes(cfg, save={1: tmp_path / "ck"})
            return train_processes(cfg, resume=checkpoint.load(tmp_path / "ck", n_ranks=cfg.n_d))
        train(cfg, save={1: tmp_path / "ck"})
        return train(cfg, resume=checkpoint.load(tmp_path / "ck", n_ranks=cfg.n_d))
    return train_processes(cfg) if "torch" in pair else train(cfg)


def test_the_table_names_known_features_and_a_reason_for_each_refusal(monkeypatch):
    """Every refused pair is two features of the table with its reason; a pair refused through
    a feature one of them needs (the prefetcher needs offloaded parameters) says which."""
    assert all(len(p) == 2 and p <= set(NAMES) and r for p, r in combine.REFUSED.items())
    monkeypatch.setitem(combine.REFUSED, frozenset(("params", "tiles")), "a reason")
    assert combine.refusal("prefetch", "tiles") == "offloaded parameters with tiles: a reason"
    assert combine.refusal("pa", "mp") is None


@pytest.mark.parametrize("pair", PAIRS, ids="+".join)
def test_every_pair_builds_or_raises_the_tables_message(pair, request):
    """A composing pair is a valid TrainConfig at the highest stage both run at; a refused pair
    raises exactly the table's message, from TrainConfig or, for the run-level features, from
    train() before any rank starts."""
    run = tuple(n for n in pair if n in combine.RUN_LEVEL)
    reason = combine.refusal(*pair)
    if reason is None:
        assert _config(pair) is not None, f"{pair} share no stage"
        return
    with pytest.raises(ValueError) as e:
        cfg = _config(pair)
        if run:   # a directory only where a run is asked for (most pairs: a config alone)
            _run(pair, cfg, request.getfixturevalue("tmp_path"))
    inner = {*pair, *combine.needed(pair[0]), *combine.needed(pair[1])}
    assert str(e.value) in [combine.message(a, b) for a, b in combine.refused_pairs()
                            if {a, b} <= inner and combine.refusal(a, b) in combine.REFUSED.values()]


def _walked():
    return [pytest.param(p, marks=pytest.mark.slow) for p in PAIRS if combine.refusal(*p) is None]


@pytest.mark.parametrize("pair", _walked(), ids=lambda p: "+".join(p))
def test_every_composing_pair_trains_and_equals_its_reference(pair, tmp_path):
    """Two steps on the simulator (processes for torch; saved after step 1 and resumed for
    checkpoint files); with a feature that only moves bytes, every loss and master weight equals
    the run without it bit for bit."""
    cfg = _config(pair)
    got = _run(pair, cfg, tmp_path)
    assert len(got.losses) == 2 - ("checkpoints" in pair)
    ref = combine.reference([n for n in pair if n not in combine.RUN_LEVEL])
    if cfg.device == "meta":
        return                                  # bytes, no values: nothing to compare bit for bit
    if "checkpoints" in pair or "torch" in pair:
        ref = {k: getattr(cfg, k) for k in ("stage", "n_d", "n_m")} | (ref or {
            f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)
            if f.name not in ("model", "steps")})
    if ref is None:
        return
    whole = train(TrainConfig.of(model=M, steps=2, **ref))
    if "checkpoints" in pair:
        assert got.losses == whole.losses[1:]
        assert all(got.master[k].equal(whole.master[k]) for k in whole.master)
    elif "torch" not in pair or not cfg.bucket_elements:   # gloo sums buckets in its own order
        assert_same_training(got, whole)


def test_the_matrix(md_snapshot):
    """spec/combine.md's matrix, rendered from the table."""
    assert combine.matrix() == md_snapshot
