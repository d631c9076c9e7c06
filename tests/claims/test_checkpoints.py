"""Sharded checkpoints: save on N ranks, load on any M, continue exactly (P7).

The run: N = 4 ranks of P_os+g+p, G = 6 micro-batches of one sequence each (24 per step), loss
scaling that grows every step (so the scaler state matters) and clipping; saved after step 2 of 4.

Two comparisons per continuation (stage, M, G):
* against the *in-memory* continuation on M ranks from the same state (a 2-step run's final state
  handed over without files): the files and the resharding lose nothing — always bit-identical;
* against the *uninterrupted* N-rank run: bit-identical exactly when each step sees the same set
  of micro-batches (M·G = N·G_N with the same global batch). Exact gradient sums (zero/
  accumulate.py) make the sum independent of how those micro-batches are spread over ranks and
  micro-steps; with other micro-batch sizes the per-micro-batch gradients themselves differ.
"""
from __future__ import annotations

import functools
import pathlib

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zerospec.training import checkpoint
from zerospec.render import robust_tables
from zerospec.optim.loss_scale import LossScale
from zerospec.model.gpt import ODD, GPTConfig
from zerospec.training.config import TrainConfig
from zerospec.training.run import train

N, G, BATCH, SAVED, STEPS = 4, 6, 24, 2, 4
BASE = {"model": ODD, "global_batch": BATCH, "clip_grad_norm": 0.5,
        "loss_scale": LossScale(init_scale=2.0 ** 8, growth_interval=1)}
# (stage, M, G): same N, another stage; N/2; 2N; a non-divisor of N; then different micro-batches
CONTINUATIONS = [(3, 4, 6), (0, 4, 6), (1, 2, 12), (2, 8, 3), (3, 3, 8), (3, 3, 1)]
# the default run's two: onto a non-divisor of N with the same micro-batches, and with others
DEFAULT = {(3, 3, 8), (3, 3, 1)}


def continuations(keep=lambda stage, m, g: True) -> list:
    return [pytest.param(*c, id=f"stage{c[0]}/M={c[1]}/G={c[2]}",
                         marks=[pytest.mark.slow] * (c not in DEFAULT))
            for c in CONTINUATIONS if keep(*c)]


def cfg(stage: int, n_d: int, g: int, steps: int = STEPS) -> TrainConfig:
    return TrainConfig.of(stage=stage, n_d=n_d, steps=steps, grad_accum_steps=g, **BASE)


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> pathlib.Path:
    return tmp_path_factory.mktemp("ckpt") / f"step-{SAVED}"


@functools.cache
def _original(path: pathlib.Path):
    return train(cfg(3, N, G), save={SAVED: path})


@pytest.fixture(scope="module")
def original(saved):
    """The uninterrupted N-rank run, which also writes the checkpoint after step 2."""
    return _original(saved)


@functools.cache
def _stopped():
    """The N-rank run stopped after the saved step, holding its state (a run of its own)."""
    return train(cfg(3, N, G, steps=SAVED), keep_state=True)


def _state():
    return _stopped().state()


@functools.cache
def _continue(path: pathlib.Path, stage: int, m: int, g: int, from_file: bool):
    resume = checkpoint.load(path, n_ranks=m, model=ODD) if from_file else _state()
    return train(cfg(stage, m, g), resume=resume)


def _delta(a, b) -> float:
    return robust_tables.max_delta(a.master, b.master)


@pytest.mark.claim("P7")
def test_the_checkpoint_holds_exactly_the_state_of_a_run_stopped_there(original, saved):
    """Every tensor and counter in the files equals a 2-step run's final state, bit for bit."""
    ck, st = checkpoint.load(saved), _state()
    assert {k: ck.meta[k] for k in ("step", "optim_step", "scaler")} == \
           {k: st.meta[k] for k in ("step", "optim_step", "scaler")} == \
           {"step": 2, "optim_step": 2, "scaler": {"scale": 1024.0, "growth_tracker": 0}}
    for kind in checkpoint.KINDS:
        assert all(torch.equal(a, b) for a, b in zip(ck.tensors[kind], st.tensors[kind]))


@pytest.mark.parametrize("stage,m,g", continuations())
@pytest.mark.claim("P7")
def test_continuing_on_m_ranks_from_the_files_equals_continuing_from_memory(original, saved, stage, m, g):
    """Load at M (any stage, any G), continue: bit-identical to the in-memory continuation at M."""
    a, b = _continue(saved, stage, m, g, True), _continue(saved, stage, m, g, False)
    assert a.losses == b.losses and _delta(a, b) == 0.0


