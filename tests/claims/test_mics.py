"""MiCS / FSDP2's HSDP (spec/mics.md): a partition group of p GPUs holds one replica of the model
states (M1), gradients take two hops — inside the group every micro-step, across replicas once
per step (M2) — so with the group inside a node only that all-reduce crosses nodes (M3), and the
model trained is ZeRO's: bit-identical with exact sums, within a derived bound otherwise (M5).

Runs: the ODD model (no unit divides by any N) on N = 4 as 2 nodes × 2 GPUs, p = 2.
"""
from __future__ import annotations

import dataclasses
import functools
from collections import Counter

import pytest
import torch

from tests.support.runs import assert_same_training
from zerospec.cluster.threads import VirtualCluster
from zerospec.model.gpt import ODD
from zerospec.paper import theory
from zerospec.training.config import TrainConfig
from zerospec.training.sections import MeshOptions
from zerospec.training.run import train
from zerospec.zero import Parameters

U16, U32 = 2.0 ** -11, 2.0 ** -24   # unit roundoff of fp16 and fp32
FP16_SUBNORMAL_HALF_ULP = 2.0 ** -25


def gamma(k: int, u: float) -> float:
    return k * u / (1 - k * u)

N, G = 4, 2          # 2 nodes × 2 GPUs
BASE = TrainConfig(stage=3, n_d=N, model=ODD, steps=2, mesh=MeshOptions(gpus_per_node=G))


@functools.lru_cache(maxsize=None)
def wired(stage: int, p: int | None, n: int = N, steps: int = 2, accum: int = 1,
          observe: bool = False, transport: str = "direct", exact: bool = False):
    """(cluster, Result): ``stage`` on n // G nodes, MiCS with partition groups of p (None: off)."""
    cluster = VirtualCluster(n, transport=transport, gpus_per_node=G, observe=observe)
    cfg = BASE.replace(stage=stage, n_d=n, steps=steps, shard_group=p, grad_accum_steps=accum,
                       exact_grads=exact)
    return cluster, train(cfg, cluster=cluster)


# stage 3, MiCS's own, in the default run; its partition groups under stages 1 and 2 are slow cases
MICS_STAGES = [pytest.param(1, marks=pytest.mark.slow), pytest.param(2, marks=pytest.mark.slow), 3]


