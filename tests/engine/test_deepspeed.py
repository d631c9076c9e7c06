"""DeepSpeed, the paper's reference implementation, as a peer: stages 1–3 vs DeepSpeed ZeRO-1/2/3.

Optional: these tests need ``pip install -e ".[peers]"``, are marked ``deepspeed`` (left out of the
default run; ``pytest -m deepspeed`` runs them, as CI does in a step of its own) and skip when
DeepSpeed is not installed. Peer: zerospec.testing.deepspeed_peer (same model, init, data, Adam
hyper-parameters; ZeRO-3 with ``memory_efficient_linear: false``).

Tolerances, derived as for the torch peers (tests/engine/test_peers.py, spec/engine.md):

* **DeepSpeed with zerospec's Adam arithmetic, N = 2 → equal bits.** A two-term sum has one order;
  halving before or after it is exact; bucketing, partitioning (flat in ZeRO-1/2, per parameter in
  ZeRO-3) and gathering copy bits; an elementwise Adam on a partition equals the whole-vector one.
* **N = 4: the same gradients, summed in another order.** Step 1's losses are equal, and each
  engine's reduced step-1 gradient is, element by element, one of the 15 orders of adding the four
  ranks' local values (gloo's order depends on an element's offset in the buffer, and the engines'
  buffers differ). From then on, as **with torch.optim.Adam**: losses to 1e-6 relative, weights to
  lr/10 after every step — Adam's 1/√v̂ turns a rounding-level change into up to ~lr.
* **bf16**: DeepSpeed computes in bf16, zerospec in fp32 from bf16 copies. Exact, and tested: step
  1's losses are the same model on the same bf16 weights in the two precisions. No sound bound on
  the gap is derived (spec/deepspeed.md), so later steps are not compared.

Traffic (spec/deepspeed.md) is the paper's per-step volume in elements: an all-reduce of S counts
2S, a reduce-scatter, reduce or all-gather of S counts S (per rank the ring moves (N−1)/N of it).
DeepSpeed's comms logger records each op's *input*: the shard for all-gather (S = N × it), the
whole S otherwise; zerospec's ledger books S itself.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import math

import pytest
import torch

from tests.engine.test_peers import assert_close_every_step, assert_equal_every_step
from tests.support.runs import LONG_STEPS, MODELS, stage_id
from zerospec.training.config import TrainConfig
from zerospec.training.sections import OptimOptions



def _missing() -> str | None:
    """Why these tests cannot run, or None (a cheap look-up: DeepSpeed itself is imported only in
    the rank processes)."""
    try:
        if importlib.util.find_spec("deepspeed") is not None:
            return None
    except (ImportError, ValueError):   # a broken or blocked install counts as none
        pass
    return "DeepSpeed is not installed: pip install -e '.[peers]' (CI runs these in a step of its own)"


MISSING = _missing()
pytestmark = [pytest.mark.deepspeed, pytest.mark.skipif(MISSING is not None, reason=MISSING or "")]

STAGES = (1, 2, 3)
SETTINGS = ("default", "paper")
# DeepSpeed's own per-step all-reduce (overflow flag / gradient norm), in fp32 elements: measured
FLAG = {1: 1, 2: 1, 3: 2}
# stage3_param_persistence_threshold's default: tensors of at most this many elements stay whole
PERSIST = 100_000


def _cfg(n_d: int, model: str = "odd") -> TrainConfig:
    return TrainConfig(n_d=n_d, model=MODELS[model], steps=LONG_STEPS, timeout=300,
                       optim=OptimOptions(precision="fp32"))


def _compare(*args, **kw):
    from zerospec.testing.deepspeed_peer import compare
    return compare(*args, **kw)


@pytest.fixture(scope="module")
def two():
    """Every stage and DeepSpeed (both optimizers, both settings) on 2 gloo processes, weights per step."""
    return _compare(_cfg(2), STAGES, optimizers=("zerospec", "torch"), settings=SETTINGS)


def _traffic(n: int) -> dict:
    """model → rows of per-phase volumes (no weights read: see run_deepspeed), torch's Adam."""
    return {m: _compare(_cfg(n, m), STAGES, settings=SETTINGS, weights=False) for m in ("odd", "small")}


@pytest.fixture(scope="module")
def traffic():
    """N = 2: see :func:`_traffic`."""
    return _traffic(2)