@pytest.mark.parametrize("stage,m,g", continuations(lambda stage, m, g: m * g == N * G))
@pytest.mark.claim("P7")
def test_with_the_same_micro_batches_the_continuation_is_the_uninterrupted_run(original, saved, stage, m, g,
                                                                             claim_values):
    """M·G = N·G_N (M = 4, 2, 8, 3): steps 3–4 after the load equal the uninterrupted run bit for bit."""
    c = _continue(saved, stage, m, g, True)
    assert c.losses == original.losses[SAVED:] and _delta(c, original) == 0.0
    assert c.loss_scales == original.loss_scales[SAVED:]
    claim_values(f"Δ = 0 after resharding 4 → {m} ranks (G = {g})", "exact")


@pytest.mark.claim("P7")
def test_with_other_micro_batches_the_continuation_differs(original, saved):
    """M = 3, G = 1 (8-sequence micro-batches): a different computation, so not the 4-rank run's bits."""
    assert _delta(_continue(saved, 3, 3, 1, True), original) > 0


@pytest.mark.claim("P7")
def test_saving_does_not_change_the_run(original):
    """The run that wrote the checkpoint equals one that did not, bit for bit."""
    plain = train(cfg(3, N, G))
    assert plain.losses == original.losses and _delta(plain, original) == 0.0


@pytest.mark.claim("P7")
def test_consolidation_gives_the_full_fp32_weights(saved, original):
    """consolidate(dir) → "unit/param" fp32 tensors equal to the 2-step run's master weights."""
    full = checkpoint.consolidate(saved)
    ref = _stopped().master
    assert full.keys() == ref.keys()
    assert all(full[k].dtype == torch.float32 and torch.equal(full[k], ref[k]) for k in ref)


@pytest.mark.slow   # every continuation, two runs each
def test_checkpoint_continuation_table(md_table_snapshot, saved, original):
    """spec/checkpoints.md's table: each continuation against the in-memory one and the original."""
    rows = []
    for stage, m, g in CONTINUATIONS:
        c = _continue(saved, stage, m, g, True)
        rows.append({"stage": c.config.label, "m": m, "g": g, "micro": BATCH // (m * g),
                     "same_set": m * g == N * G, "vs_memory": _delta(c, _continue(saved, stage, m, g, False)),
                     "vs_original": _delta(c, original)})
    # Δ = 0 exactly; the one nonzero Δ (other micro-batches) is rounding noise: only "nonzero" is pinned
    assert robust_tables.checkpoint_table(rows) == md_table_snapshot(nonzero=["max Δmaster vs uninterrupted N run"])


def test_checkpoint_files_table(md_snapshot, saved, original):
    """spec/checkpoints.md's file listing: per rank file, its real elements and tensor bytes."""
    m = checkpoint.read_manifest(saved)
    assert [f["bytes"] for f in m["files"]] == [(saved / f["name"]).stat().st_size for f in m["files"]]
    rows = [(f["name"], sum(b - a for _, a, b in f["pieces"])) for f in m["files"]]
    assert sum(n for _, n in rows) == original.psi          # padding is never written
    assert robust_tables.checkpoint_files_table(rows) == md_snapshot


@pytest.mark.slow
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.sampled_from([1, 2, 3, 4, 6]), m=st.sampled_from([1, 2, 3, 4, 6]), stage=st.integers(0, 3),
       d=st.sampled_from([(6, 2), (8, 4), (9, 3)]), vocab=st.integers(5, 40), block=st.integers(2, 9))
@pytest.mark.claim("P7")
def test_any_n_to_any_m_for_any_unit_sizes_continues_the_uninterrupted_run(tmp_path, n, m, stage, d, vocab,
                                                                            block):
    """Random model shapes (so random unit sizes and padding), N, M | 12 micro-batches: 1 step at N,
    save, load at M, 1 more step = the uninterrupted 2-step N run, bit for bit."""
    model = GPTConfig(vocab_size=vocab, block_size=block, n_layer=1, n_embd=d[0], n_head=d[1])
    kw = {"model": model, "global_batch": 12, "exact_grads": True, "clip_grad_norm": 0.5}
    path = tmp_path / f"n{n}-m{m}-s{stage}-{vocab}-{block}-{d[0]}"
    whole = train(TrainConfig.of(stage=stage, n_d=n, steps=2, grad_accum_steps=12 // n, **kw), save={1: path})
    after = train(TrainConfig.of(stage=3 - stage, n_d=m, steps=2, grad_accum_steps=12 // m, **kw),
                  resume=checkpoint.load(path, n_ranks=m, model=model))
    assert after.losses == whole.losses[1:] and _delta(after, whole) == 0.0
