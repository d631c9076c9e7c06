"""Nodes and links (spec/nodes.md): every transfer booked on its link class, what crosses nodes in
stage 3 (D1) and with ZeRO++'s hpZ (D2's middle row), and hpZ's memory (D6).

Runs: the ODD model, whose units divide by no N, on N = 4 as 2 nodes × 2 GPUs and N = 8 as
2 × 4, over the ring transport, whose wire counts every hop between neighbours; each hop is
classed by the nodes of its two ends, independently of the ledger's booking.
"""
from __future__ import annotations

import functools
from collections import Counter
from fractions import Fraction

import pytest

from tests.support.runs import assert_same_training
from zerospec.cluster.threads import VirtualCluster
from zerospec.model.gpt import ODD
from zerospec.model.presets import PRESETS
from zerospec.paper import theory
from zerospec.render.format import markdown
from zerospec.training.config import TrainConfig
from zerospec.training.sections import MeshOptions
from zerospec.training.run import train
from zerospec.training.scale import measure

SHAPES = [(4, 2), (8, 4)]        # (N, GPUs per node): 2 nodes each
SHAPE_IDS = [f"{n // g}x{g}" for n, g in SHAPES]


@functools.lru_cache(maxsize=None)
def wired(stage: int, n: int, g: int, hpz: int = 1, steps: int = 1, observe: bool = False,
          transport: str = "ring"):
    """(cluster, Result) of one run on n // g nodes of g GPUs."""
    cluster = VirtualCluster(n, transport=transport, gpus_per_node=g, observe=observe)
    cfg = TrainConfig(stage=stage, n_d=n, model=ODD, steps=steps,
                      mesh=MeshOptions(gpus_per_node=g, hpz=hpz))
    return cluster, train(cfg, cluster=cluster)


def hop_class(src: int, dst: int, g: int) -> str:
    """A hop's link class from first principles: rank r sits on node r // g."""
    return "intra" if src // g == dst // g else "inter"


def wire_sent(wire, g: int) -> Counter:
    """(sender, op, link class) -> elements it put on the wire."""
    out: Counter = Counter()
    for rec in wire.records:
        for (src, dst), e in rec.elements.items():
            out[src, rec.op, hop_class(src, dst, g)] += e
    return out


