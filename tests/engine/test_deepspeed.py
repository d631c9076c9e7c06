"""DeepSpeed, the paper's reference implementation, as a peer: stages 1–3 vs DeepSpeed ZeRO-1/2/3 (fp32).

Optional: these tests need ``pip install -e ".[peers]"``, are marked ``deepspeed`` (left out of the
default run; ``pytest -m deepspeed`` runs them, as CI does in a step of its own) and skip when
DeepSpeed is not installed. Peer: zerospec.testing.deepspeed_peer (same model, init, data, Adam
hyper-parameters; ZeRO-3 with ``memory_efficient_linear: false``).

Tolerances, derived as for the torch peers (tests/engine/test_peers.py, spec/engine.md):

* **DeepSpeed with zerospec's Adam arithmetic, N = 2 → equal bits.** A two-term sum has one order;
  halving before or after it is exact; bucketing, partitioning (flat in ZeRO-1/2, per parameter in
  ZeRO-3) and gathering copy bits; an elementwise Adam on a partition equals the whole-vector one.
* **With torch.optim.Adam, or N = 4** (DeepSpeed's ring order is not ours): losses to 1e-6 relative,
  weights to lr/10 after every step — Adam's 1/√v̂ turns a rounding-level change into up to ~lr.

Traffic (spec/deepspeed.md) is the paper's per-step volume in elements: an all-reduce of S counts
2S, a reduce-scatter, reduce or all-gather of S counts S (per rank the ring moves (N−1)/N of it).
DeepSpeed's comms logger records each op's *input*: the shard for all-gather (S = N × it), the
whole S otherwise; zerospec's ledger books S itself.
"""
from __future__ import annotations

import importlib.util
import math

import pytest

from tests.engine.test_peers import assert_close_every_step, assert_equal_every_step
from tests.runs import MODELS, STEPS, stage_id
from zerospec.training.config import TrainConfig



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
    return TrainConfig(n_d=n_d, model=MODELS[model], steps=STEPS, precision="fp32", timeout=300)


def _compare(*args, **kw):
    from zerospec.testing.deepspeed_peer import compare
    return compare(*args, **kw)


@pytest.fixture(scope="module")
def two():
    """Every stage and DeepSpeed (both optimizers, both settings) on 2 gloo processes, weights per step."""
    return _compare(_cfg(2), STAGES, optimizers=("zerospec", "torch"), settings=SETTINGS)


@pytest.fixture(scope="module")
def traffic():
    """model → rows of per-phase volumes (no weights read: see run_deepspeed), N = 2, torch's Adam."""
    return {m: _compare(_cfg(2, m), STAGES, settings=SETTINGS, weights=False) for m in ("odd", "small")}


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
    import torch
    ds = two[0]["deepspeed"][("zerospec", "default")]
    w0, w1 = ds["weights"][0], ds["weights"][-1]
    assert float(torch.cat([(w1[k] - w0[k]).abs().flatten() for k in w0]).median()) > _cfg(2).adam.lr
    assert ds["losses"][-1] < ds["losses"][0]


@pytest.mark.parametrize("optimizer", ["zerospec", "torch"])
def test_four_ranks_match_deepspeed_within_the_derived_tolerance(optimizer):
    """N = 4: DeepSpeed's reduction order is not ours; losses to 1e-6 relative, weights to lr/10."""
    for row in _compare(_cfg(4), STAGES, optimizers=(optimizer,)):
        assert_close_every_step(row, row["deepspeed"][(optimizer, "default")], _cfg(4).adam.lr)


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
        out[row["stage"], "zerospec"] = ledger_volume(row["records"][0], STEPS)
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


@pytest.mark.parametrize("model", ["odd", "small"])
def test_per_phase_traffic_equals_the_closed_forms(traffic, model):
    """Every phase of every engine, in elements: DeepSpeed's defaults 3Ψ (ZeRO-1/2) and 2Ψ (ZeRO-3),
    the paper's 2Ψ and 3Ψ with its settings, zerospec's ledger 2Ψ and 3Ψ (each up to padding)."""
    assert measured(traffic[model]) == expected(model)


def volume_table(traffic) -> str:
    """Per-step volume in elements, N = 2, the last step; Ψ in the last column for scale."""
    lines = ["| model | stage | engine | settings | forward | backward | step | total | Ψ |",
             "|---|---|---|---|---|---|---|---|---|"]
    for model, rows in traffic.items():
        psi = _cfg(2, model).model.psi
        for (stage, who), v in measured(rows).items():
            engine, settings = ("zerospec", "—") if who == "zerospec" else (f"DeepSpeed ZeRO-{stage}", who)
            lines.append(f"| {model} | {stage_id(stage)} | {engine} | {settings} | {v['forward']:,} | "
                         f"{v['backward']:,} | {v['step']:,} | {sum(v.values()):,} | {psi:,} |")
    return "\n".join(lines)


def test_volume_table(traffic, md_snapshot):
    """The table of spec/deepspeed.md: what DeepSpeed moves by default and with the paper's settings."""
    assert volume_table(traffic) == md_snapshot


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