@pytest.mark.parametrize("stage", MICS_STAGES)
@pytest.mark.claim("M1")
def test_each_gpu_holds_the_model_states_of_its_stage_at_n_d_equal_p(stage, claim_values):
    """On 4 GPUs with p = 2 the observer sees, on every rank, the stage's model states over p
    once setup is done — (2+2+K)Ψ_p/p in stage 3 (M1), with Ψ_p every unit of ODD padded to a
    multiple of p by hand — and at every phase's start the bytes of the same stage on 2 GPUs,
    whatever N is."""
    mics, plain = wired(stage, 2, observe=True)[0].observed, wired(stage, None, n=2,
                                                                  observe=True)[0].observed
    r = wired(stage, 2)[1]
    psi_p = sum(-(-u.numel // 2) * 2 for u in ODD.units(1))    # Σ_u ⌈numel_u / p⌉·p: 6,558
    states = theory.mics_model_state_bytes(stage, psi_p, 2)
    for k in range(N):
        assert mics[k].entries["forward@1"].bytes == states
        assert mics[k].entries.keys() == plain[k % 2].entries.keys()
        assert all(mics[k].entries[e].bytes == plain[k % 2].entries[e].bytes for e in mics[k].entries)
        assert r.model_states(k) == states
    claim_values(f"{r.model_states(0):,} B = {float(states / r.psi_held):g}Ψ_p per GPU, as at N_d = 2",
                 "16Ψ/p (M1)" if stage == 3 else f"stage {stage} at N_d = p (M1)",
                 f"N = {N}, p = 2, Ψ_p = {r.psi_held:,}")


@pytest.mark.parametrize("accum", [1, 3])
@pytest.mark.claim("M2")
def test_the_group_reduces_every_micro_step_and_replicas_all_reduce_once_per_step(accum,
                                                                                 claim_values):
    """Per step: one reduce-scatter per unit and micro-step inside the group (in backward), one
    all-reduce per unit across the replicas at the boundary (grad_sync) whatever G is, of the
    Ψ/p shard: 2(R−1)/R·Ψ/p elements per GPU (M2)."""
    _, r = wired(3, 2, accum=accum)
    units = len(r.units)
    for k in range(N):
        recs = r.comm.records(k, step=2)
        seen = Counter((c.op, c.group, c.phase) for c in recs if c.op != "all_gather")
        assert seen == {("reduce_scatter", "shard", "backward"): units * accum,
                        ("all_reduce", "replica", "grad_sync"): units}
        assert all(c.group == "shard" for c in recs if c.op == "all_gather")
        sent = sum(c.elements_sent for c in recs if c.group == "replica")
        assert sent == theory.mics_replica_all_reduce(r.psi_held, N, 2)
    claim_values(f"{units * accum} reduce-scatters in the group, {units} all-reduces across "
                 f"replicas per step", "RS every micro-step, AR at the boundary (M2)",
                 f"G = {accum}, N = {N}, p = 2")


@pytest.mark.claim("M3")
def test_with_the_group_inside_a_node_only_the_replica_all_reduce_crosses_nodes(claim_values):
    """On the ring's wire (each hop classed by its two ends' nodes) and in the ledger: every
    all-gather and reduce-scatter stays inside the node; the replication all-reduce is all that
    crosses, 2(R−1)/R·Ψ/p per GPU per step — against stage 3's 3Ψ(N−1)/N leaving each node."""
    cluster, r = wired(3, 2, steps=1, transport="ring")
    _, flat = wired(3, None, steps=1, transport="ring")
    wire = Counter()
    for rec in cluster.wire.records:
        for (src, dst), e in rec.elements.items():
            wire[rec.op, "intra" if src // G == dst // G else "inter"] += e
    assert {op for op, link in wire if link == "inter"} == {"all_reduce"}
    assert {op for op, link in wire if link == "intra"} == {"all_gather", "reduce_scatter"}
    per_gpu = theory.mics_replica_all_reduce(r.psi_held, N, 2)
    assert wire["all_reduce", "inter"] == N * per_gpu
    assert [r.comm.elements(k, link="inter") for k in range(N)] == [per_gpu] * N
    assert r.comm.crossing(0) == G * per_gpu
    claim_values(f"{r.comm.crossing(0):,} elements leave a node per step "
                 f"({float(r.comm.crossing(0) / r.psi_held):.3f}Ψ_p; stage 3: "
                 f"{flat.comm.crossing(0):,})", "only the replica all-reduce crosses (M3)",
                 f"2 nodes × {G}, p = {G}")


@pytest.mark.parametrize("stage", MICS_STAGES)
@pytest.mark.claim("M5")
def test_with_exact_sums_mics_trains_bit_identically_to_the_flat_stage(stage):
    """Exact fp64 sums of fp16 gradients make the association irrelevant: MiCS (p = 2) and the
    flat stage at N = 4 train the same bits, with accumulation (G = 2) and without (M5)."""
    for accum in (1, 2):
        assert_same_training(wired(stage, 2, accum=accum, exact=True)[1],
                             wired(stage, None, accum=accum, exact=True)[1])


def reduced_gradients(cfg, monkeypatch):
    """(each rank's fp16 unit gradients as backward handed them over, the reduced mean gradient
    of each unit put together from the owners' shards) after one step of ``cfg``."""
    raw, mean = {}, {}
    handed = Parameters.grad_ready

    def spy(self, i, slot):
        raw[getattr(self.ctx, "global_rank", self.ctx.rank), i] = slot[:self.units[i].numel].clone()
        handed(self, i, slot)

    def on_step(step, stage):
        for i, u in enumerate(stage.units):
            flat = mean.setdefault(i, torch.zeros(u.padded, dtype=torch.float64))
            flat[stage.owned_slice(u)] = stage.grad_for_step(i).double()

    monkeypatch.setattr(Parameters, "grad_ready", spy)
    train(cfg, on_step=on_step)
    units = cfg.units()
    return raw, {i: mean[i][:units[i].numel] for i in mean}


@pytest.mark.claim("M5")
def test_with_rounded_means_each_gradient_stays_within_its_derived_bound(monkeypatch):
    """Without exact sums each hop rounds its mean to fp16: the reduced gradient of every element
    lies within the two-hop bound of spec/mics.md around the exact mean of what backward handed
    over (the flat stage within its one-rounding bound), and the two differ (M5)."""
    cfg = dataclasses.replace(BASE, steps=1)
    raw, mics = reduced_gradients(cfg.replace(shard_group=2), monkeypatch)
    raw_flat, flat = reduced_gradients(cfg, monkeypatch)
    assert raw.keys() == raw_flat.keys() and all(torch.equal(raw[k], raw_flat[k]) for k in raw)
    p, r, h = 2, N // 2, FP16_SUBNORMAL_HALF_ULP
    for i in mics:
        xs = [raw[k, i].double() for k in range(N)]
        exact, a = sum(xs) / N, sum(x.abs() for x in xs) / N
        b = sum(sum(xs[j:j + p]).abs() for j in range(0, N, p)) / N
        e1 = (1 + U16) * gamma(p, U32) * a + U16 * b + h
        hop2 = gamma(r, U32) * (b + e1)
        assert ((mics[i] - exact).abs() <= e1 + hop2 + U16 * (exact.abs() + e1 + hop2) + h).all()
        assert ((flat[i] - exact).abs() <= (1 + U16) * gamma(N, U32) * a + U16 * exact.abs() + h).all()
    assert any(not torch.equal(mics[i], flat[i]) for i in mics)


@pytest.mark.claim("M5")
def test_with_rounded_means_the_first_step_agrees_and_each_update_stays_within_lr():
    """Without exact sums each hop rounds its mean to fp16 (spec/mics.md derives the gradient's
    bound; tests/unit/zero/test_mics.py checks it): step 1's losses are equal bit for bit (same
    weights), and after Adam's first step, whose update is ±lr·g/(|g| + ε), every weight is
    within 2·lr of the flat stage's (M5)."""
    a, b = wired(3, 2, steps=1)[1], wired(3, None, steps=1)[1]
    assert a.rank_losses == b.rank_losses
    lr = BASE.adam.lr
    gap = max(float((a.master[k] - b.master[k]).abs().max()) for k in a.master)
    assert 0 < gap <= 2 * lr      # they differ (two roundings against one), within the bound


# -- MiCS with ZeRO++'s quantized collectives ----------------------------------------------------
QUANT = [{"qwz": True}, {"qgz": True}, {"qwz": True, "qgz": True}]


@pytest.mark.parametrize("quant", QUANT, ids=lambda q: "+".join(q))
def test_one_partition_group_of_every_rank_quantizes_as_the_flat_stage_does(quant):
    """p = N: one partition group, no replica to all-reduce with; qwZ's int8 gathers and qgZ's
    int4 all-to-alls run over the same ranks in the same order, so every loss and master weight
    equals qwZ/qgZ without MiCS bit for bit."""
    assert_same_training(train(BASE.replace(shard_group=N, **quant)),
                         train(BASE.replace(**quant)))


@pytest.mark.parametrize("quant", QUANT, ids=lambda q: "+".join(q))
@pytest.mark.claim("M3")
def test_with_quantized_collectives_too_only_the_replica_all_reduce_crosses_nodes(quant):
    """p = G: qwZ's gathers and qgZ's all-to-alls stay inside the partition group, a node; what
    leaves a node is the replicas' fp16 all-reduce alone, 2(R−1)/R·Ψ/p per GPU per step, as
    without quantization."""
    r = train(BASE.replace(shard_group=G, steps=1, **quant))
    per_gpu = theory.mics_replica_all_reduce(r.psi_held, N, G)
    for k in range(N):
        assert {x.op for x in r.comm.records(k, link="inter")} == {"all_reduce"}
        assert r.comm.elements(k, link="inter") == per_gpu