@pytest.mark.parametrize("n,g", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("stage,hpz", [(0, 1), (2, 1), (3, 1), (3, 2)],
                         ids=["DP", "P_os+g", "P_os+g+p", "hpZ-2"])
@pytest.mark.claim("D1")
def test_the_ledger_books_each_hop_on_the_link_class_the_wire_saw(stage, hpz, n, g):
    """Every element a rank sent is booked on the link class of the hop that carried it: per
    sender, collective kind and class, the ledger's books equal the wire's counts (D1's link
    part: cross-node volume is what the wire carried between nodes)."""
    cluster, _ = wired(stage, n, g, hpz)
    ledger, wire = cluster.comm_ledger, cluster.wire
    booked = Counter()
    for rec in ledger.records():
        if rec.elements_sent:
            booked[rec.rank, rec.op, rec.link] += rec.elements_sent
    assert booked == wire_sent(wire, g)
    assert {k[2] for k in booked} == {"intra", "inter"}      # both classes really occur
    assert wire.by_link() == {c: sum(ledger.elements(r, link=c) for r in range(n))
                              for c in ("intra", "inter")}


def test_a_flat_ring_over_2_nodes_leaves_them_at_its_two_boundary_gpus():
    """Ranks 0 1 | 2 3: the ring 0→1→2→3→0 leaves a node at 1→2 and 3→0; those senders' whole
    share is cross-node volume, the others' none."""
    cluster, r = wired(3, 4, 2)
    led = cluster.comm_ledger
    assert [led.elements(k, link="inter") for k in range(4)] == [0, led.elements(1), 0, led.elements(3)]
    assert [led.elements(k, link="intra") for k in range(4)] == [led.elements(0), 0, led.elements(2), 0]
    assert [cluster.wire.leaving(node) for node in (0, 1)] == [led.crossing(0), led.crossing(1)] \
        == [led.elements(1), led.elements(3)]


def test_one_node_books_every_hop_inside_it():
    """Without gpus_per_node the cluster is one node: nothing crosses (every default run)."""
    cluster, _ = wired(3, 4, None)
    assert cluster.comm_ledger.crossing(0) == 0 == cluster.wire.by_link()["inter"]
    assert cluster.wire.by_link()["intra"] == sum(cluster.comm_ledger.elements(k) for k in range(4))


@pytest.mark.parametrize("n,g", SHAPES, ids=SHAPE_IDS)
@pytest.mark.claim("D1")
def test_stage3_sends_3M_across_each_node_boundary_per_step(n, g, claim_values):
    """ZeRO-3 moves M in forward's all-gathers, M in backward's and M in the gradient
    reduce-scatter across each node's boundary: 3M(N−1)/N per node per step (D1); as on
    spec/communication.md (C57), forward carries M + E and backward M − E, E the tied embedding."""
    cluster, r = wired(3, n, g)
    led, psi = cluster.comm_ledger, r.psi_held
    paper = theory.stage3_node_crossing(psi, n)
    assert [cluster.wire.leaving(node) for node in (0, 1)] == [sum(paper.values())] * 2
    embed = r.units[0].padded * theory.ring_factor(n)
    measured = {"forward all-gather": led.crossing(0, phase="forward", op="all_gather"),
                "backward all-gather": led.crossing(0, phase="backward", op="all_gather"),
                "reduce-scatter": led.crossing(0, op="reduce_scatter")}
    assert measured == {"forward all-gather": paper["forward all-gather"] + embed,
                        "backward all-gather": paper["backward all-gather"] - embed,
                        "reduce-scatter": paper["reduce-scatter"]}
    claim_values(f"{sum(measured.values()) / psi}·Ψ across each node", f"3M·(N−1)/N = "
                 f"{sum(paper.values()) / psi}·Ψ (D1)", f"{n // g} nodes × {g}, M = Ψ")


@pytest.mark.parametrize("n,g,h", [(4, 2, 2), (8, 4, 4), (8, 4, 2)], ids=["2x2/h=2", "2x4/h=4", "2x4/h=2"])
@pytest.mark.claim("D2")
def test_hpz_backward_all_gather_sends_nothing_across_nodes(n, g, h, claim_values):
    """hpZ gathers in backward from the node's secondary shards: 0 cross-node elements for the
    backward all-gather (D2: M → 0), on the wire and in the ledger; forward and the reduce-scatter
    cross as in stage 3."""
    cluster, r = wired(3, n, g, h)
    base, _ = wired(3, n, g)
    led, wire = cluster.comm_ledger, cluster.wire
    back = [led.elements(k, phase="backward", op="all_gather", link="inter") for k in range(n)]
    assert back == [0] * n
    assert all(rec.link == "intra" for rec in led.records(group="hpz"))
    assert led.elements(0, phase="backward", op="all_gather", group="hpz") > 0   # it did gather
    # what the wire saw leave node 0 is stage 3's, less exactly its backward all-gathers
    assert wire.leaving(0) == base.wire.leaving(0) - base.comm_ledger.crossing(
        0, phase="backward", op="all_gather") > 0
    claim_values(f"{sum(back)} backward all-gather elements across nodes", "0 (D2, hpZ)",
                 f"{n // g} × {g}, h = {h}")


@pytest.mark.parametrize("n,g,h", [(4, 2, 2), pytest.param(8, 4, 4, marks=pytest.mark.slow),
                                   pytest.param(8, 4, 2, marks=pytest.mark.slow)],
                         ids=["2x2/h=2", "2x4/h=4", "2x4/h=2"])
@pytest.mark.claim("D6")
def test_hpz_holds_2psi_over_h_more_between_forward_and_backward(n, g, h, claim_values):
    """The memory observer sees hpZ hold 2Ψ/h bytes per GPU more than stage 3 when backward
    begins — its secondary fp16 shards — and nothing more once backward is over (D6)."""
    cluster, r = wired(3, n, g, h, steps=2, observe=True, transport="direct")
    hpz_obs = cluster.observed
    obs = wired(3, n, g, steps=2, observe=True, transport="direct")[0].observed
    extra = theory.hpz_secondary_bytes(r.psi_held, h)
    for k in range(n):
        diff = {label: hpz_obs[k].entries[label].bytes - obs[k].entries[label].bytes
                for label in obs[k].entries}
        assert {label: d for label, d in diff.items() if d} == {"backward@1": extra,
                                                                "backward@2": extra}
        assert r.memory[k].peak["secondary16"] == extra
        assert r.memory[k].current["secondary16"] == 0
    claim_values(f"+{int(extra):,} B = 2Ψ/{h} at backward's start, 0 after", "+2M/h (D6)",
                 f"{n // g} × {g}, Ψ = {r.psi_held:,}")


@pytest.mark.parametrize("n,g,h", [(4, 2, 2), (8, 4, 2)], ids=["2x2/h=2", "2x4/h=2"])
def test_hpz_trains_bit_identically_to_stage3(n, g, h):
    """hpZ does no arithmetic: losses and master weights equal stage 3's bit for bit."""
    assert_same_training(wired(3, n, g, h, steps=2, transport="direct")[1],
                         wired(3, n, g, steps=2, transport="direct")[1])


@functools.lru_cache(maxsize=None)
def at_scale(h: int):
    """GPT-2 1.5B, stage 3 on 384 meta GPUs as 48 nodes × 8 (ZeRO++'s 384 V100s)."""
    return measure(TrainConfig(stage=3, n_d=384, model=PRESETS["1.5B"].model,
                               mesh=MeshOptions(gpus_per_node=8, hpz=h)))


@pytest.mark.slow
@pytest.mark.claim("D1")
def test_at_384_gpus_stage3_sends_3M_across_each_node_per_step(claim_values):
    """GPT-2 1.5B on 48 × 8 meta GPUs: node 0's last GPU sends 3M(N−1)/N across per step, and
    that is all node 0 sends across (D1)."""
    base = at_scale(1)
    psi, led = base.psi_padded, base.comm_ledger([7])
    paper = sum(theory.stage3_node_crossing(psi, 384).values())
    assert led.crossing(0) == led.elements(7, link="inter") == paper
    claim_values(f"{led.crossing(0):,} = {float(Fraction(led.crossing(0), psi)):.4f}·Ψ",
                 "3M·(N−1)/N (D1)", "1.5B, 48 × 8 meta GPUs")


@pytest.mark.slow
@pytest.mark.claim("D2")
def test_at_384_gpus_hpz_backward_all_gather_sends_nothing_across(claim_values):
    """The same with hpZ, h = 8: the backward all-gather sends 0 across nodes (D2's hpZ row);
    node 0 sends stage 3's volume less exactly those gathers."""
    led, hled = at_scale(1).comm_ledger([7]), at_scale(8).comm_ledger([7])
    assert hled.elements(7, phase="backward", op="all_gather", link="inter") == 0
    assert hled.crossing(0) == led.crossing(0) - led.elements(7, phase="backward", op="all_gather")
    claim_values("0 backward all-gather elements across", "0 (D2, hpZ)", "1.5B, 48 × 8 meta GPUs")


@pytest.mark.slow
@pytest.mark.claim("D6")
def test_at_384_gpus_hpz_holds_2M_over_8_per_gpu(claim_values):
    """With h = 8 (the GPUs per node) each GPU's ledger holds 2M/8 bytes of secondary shards at
    its peak, 0 after the step; stage 3 none (D6)."""
    base, hpz = at_scale(1), at_scale(8)
    extra = theory.hpz_secondary_bytes(base.psi_padded, 8)
    assert [hpz.memory(r).peak["secondary16"] for r in (0, 7, 383)] == [extra] * 3
    assert hpz.memory(7).current["secondary16"] == 0 == base.memory(7).peak["secondary16"]
    claim_values(f"+{int(extra):,} B per GPU", "2M/(GPUs per node) (D6)", "1.5B, 48 × 8 meta GPUs")


def crossing_table(n: int = 8, g: int = 4) -> str:
    """Per step on n // g nodes × g GPUs (ODD, the ring transport): what each GPU of node 0 sends
    over inter-node links, what the wire saw leave node 0, and D1/D2's figures (M = Ψ)."""
    rows = []
    for label, stage, h in (("DP", 0, 1), ("P_os+g", 2, 1), ("P_os+g+p", 3, 1),
                            (f"P_os+g+p, hpZ h = {g // 2}", 3, g // 2), (f"P_os+g+p, hpZ h = {g}", 3, g)):
        cluster, r = wired(stage, n, g, h)
        led, left, psi = cluster.comm_ledger, cluster.wire.leaving(0), r.psi_held
        paper = theory.stage3_node_crossing(psi, n, hpz=h > 1) if stage == 3 else None
        rows.append([label, *(f"{led.elements(k, link='inter'):,}" for k in range(g)), f"{left:,}",
                     f"{float(Fraction(left, psi)):.4f}Ψ",
                     f"{int(sum(paper.values())):,}" if paper else "",
                     f"{led.crossing(0, phase='backward', op='all_gather'):,}",
                     f"{int(paper['backward all-gather']):,}" if paper else ""])
    return markdown(["run", *(f"GPU {k}" for k in range(g)), "left node 0", "in Ψ",
                     "paper: 3M or 2M, ×(N−1)/N", "backward all-gather across",
                     "paper: M(N−1)/N, hpZ 0"],
                    rows)


def test_crossing_table(md_snapshot):
    """The spec's table: elements across nodes per step, per GPU of node 0 and for the node."""
    assert crossing_table() == md_snapshot