@pytest.fixture(scope="module")
def traffic4():
    """N = 4: see :func:`_traffic`."""
    return _traffic(4)


@pytest.mark.parametrize("settings", SETTINGS)
@pytest.mark.parametrize("stage", STAGES, ids=stage_id)
def test_deepspeed_with_our_adam_arithmetic_equals_the_stage_bit_for_bit(two, stage, settings):
    """N = 2: only the engines differ, and nothing in them may change a bit (module docstring)."""
    row = two[stage - 1]
    assert_equal_every_step(row, row["deepspeed"][("zerospec", settings)])


@pytest.mark.parametrize("stage", STAGES, ids=stage_id)
def test_deepspeed_equals_the_stage_bit_for_bit_on_the_small_gpt(stage):
    """The default GPT (Ψ = 536,064), N = 2, our Adam: equal bits — here ZeRO-3's default
    memory_efficient_linear (matmul, then a separate bias add) would change ~40% of the weights."""
    row = _compare(_cfg(2, "small"), (stage,), optimizers=("zerospec",))[0]
    assert_equal_every_step(row, row["deepspeed"][("zerospec", "default")])


@pytest.mark.parametrize("stage", STAGES, ids=stage_id)
def test_deepspeed_with_torch_adam_matches_the_stage_within_the_derived_tolerance(two, stage):
    """torch.optim.Adam rounds differently: losses to 1e-6 relative, weights to lr/10, every step."""
    row = two[stage - 1]
    assert_close_every_step(row, row["deepspeed"][("torch", "default")], _cfg(2).adam.lr)


def test_the_deepspeed_comparison_is_not_vacuous(two):
    """DeepSpeed's weights move by more than lr per element over the run, and its loss falls."""
    ds = two[0]["deepspeed"][("zerospec", "default")]
    w0, w1 = ds["weights"][0], ds["weights"][-1]
    assert float(torch.cat([(w1[k] - w0[k]).abs().flatten() for k in w0]).median()) > _cfg(2).adam.lr
    assert ds["losses"][-1] < ds["losses"][0]


# -- N = 4: the order of a four-term sum ------------------------------------------------------------
@pytest.fixture(scope="module")
def four():
    """Every stage and DeepSpeed on 4 gloo processes, weights per step: our Adam with both settings,
    torch's with the defaults (the order of the sums, not the settings, is what N = 4 adds)."""
    return _compare(_cfg(4), STAGES, runs=[("zerospec", s) for s in SETTINGS] + [("torch", "default")])


@pytest.fixture(scope="module")
def four_gradients():
    """Step 1 on 4 gloo processes: each rank's local gradient and each engine's reduced one."""
    from zerospec.testing.deepspeed_peer import reduced_gradients
    return reduced_gradients(_cfg(4))


def means_in_every_order(xs):
    """(27, …): the mean of four tensors, summed in every order there is — each of the 15 binary
    trees over four leaves (12 chains, 3 balanced pairings) appears — then divided by 4 (exact)."""
    import itertools

    chains = [((xs[a] + xs[b]) + xs[c]) + xs[d] for a, b, c, d in itertools.permutations(range(4))]
    pairs = [(xs[0] + xs[b]) + (xs[c] + xs[d]) for b, c, d in ((1, 2, 3), (2, 1, 3), (3, 1, 2))]
    return torch.stack(chains + pairs) / 4


@pytest.mark.parametrize("stage", STAGES, ids=stage_id)
def test_four_ranks_reduce_the_same_gradients_in_another_order(four_gradients, stage):
    """N = 4, step 1: every element of either engine's reduced gradient is the mean of the same four
    per-rank values, summed in one of the 15 orders; for some elements the engines' orders differ
    (gloo's ring order depends on where an element sits in the buffer, and the buffers differ)."""
    local, row = four_gradients["local"], four_gradients["stages"][stage]
    for who, g in [("zerospec", row["zerospec"]), *row["deepspeed"].items()]:
        for k, t in g.items():
            assert (means_in_every_order([x[k] for x in local]) == t).any(0).all(), (who, k)
    for settings, g in row["deepspeed"].items():
        assert not all(torch.equal(g[k], row["zerospec"][k]) for k in g), settings


@pytest.mark.parametrize("run", [("zerospec", "default"), ("zerospec", "paper"), ("torch", "default")],
                         ids="-".join)
