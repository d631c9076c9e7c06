"""torch's ``FSDPMemTracker`` beside zerospec's ledger of stage 3's FSDP2 flavour, term by term
(zerospec/zero/fsdp2.py, spec/fsdp2.md).

FSDP2 wraps the tiny GPT-2 as torchtitan wraps Llama (zerospec/testing/fsdp2_peer.py: every
block, the last one not resharded after forward, then the root holding the embeddings and the
final norm) with ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`` and trains one
step at N = 4 in one process: fake tensors and the fake process group, as
tests/engine/test_fsdp_memtracker.py runs stage 3; torch's Adam (``foreach=False``). zerospec's
``measure`` books the flavour's same step on meta. Each category is compared with its zerospec
counterpart; where they differ, the test names the term. Marked ``slow`` (~4 s of imports).
"""
from __future__ import annotations

import pytest
import torch

from tests.support.memtracker import ledger_phases, missing as _missing, tracked_step
from zerospec.model.family import GPTConfig
from zerospec.training.config import TrainConfig
from zerospec.training.scale import measure

pytestmark = pytest.mark.slow

N, B = 4, 2
CFG = GPTConfig(vocab_size=256, block_size=16, n_layer=2, n_head=4, n_embd=64)
T, C = CFG.block_size, CFG.n_embd
PHASES = ("forward", "backward", "step")
EMBED = (CFG.vocab_size + T) * C
BLOCK = 12 * C * C + 13 * C
LN_F = 2 * C


def fsdp_step() -> dict[str, dict[str, int]]:
    """FSDPMemTracker's bytes per category at the end of forward, backward and the step, and at
    its peak up to the end of backward; plus the count of parameter tensors."""
    return tracked_step(CFG, N, B, _wrap)


def _wrap(model, mesh) -> None:
    """As torchtitan wraps Llama: every block, the last not resharded, then the root."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for i, blk in enumerate(model.h):
        fully_shard(blk, mesh=mesh, mp_policy=policy,
                    reshard_after_forward=i < len(model.h) - 1)
    fully_shard(model, mesh=mesh, mp_policy=policy)


def zerospec_step() -> dict[str, dict[str, int]]:
    """The flavour's ledger for the same step on meta, rank 0: bytes per category at the end of
    forward, backward and the step, and at the peak up to the end of backward."""
    cfg = TrainConfig.of(stage=3, n_d=N, model=CFG, precision="bf16", flavour="fsdp2")
    mem = measure(cfg, micro_batch=B, trace=True).memory(0)
    return ledger_phases(mem, PHASES)


@pytest.fixture(scope="module")
def both():
    missing = _missing()
    if missing is not None:
        pytest.skip(missing)
    return fsdp_step(), zerospec_step()


def test_model_states_after_the_step_match_fsdp2s_term_by_term(both):
    """FSDP2's fp32 sharded parameters and gradients are the flavour's ``param32`` and
    ``shard_grad32`` (4Ψ/N each); its optimizer states are ``exp_avg`` + ``exp_avg_sq`` (8Ψ/N)
    plus torch Adam's step counters, one 4-byte tensor per parameter tensor, which zerospec's
    Adam keeps as a Python int."""
    fsdp, zs = both
    q = CFG.psi // N
    f, z = fsdp["step"], zs["step"]
    assert f["Sharded Param"] == z["param32"] == 4 * q
    assert f["Sharded Grad"] == z["shard_grad32"] == 4 * q
    assert f["OptState"] == z["exp_avg"] + z["exp_avg_sq"] + 4 * fsdp["tensors"]["parameters"]


def test_forward_ends_with_the_root_and_the_last_block_unsharded_in_both(both):
    """torchtitan's wrapping: the root (embeddings, final norm) and the last block stay
    unsharded after forward, in bf16."""
    fsdp, zs = both
    assert fsdp["forward"]["Unsharded Param"] == zs["forward"]["gathered"] \
        == 2 * (EMBED + LN_F + BLOCK)


def test_activations_at_the_end_of_forward_differ_by_the_same_named_terms_as_stage_3(both):
    """zerospec's activations are FSDPMemTracker's Activation + Inputs, less the loss (alive,
    not saved: 4 bytes, computed in fp32 as zerospec/model/gpt.py's ``loss``), plus LayerNorm's mean and rstd, fp32 on meta but bf16 in the
    CPU kernels FSDP2 ran: 2 per norm, 2L + 1 norms, b·s each, 2 bytes apart."""
    fsdp, zs = both
    f = fsdp["forward"]
    stats = 2 * (2 * CFG.n_layer + 1) * B * T * (4 - 2)
    assert zs["forward"]["activations"] == f["Activation"] + f["Inputs"] - 4 + stats


def test_the_buffers_at_the_backward_peak_are_fsdp2s(both):
    """At each ledger's backward peak: one block's flat bf16 all-gather output (FSDP2's All
    Gather, the flavour's ``ag_buffer``), one block's fp32 reduce-scatter input in flight
    (Reduce Scatter, ``rs_buffer``), one block's fp32 sharded gradient, and the root and last
    block unsharded."""
    fsdp, zs = both
    f, z = fsdp["peak in backward"], zs["peak in backward"]
    assert f["All Gather"] == z["ag_buffer"] == 2 * BLOCK
    assert f["Reduce Scatter"] == z["rs_buffer"] == 4 * BLOCK
    assert f["Sharded Grad"] == z["shard_grad32"] == 4 * BLOCK // N
    assert f["Unsharded Param"] == z["gathered"] == 2 * (EMBED + LN_F + BLOCK)


def test_fsdp2_flavour_ledgers_table(both, md_snapshot):
    """spec/fsdp2.md's table: FSDPMemTracker's categories and the flavour's ledger for one step
    (bytes); "peak in backward" is each ledger's breakdown when its total peaks up to then."""
    fsdp, zs = both
    cols = (*PHASES, "peak in backward")
    rows = [f"| ledger | category | {' | '.join(c if 'peak' in c else f'end of {c}' for c in cols)} |",
            "|---|---|" + "---|" * len(cols)]
    for name, led in (("FSDPMemTracker", fsdp), ("zerospec", zs)):
        cats = [c for c in led["peak in backward"] if any(led[p].get(c, 0) for p in cols)]
        for c in cats:
            rows.append(f"| {name} | {c} | " + " | ".join(f"{led[p].get(c, 0):,}" for p in cols)
                        + " |")
    assert md_snapshot == "\n".join(rows)
