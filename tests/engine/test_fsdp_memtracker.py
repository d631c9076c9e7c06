"""torch's ``FSDPMemTracker`` on FSDP2 as a cross-check of zerospec's stage-3 ledger.

FSDP2 (``fully_shard`` on each block, ln_f and the root: zerospec's sharding units, as the torch
peers shard them, zerospec/testing/oracles.py) trains the tiny GPT-2 one step at N = 4 in one
process: fake tensors (``FakeTensorMode``: shapes and dtypes, no data) and the fake process group
(``FakeStore``: every collective returns at once). fp16 parameters in compute and fp16 reductions
(``MixedPrecisionPolicy``), as zerospec's meta steps; torch's Adam. The tracker books each storage
under one of its categories; zerospec's ``measure(TrainConfig(stage=3, n_d=4, model=cfg))`` books the same step on meta. The
tests pin each agreement and name each difference by its closed form (spec/engine.md,
"Cross-checks with transformers and FSDP2", shows both ledgers).

``torch.distributed._tools`` is private: it is imported under a guard and the tests skip, saying
why, on a torch without it (CI's torch 2.13 has it). ``fully_shard`` with reshard-after-forward
left to FSDP2 (True for the blocks and ln_f, False for the root). Marked
``slow``: importing FSDP and the tracker costs ~3 s.
"""
from __future__ import annotations

import math

import pytest
import torch

from tests.support.memtracker import ledger_phases, missing as _missing, tracked_step
from zerospec.model.family import GPTConfig
from zerospec.training.scale import measure
from zerospec.training.config import TrainConfig


# the guard runs in the fixture, not at collection: importing the tracker and FSDP costs ~4 s, which
# every run (the default one included, which deselects these) would pay while collecting
pytestmark = pytest.mark.slow

N, B = 4, 2
CFG = GPTConfig(vocab_size=256, block_size=16, n_layer=2, n_head=4, n_embd=64)
T = CFG.block_size
PHASES = ("forward", "backward", "step")


def fsdp_step() -> dict[str, dict[str, int]]:
    """FSDPMemTracker's bytes per category at the end of forward, backward and the optimizer step,
    and at its peak (the breakdown when the total peaks) up to the end of backward and over the
    step; plus the count of parameter tensors."""
    return tracked_step(CFG, N, B, _wrap)


def _wrap(model, mesh) -> None:
    """fully_shard on each block, ln_f and the root: zerospec's sharding units."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=torch.float16, reduce_dtype=torch.float16)
    for mod in [*model.h, model.ln_f]:
        fully_shard(mod, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)


def zerospec_step() -> dict[str, dict[str, int]]:
    """zerospec's ledger for the same step (stage 3, N = 4, fp16 on meta), rank 0: bytes per
    category at the end of forward, backward and the step, and at the peak — replayed from the
    ledger's allocation trace, as the tracker reports its peak: the breakdown when the total peaks."""
    mem = measure(TrainConfig(stage=3, n_d=N, model=CFG), micro_batch=B, trace=True).memory(0)
    out = ledger_phases(mem, PHASES)
    assert out["peak"]["Total"] == mem.peak_total   # the replay is the ledger
    return out


@pytest.fixture(scope="module")
def both():
    missing = _missing()
    if missing is not None:
        pytest.skip(missing)
    return fsdp_step(), zerospec_step()


def test_no_unit_or_tensor_is_padded_at_these_shapes(both):
    """Both shard without padding here (each unit's numel and each tensor's dim 0 divide by N), so
    the model-state comparisons below are the layouts' own, not padding's (zerospec pads each unit's
    flat vector, FSDP2 each tensor's dim 0: at other shapes the two pad differently)."""
    from zerospec.model.units import make_units
    assert all(u.padded == u.numel for u in make_units(CFG.unit_spec(), N, True))
    assert all(shape[0] % N == 0 for _, params in CFG.unit_spec() for _, shape in params)


def test_fsdp2_model_states_are_zerospecs_16_psi_over_n_split_another_way(both):
    """After the step both hold 16·Ψ/N bytes of model states, split another way, plus torch Adam's
    step counters: FSDP2 keeps fp32 sharded parameters (4Ψ/N, which serve as the master weights:
    no fp16 shard) and fp32 sharded gradients (4Ψ/N: reduced in fp16, then cast up), and Adam's two
    moments (8Ψ/N) + one 4-byte step tensor per parameter tensor; zerospec keeps fp16 parameters
    and gradients (2Ψ/N each) and the optimizer's fp32 master, momentum and variance (12Ψ/N)."""
    fsdp, zs = both
    q = CFG.psi // N
    step, z = fsdp["step"], zs["step"]
    assert step["Sharded Param"] == 4 * q and step["Sharded Grad"] == 4 * q
    assert step["OptState"] == 8 * q + 4 * fsdp["tensors"]["parameters"]
    assert z["param16"] == z["grad16"] == 2 * q
    assert z["master32"] == z["exp_avg"] == z["exp_avg_sq"] == 4 * q
    model_states = ("param16", "grad16", "master32", "exp_avg", "exp_avg_sq")
    assert (step["Sharded Param"] + step["Sharded Grad"] + step["OptState"]
            == sum(z[c] for c in model_states) + 4 * fsdp["tensors"]["parameters"])


def test_both_keep_the_tied_embedding_gathered_after_forward(both):
    """At the end of forward both hold the root's unit, the embedding (wte, wpe) whose tied head
    backward starts with, gathered in fp16 — FSDP2's root stays unsharded, zerospec's last use keeps
    its fp16 vector — and nothing else gathered."""
    fsdp, zs = both
    embed = 2 * (CFG.vocab_size + T) * CFG.n_embd
    assert fsdp["forward"]["Unsharded Param"] == zs["forward"]["gathered"] == embed


def test_activations_at_the_end_of_forward_differ_by_three_named_terms(both):
    """zerospec's activations at the end of forward (every storage autograd saved, the batch's ids
    and targets among them) are FSDPMemTracker's Activation + Inputs (every tensor made in forward
    still alive, the batch booked apart) less the loss (alive, not saved: 4 bytes, computed in fp32
    as in zerospec/model/gpt.py's ``loss``) plus LayerNorm's
    statistics: mean and rstd are fp32 on meta (and CUDA) but fp16 on CPU kernels, where FSDP2 ran:
    2 per norm, 2L + 1 norms, b·s each, 2 bytes apart."""
    fsdp, zs = both
    f = fsdp["forward"]
    stats = 2 * (2 * CFG.n_layer + 1) * B * T * (4 - 2)
    assert zs["forward"]["activations"] == f["Activation"] + f["Inputs"] - 4 + stats


def test_fsdp2_and_zerospec_stage3_ledgers_table(both, md_snapshot):
    """spec/engine.md's table: the two ledgers of one step, category by category (bytes); "peak" is
    each ledger's breakdown at the moment its total peaks (over forward and backward; over the step)."""
    fsdp, zs = both
    cols = (*PHASES, "peak in backward", "peak")
    rows = [f"| ledger | category | {' | '.join(c if 'peak' in c else f'end of {c}' for c in cols)} |",
            "|---|---|" + "---|" * len(cols)]
    for name, led in (("FSDPMemTracker", fsdp), ("zerospec", zs)):
        cats = [c for c in led["peak"] if any(led[p].get(c, 0) for p in cols)]
        for c in cats:
            rows.append(f"| {name} | {c} | " + " | ".join(f"{led[p].get(c, 0):,}" for p in cols) + " |")
    assert md_snapshot == "\n".join(rows)
    assert math.gcd(CFG.psi, N) == N   # Ψ/N is whole: the closed forms above are exact
