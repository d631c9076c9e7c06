"""torch's own engines as oracles: each zerospec stage trains like its peer, step for step (fp32).

Peers (zerospec.testing.oracles): stage 0 ↔ DDP + Adam, 1 ↔ ZeroRedundancyOptimizer(Adam), 2 ↔ FSDP2
fully_shard(reshard_after_forward=False), 3 ↔ FSDP2 fully_shard(reshard_after_forward=True); same
model (zerospec.model.gpt's math as an nn.Module), initial weights, data and Adam hyper-parameters.

Tolerances, derived (spec/engine.md, "How close the peers must be"):

* **Peer with zerospec's Adam arithmetic, N = 2 → equal bits.** A two-term sum has one order;
  dividing by 2 before (DDP, FSDP2) or after (zerospec) the sum is exact; bucketing, sharding and
  gathering copy bits; a sharded elementwise Adam equals the whole-vector one. Nothing may differ.
* **Peer with torch.optim.Adam** (lerp/addcmul/addcdiv round differently from our mul/add/div),
  **or N = 4** (ring order): losses to 1e-6 relative and weights to lr/10 after every step, the
  bounds of tests/engine/test_parity.py — Adam's 1/√v̂ turns a rounding-level change in a gradient
  that cancels to noise into an update of up to ~lr, so only O(lr) holds for every weight.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.support.runs import LONG_STEPS, MODELS, stage_id
from zerospec.testing.oracles import PEERS, compare
from zerospec.testing.paired import paired
from zerospec.training.config import TrainConfig
from zerospec.training.sections import OptimOptions

STAGES = (0, 1, 2, 3)


def _cfg(n_d: int) -> TrainConfig:
    return TrainConfig(n_d=n_d, model=MODELS["odd"], steps=LONG_STEPS, timeout=60,
                       optim=OptimOptions(precision="fp32"))


@pytest.fixture(scope="module")
def two():
    """Every stage and its peer with zerospec's Adam arithmetic on 2 gloo processes, with
    collective counts (an optimizer makes no collective: the counts are the engines')."""
    return compare(_cfg(2), STAGES, optimizers=("zerospec",))


@pytest.fixture(scope="module")
def two_torch():
    """Every stage and its peer with torch.optim.Adam on 2 gloo processes (the slow cases)."""
    return compare(_cfg(2), STAGES, optimizers=("torch",), count=False)


def assert_equal_every_step(row, peer) -> None:
    assert row["losses"] == peer["losses"]
    for ours, theirs in zip(row["weights"], peer["weights"], strict=True):
        assert ours.keys() == theirs.keys()
        assert all(torch.equal(ours[k], theirs[k]) for k in ours)


def assert_close_every_step(row, peer, lr) -> None:
    for x, y in zip(row["losses"], peer["losses"], strict=True):
        assert abs(x - y) <= 1e-6 * abs(y)
    for ours, theirs in zip(row["weights"], peer["weights"], strict=True):
        assert max(float((ours[k] - theirs[k]).abs().max()) for k in theirs) <= lr / 10


@pytest.mark.parametrize("stage", STAGES, ids=lambda s: f"{stage_id(s)}-vs-{PEERS[s]}")
def test_peer_with_our_adam_arithmetic_equals_the_stage_bit_for_bit(two, stage):
    """N = 2: only the engines differ, and nothing in them may change a bit (module docstring)."""
    row = two[stage]
    assert_equal_every_step(row, row["peers"]["zerospec"])


@pytest.mark.slow   # its own launch; the default run keeps the bit-for-bit comparison above
@pytest.mark.parametrize("stage", STAGES, ids=lambda s: f"{stage_id(s)}-vs-{PEERS[s]}")
def test_peer_with_torch_adam_matches_the_stage_within_the_derived_tolerance(two_torch, stage):
    """torch.optim.Adam rounds differently: losses to 1e-6 relative, weights to lr/10, every step."""
    row = two_torch[stage]
    assert_close_every_step(row, row["peers"]["torch"], _cfg(2).adam.lr)


def test_the_peer_model_calls_every_submodule_once_per_forward():
    """Wrappers hook submodules (DeepSpeed ZeRO-3 gathers a Linear's weight in its pre-hook): every
    nn.Linear and nn.LayerNorm of the peer GPT must run as a module, once per forward."""
    from zerospec.testing.oracles import GPT
    cfg = _cfg(2)
    model = GPT.from_init(cfg.model, cfg.seed)
    calls: dict[str, int] = {}
    for name, mod in model.named_modules():
        if isinstance(mod, (torch.nn.Linear, torch.nn.LayerNorm)):
            mod.register_forward_pre_hook(
                lambda m, a, name=name: calls.update({name: calls.get(name, 0) + 1}))
    idx = torch.zeros(2, cfg.model.block_size, dtype=torch.long)
    model(idx, idx)
    assert len(calls) == 6 * cfg.model.n_layer + 1 and set(calls.values()) == {1}


def test_the_comparison_is_not_vacuous(two):
    """Weights move every step by far more than the tolerance on most elements, and losses fall."""
    row = two[0]
    w0, w1 = row["weights"][0], row["weights"][-1]
    moved = torch.cat([(w1[k] - w0[k]).abs().flatten() for k in w0])
    assert float(moved.median()) > _cfg(2).adam.lr      # 4 more steps of ~lr each
    assert row["losses"][-1] < row["losses"][0]


def test_torch_sees_the_collectives_our_ledger_books(two):
    """CommDebugMode's count of c10d ops in a step equals the ledger's count of transport calls:
    one per collective sent alone, one per run of a batch that gloo got fused (comm/coalesce.py)."""
    for row in two:
        booked: dict[str, int] = {}
        for rec in row["records"][0]:
            if rec.step == LONG_STEPS and rec.sent_as:
                booked[rec.sent_as] = booked.get(rec.sent_as, 0) + 1
        assert row["c10d_last_step"] == booked


def counts_table(rows) -> str:
    """Collectives in one step (the last: steady state) on rank 0, by phase, zerospec vs peer."""
    def fmt(c: dict[str, int]) -> str:
        return ", ".join(f"{n} {op}" for op, n in sorted(c.items())) or "—"
    lines = ["| stage | engine | forward | backward (+ grad sync) | optimizer step (+ param sync) | total |",
             "|---|---|---|---|---|---|"]
    for row in rows:
        for who, counts in (("zerospec", row["counts"]), (row["peer"], row["peers"]["zerospec"]["counts"])):
            total = sum(sum(c.values()) for c in counts.values())
            lines.append(f"| {stage_id(row['stage'])} | {who} | {fmt(counts['forward'])} | "
                         f"{fmt(counts['backward'])} | {fmt(counts['step'])} | {total} |")
    return "\n".join(lines)


def test_collective_counts_per_step_table(two, md_snapshot):
    """The per-step collective counts of spec/engine.md (odd model: 4 units, 28 tensors, N = 2)."""
    assert counts_table(two) == md_snapshot


def test_collective_counts_differ_from_the_peers_only_as_spec_engine_md_explains(two):
    """Units U = n_layer + 2, tensors P = 12·n_layer + 4; each difference has its reason (spec)."""
    L = MODELS["odd"].n_layer
    U, P = L + 2, 12 * L + 4
    last = {row["stage"]: (row["counts"], row["peers"]["zerospec"]["counts"]) for row in two}
    ours, ddp = last[0]
    assert ours["backward"] == {"all_reduce": U} and ddp["backward"] == {"all_reduce": 1}  # 1 bucket
    ours, zro = last[1]
    assert ours["backward"] == {"reduce_scatter": U} and ours["step"] == {"all_gather": U}
    assert zro["backward"] == {"all_reduce": 1} and zro["step"] == {"broadcast": P}  # per tensor
    ours, fsdp = last[2]
    assert ours["step"] == {"all_gather": U} and fsdp["forward"] == {"all_gather": U}  # when, not how many
    assert ours["backward"] == fsdp["backward"] == {"reduce_scatter": U}
    ours, fsdp = last[3]
    assert ours["forward"] == {"all_gather": U + 1} and ours["backward"]["all_gather"] == U - 1
    assert fsdp["forward"] == {"all_gather": U} and fsdp["backward"]["all_gather"] == U


@pytest.mark.slow   # a launch of its own; the default run compares the peers in `two` above
@pytest.mark.parametrize("stage", [0, 3], ids=lambda s: f"{stage_id(s)}-vs-{PEERS[s]}")
def test_interleaved_with_its_peer_step_by_step_each_side_trains_as_alone(stage):
    """The engine benchmark's pairing (zerospec/testing/paired.py): zerospec's step s, then the
    peer's, on the same processes. With zerospec's Adam at N = 2 both give the same losses (equal
    bits, as in separate runs above), and every step of both sides is timed."""
    cfg = dataclasses.replace(_cfg(2), stage=stage, steps=3)
    for rank in paired(cfg, optimizer="zerospec"):
        assert rank["losses"] == rank["peer_losses"] and len(set(rank["losses"])) == 3
        assert all(len(rank[k]) == 3 and min(rank[k]) > 0
                   for k in ("ours", "peer", "ours_cpu", "peer_cpu"))


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["zerospec", "torch"])
def test_four_ranks_match_every_peer_within_the_derived_tolerance(optimizer):
    """N = 4: ring order differs between engines; losses to 1e-6 relative, weights to lr/10."""
    rows = compare(_cfg(4), STAGES, optimizers=(optimizer,), count=False)
    for row in rows:
        assert_close_every_step(row, row["peers"][optimizer], _cfg(4).adam.lr)