@pytest.mark.parametrize("stage", STAGES, ids=stage_id)
def test_four_ranks_match_deepspeed_within_the_derived_tolerance(four, stage, run):
    """N = 4: step 1's losses are equal (nothing reduced yet); after it, the sums' order (test
    above): losses to 1e-6 relative, weights to lr/10, every step (spec/engine.md's bound)."""
    row = four[stage - 1]
    ds = row["deepspeed"][run]
    assert row["losses"][0] == ds["losses"][0]
    assert_close_every_step(row, ds, _cfg(4).adam.lr)


# -- bf16: two precisions of compute ----------------------------------------------------------------
@pytest.fixture(scope="module")
def bf16():
    """Every stage and DeepSpeed (bf16 enabled, our Adam arithmetic) on 2 gloo processes."""
    return _compare(_cfg(2).replace(precision="bf16"), STAGES, optimizers=("zerospec",))


def step_one_loss(cfg, dtype) -> float:
    """The peer GPT's step-1 loss (rank mean, fp64, rank order) on the initial weights rounded to
    bf16, computed in ``dtype``, on one thread as the rank processes run."""
    from zerospec.model.data import BigramData
    from zerospec.testing.oracles import GPT
    model = GPT.from_init(cfg.model, cfg.seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16))   # both engines start from these bf16 weights
    model = model.to(dtype)
    idx, tgt = BigramData(cfg.model.vocab_size, cfg.model.block_size, cfg.seed).batch(0, cfg.batch)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            losses = [model(BigramData.shard(idx, r, cfg.n_d), BigramData.shard(tgt, r, cfg.n_d))
                      for r in range(cfg.n_d)]
    finally:
        torch.set_num_threads(threads)
    return float(sum(x.double() for x in losses) / cfg.n_d)


@pytest.mark.parametrize("stage", STAGES, ids=stage_id)
def test_bf16_step_one_is_one_model_in_two_precisions_of_compute(bf16, stage):
    """bf16, step 1, same bf16 weights: DeepSpeed's loss is the model computed in bf16, zerospec's
    the model computed in fp32, each exactly; they differ, and no sound bound on by how much is
    derived (spec/deepspeed.md), so later steps are not compared."""
    cfg = _cfg(2).replace(precision="bf16")
    row = bf16[stage - 1]
    ds = row["deepspeed"][("zerospec", "default")]
    assert ds["losses"][0] == step_one_loss(cfg, torch.bfloat16)
    assert row["losses"][0] == step_one_loss(cfg, torch.float32)
    assert ds["losses"][0] != row["losses"][0]


# -- traffic ----------------------------------------------------------------------------------------
def padded_sizes(model: str, n: int) -> dict[str, int]:
    """Ψ and its padded forms: zerospec pads each unit to a multiple of N; DeepSpeed ZeRO-1/2 pads
    the flat buffer to a multiple of 2N (its nccl_start_alignment_factor 2), ZeRO-3 each tensor to N."""
    cfg = _cfg(n, model)
    tensors = [math.prod(shape) for _, params in cfg.model.unit_spec() for _, shape in params]
    psi, units = cfg.model.psi, cfg.model.units(n)   # stages 1-3 pad their units
    pad = lambda x, m: -(-x // m) * m   # noqa: E731
    wide = [t for t in tensors if t > PERSIST]
    return {"psi": psi, "zerospec": sum(u.padded for u in units), "ds12": pad(psi, 2 * n),
            "ds3": sum(pad(t, n) for t in tensors), "ds3_wide": sum(pad(t, n) for t in wide),
            "embed": units[0].padded}


def measured(rows, n: int = 2) -> dict:
    """(stage, engine) → phase → elements, the last (steady) step, rank 0."""
    from zerospec.testing.deepspeed_peer import ds_volume, ledger_volume
    out = {}
    for row in rows:
        out[row["stage"], "zerospec"] = ledger_volume(row["records"][0], LONG_STEPS)
        for (_, settings), ds in row["deepspeed"].items():
            out[row["stage"], settings] = ds_volume(ds["comms"][0][-1], n)
    return out


def expected(model: str, n: int = 2) -> dict:
    """The same from the closed forms (spec/deepspeed.md says where each term comes from)."""
    s = padded_sizes(model, n)
    psi, zs, ds12, ds3, wide, emb = (s[k] for k in ("psi", "zerospec", "ds12", "ds3", "ds3_wide", "embed"))
    out = {}
    for stage in (1, 2):
        out[stage, "zerospec"] = {"forward": 0, "backward": zs, "step": zs}           # RS + AG
        # default: every bucket all-reduced (2Ψ), then the updated partitions all-gathered
        out[stage, "default"] = {"forward": 0, "backward": 2 * psi, "step": ds12 + 2 * FLAG[stage]}
        out[stage, "paper"] = {"forward": 0, "backward": psi, "step": ds12 + 2 * FLAG[stage]}
    # zerospec's ZeRO-3 gathers every unit in forward and again (all but the last) in backward,
    # plus the embedding once more for the tied LM head
    out[3, "zerospec"] = {"forward": zs + emb, "backward": zs - emb + zs, "step": 0}
    # default: tensors <= 1e5 elements stay whole and are re-gathered after the step; the rest are
    # gathered in forward and kept for backward (max reuse distance)
    out[3, "default"] = {"forward": wide, "backward": ds3, "step": ds3 - wide + 2 * FLAG[3]}
    out[3, "paper"] = {"forward": ds3, "backward": ds3 + ds3, "step": 2 * FLAG[3]}
    return out


@pytest.mark.parametrize("n", [2, 4], ids=lambda n: f"N={n}")
@pytest.mark.parametrize("model", ["odd", "small"])
def test_per_phase_traffic_equals_the_closed_forms(request, model, n):
    """Every phase of every engine, in elements: DeepSpeed's defaults 3Ψ (ZeRO-1/2) and 2Ψ (ZeRO-3),
    the paper's 2Ψ and 3Ψ with its settings, zerospec's ledger 2Ψ and 3Ψ (each up to padding)."""
    traffic = request.getfixturevalue("traffic" if n == 2 else "traffic4")
    assert measured(traffic[model], n) == expected(model, n)


def volume_table(traffic, n: int = 2) -> str:
    """Per-step volume in elements, N = n, the last step; Ψ in the last column for scale."""
    lines = ["| model | stage | engine | settings | forward | backward | step | total | Ψ |",
             "|---|---|---|---|---|---|---|---|---|"]
    for model, rows in traffic.items():
        psi = _cfg(n, model).model.psi
        for (stage, who), v in measured(rows, n).items():
            engine, settings = ("zerospec", "—") if who == "zerospec" else (f"DeepSpeed ZeRO-{stage}", who)
            lines.append(f"| {model} | {stage_id(stage)} | {engine} | {settings} | {v['forward']:,} | "
                         f"{v['backward']:,} | {v['step']:,} | {sum(v.values()):,} | {psi:,} |")
    return "\n".join(lines)


def test_volume_table(traffic, md_snapshot):
    """The table of spec/deepspeed.md: what DeepSpeed moves by default and with the paper's settings."""
    assert volume_table(traffic) == md_snapshot


def test_volume_table_at_four_ranks(traffic4, md_snapshot):
    """The same table at N = 4 (spec/deepspeed.md): the same volumes, padded to multiples of 4 and 8."""
    assert volume_table(traffic4, 4) == md_snapshot


# -- memory estimators ------------------------------------------------------------------------------
def test_plans_deepspeed_estimator_equals_deepspeeds_own_functions_to_the_byte():
    """`plan --estimator deepspeed` (paper.estimators.deepspeed_bytes) equals DeepSpeed's
    estimate_zero2/3_model_states_mem_needs' GPU bytes, with and without offload, for any Ψ, N, L."""
    import os
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs as zero3
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs as zero2

    from zerospec.paper.estimators import deepspeed_bytes
    for psi in (6_555, 536_064, 7_500_000_000, 175_000_000_001, 10**12):
        for n in (1, 7, 64, 1024):
            for off in (False, True):
                assert deepspeed_bytes(2, psi, n, offload_optimizer=off) == zero2(
                    psi, num_gpus_per_node=n, cpu_offload=off)[1]
                for layer in (0, 123_456_789):
                    for off_p in ((False, True) if off else (False,)):
                        assert deepspeed_bytes(3, psi, n, layer, off, off_p) == zero3(
                            psi, layer, num_gpus_per_node=n, cpu_offload=off, cpu_offload_params=off_p)[1]
