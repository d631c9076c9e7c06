"""ZeRO++'s quantized collectives (spec/zeropp.md): qwZ's int8 weight all-gathers and qgZ's int4
hierarchical all-to-all, in bytes on the wire (D2's qwZ and qgZ rows, D3), and D1/D2's headline,
3M → 0.75M per node, on meta at 384 GPUs as 48 nodes × 8.

Runs: the ODD model on 2 nodes × 2 and 2 × 4 GPUs over the ring transport, whose wire counts every
hop (ring neighbours, and an all-to-all's point-to-point sends) with its bytes, classed by the
nodes of its two ends. Byte counts are what the quantizers produce: int8 codes (1 B), packed int4
codes (1/2 B) and fp32 scales (4 B a group); DeepSpeed's fall-back units go as fp16.
"""
from __future__ import annotations

import functools
from collections import Counter
from fractions import Fraction

import pytest
import torch

from zerospec.cluster.threads import VirtualCluster
from zerospec.model.gpt import ODD
from zerospec.model.presets import PRESETS
from zerospec.paper import theory
from zerospec.render.format import markdown
from zerospec.training.config import TrainConfig
from zerospec.training.sections import MeshOptions, QuantOptions
from zerospec.training.run import train
from zerospec.training.scale import measure

SHAPES = [(4, 2), (8, 4)]        # (N, GPUs per node): 2 nodes each
SHAPE_IDS = [f"{n // g}x{g}" for n, g in SHAPES]
BIG = "t4-100B-125x8192"         # the 100B shape: its blocks' shards split in whole int4 bytes


def n_scales(c: int) -> int:
    """fp32 scales a row of c elements carries: one per group, the fewest groups of at most 8,000
    elements (DeepSpeed's CUDAQuantizer.target_group_size, runtime/zero/partition_parameters.py),
    ⌈c / 8000⌉."""
    return -(-c // 8000)


def falls_back(u, n: int) -> bool:
    """Whether DeepSpeed's all_to_all_quant_reduce (runtime/comm/coalesced_collectives.py) sends
    unit u's gradient as a plain reduce-scatter over n GPUs: a 1-D tensor (a unit of only 1-D
    parameters: a norm), or one whose size is not a multiple of 2n."""
    return all(len(p.shape) == 1 for p in u.params) or u.padded % (2 * n) != 0


@functools.lru_cache(maxsize=None)
def wired(n: int, g: int, hpz: int = 1, qwz: bool = False, qgz: bool = False):
    """(cluster, Result) of one step of stage 3 on n // g nodes of g GPUs, ring transport."""
    cluster = VirtualCluster(n, transport="ring", gpus_per_node=g)
    cfg = TrainConfig(stage=3, n_d=n, model=ODD, steps=1,
                      mesh=MeshOptions(gpus_per_node=g, hpz=hpz),
                      quant=QuantOptions(qwz=qwz, qgz=qgz))
    return cluster, train(cfg, cluster=cluster)


def left(cluster, node: int = 0) -> Counter:
    """Bytes that left ``node`` on the wire, by (op, dtype): the wire's own records."""
    out: Counter = Counter()
    g = cluster.wire.nodes
    for rec in cluster.wire.records:
        out[rec.op, rec.dtype] += sum(b for (s, d), b in rec.bytes.items()
                                      if g.node(s) == node != g.node(d))
    return out


def ledger_left(led, node: int = 0, **where) -> Counter:
    """The same from the ledger: bytes node ``node``'s GPUs booked on inter links, by (op, dtype)."""
    out: Counter = Counter()
    for r in led.nodes.ranks_of(node):
        for rec in led.records(r, link="inter", **where):
            out[rec.op, rec.dtype] += rec.bytes_sent
    return out


@pytest.mark.parametrize("n,g", SHAPES, ids=SHAPE_IDS)
@pytest.mark.claim("D2")
def test_qwz_halves_the_weight_all_gathers_bytes_across_nodes(n, g, claim_values):
    """qwZ's all-gathers carry int8 codes: exactly half of stage 3's fp16 bytes leave each node
    (D2: M → 0.5M), plus one fp32 scale per group, (N−1)·⌈c/g⌉·4 B per gathered unit; the wire
    and the ledger agree, forward and backward."""
    cluster, r = wired(n, g, qwz=True)
    base, _ = wired(n, g)
    fp16 = ledger_left(base.comm_ledger, op="all_gather")[("all_gather", torch.float16)]
    got, seen = ledger_left(cluster.comm_ledger, op="all_gather"), left(cluster)
    assert got[("all_gather", torch.int8)] * 2 == fp16 > 0
    gathers = Counter(rec.numel for rec in base.comm_ledger.records(n - 1, op="all_gather"))
    scales = sum(times * (n - 1) * n_scales(padded // n) * 4
                 for padded, times in gathers.items())
    assert got[("all_gather", torch.float32)] == scales
    assert {k: v for k, v in seen.items() if v and k[0] == "all_gather"} == got
    m = Fraction(got[("all_gather", torch.int8)], fp16) * 2 * 3      # of stage 3's 2M, in 3M
    claim_values(f"int8 {got[('all_gather', torch.int8)]:,} B = ½ × fp16 {fp16:,} B "
                 f"(+{scales:,} B scales)", "forward all-gather M → 0.5M (D2, qwZ)",
                 f"{n // g} × {g}, both all-gathers ({float(m) / 3:.2f} of fp16)")


def qgz_bytes(units, n: int, g: int) -> dict[str, int]:
    """Bytes qgZ sends out of one node per step, from first principles: each GPU sends (n−1)
    chunks of int4 (c/2 B) and their ⌈c/g_q⌉ fp32 scales across; a fall-back unit goes as stage
    3's fp16 ring reduce-scatter, (N−1)·c·2 B from the node's last GPU."""
    nodes = n // g
    out = Counter()
    for u in units:
        if falls_back(u, n):
            out["fp16 fall-back"] += (n - 1) * u.chunk * 2
        else:
            out["int4"] += g * (nodes - 1) * u.chunk // 2
            out["scales"] += g * (nodes - 1) * n_scales(u.chunk) * 4
    return dict(out)


@pytest.mark.parametrize("n,g", SHAPES, ids=SHAPE_IDS)
@pytest.mark.claim("D2")
@pytest.mark.claim("D3")
def test_qgz_sends_a_quarter_of_the_gradient_bytes_across_spread_over_the_nodes_gpus(n, g,
                                                                                    claim_values):
    """qgZ's all-to-alls carry packed int4: each GPU of a node sends (n−1)/n of its 1/G share
    across, M/(Z·G)·(n−1)/n with Z = 4 (D3), and the node M/Z·(n−1)/n (D2: M → 0.25M), the scales
    on top; the final LayerNorm (all 1-D) falls back to stage 3's fp16 reduce-scatter, counted.
    The wire sees the same bytes leave."""
    cluster, r = wired(n, g, qgz=True)
    led, units = cluster.comm_ledger, r.units
    want = qgz_bytes(units, n, g)
    got = ledger_left(led, phase="backward")
    assert {"int4": got[("all_to_all", torch.uint8)], "scales": got[("all_to_all", torch.float32)],
            "fp16 fall-back": got[("reduce_scatter", torch.float16)]} == want
    assert [u.name for u in units if falls_back(u, n)] == ["ln_f"]
    quantized = sum(u.padded for u in units if not falls_back(u, n))
    assert want["int4"] == 2 * theory.zeropp_node_crossing(quantized, n, g, qgz=True)[
        "reduce-scatter"]                                        # bytes = 2 × fp16 elements
    per_gpu = [sum(rec.bytes_sent for rec in led.records(k, op="all_to_all", link="inter")
                   if rec.dtype == torch.uint8) for k in range(g)]
    assert per_gpu == [2 * theory.qgz_crossing_per_gpu(quantized, n, g)] * g   # every GPU alike
    assert left(cluster)[("all_to_all", torch.uint8)] == want["int4"]
    claim_values(f"int4 {want['int4']:,} B per node = {Fraction(want['int4'], 2 * quantized)}·M "
                 f"(fp16 elements), {per_gpu[0]:,} B from each of its {g} GPUs",
                 "M → 0.25M ×(n−1)/n; per GPU M/(Z·G) ×(n−1)/n (D2, D3)",
                 f"{n // g} × {g}, M = the quantized units")


@pytest.mark.parametrize("n,g", SHAPES, ids=SHAPE_IDS)
@pytest.mark.claim("D2")
def test_every_quantized_hop_is_booked_on_the_link_class_the_wire_saw(n, g):
    """With hpZ, qwZ and qgZ together, per sender, collective, dtype and link class the ledger's
    bytes equal the wire's: the node's all-to-all on intra links, the cross-node one on inter."""
    cluster, _ = wired(n, g, hpz=g, qwz=True, qgz=True)
    led, wire = cluster.comm_ledger, cluster.wire
    seen, booked = Counter(), Counter()
    for rec in wire.records:
        for (src, dst), b in rec.bytes.items():
            seen[src, rec.op, rec.dtype, "intra" if src // g == dst // g else "inter"] += b
    for rec in led.records():
        if rec.bytes_sent:
            booked[rec.rank, rec.op, rec.dtype, rec.link] += rec.bytes_sent
    assert booked == seen
    assert {(r.group, r.link) for r in led.records(op="all_to_all")} == {("local", "intra"),
                                                                          ("global", "inter")}


# -- D1/D2's headline at the paper's scale ----------------------------------------------------------
@functools.lru_cache(maxsize=None)
def at_scale(**kw):
    """The 100B shape, stage 3 on 384 meta GPUs as 48 nodes × 8, node 0's 8 GPUs booked. Node 0
    is what these tests read, and its GPUs are all of the first rank class (ranks 0–380: the
    last three ranks' shards hold padding), so that class alone is stepped (``measure(only=0)``)."""
    r = measure(TrainConfig.of(stage=3, n_d=384, model=PRESETS[BIG].model, gpus_per_node=8, **kw),
                only=0)
    return r, r.comm_ledger(range(8))


def last_rank():
    """Plain stage 3 of :func:`at_scale`, its last rank class (rank 383's) alone."""
    return measure(TrainConfig.of(stage=3, n_d=384, model=PRESETS[BIG].model, gpus_per_node=8),
                   only=at_scale()[0].class_count - 1)


def headline() -> list[dict]:
    """Per collective, node 0's cross-node bytes / 2 in M (fp16 elements; M = Ψ padded), as each
    of ZeRO++'s pieces is added; then what of the last column is neither int8 nor int4."""
    psi = at_scale()[0].psi_padded
    rows = {"forward all-gather": dict(phase="forward", op="all_gather"),
            "backward all-gather": dict(phase="backward", op="all_gather"),
            "gradient reduce-scatter": dict(phase="backward")}
    runs = {"ZeRO-3": at_scale()[1], "+ hpZ": at_scale(hpz=8)[1],
            "+ hpZ + qwZ": at_scale(hpz=8, qwz=True)[1],
            "+ hpZ + qwZ + qgZ": at_scale(hpz=8, qwz=True, qgz=True)[1]}
    paper = {"forward all-gather": ("M", "0.5M"), "backward all-gather": ("M", "0"),
             "gradient reduce-scatter": ("M", "0.25M"), "total": ("3M", "0.75M")}
    out = []
    for name, where in list(rows.items()) + [("total", {})]:
        row = {"collective": name}
        for run, led in runs.items():
            b = led.crossing_bytes(0, **where)
            if name == "gradient reduce-scatter":
                b -= led.crossing_bytes(0, phase="backward", op="all_gather")
            row[run] = Fraction(b, 2 * psi)
        row["paper: ZeRO"], row["paper: ZeRO++"] = paper[name]
        out.append(row)
    last = runs["+ hpZ + qwZ + qgZ"]
    extra = Counter()
    for r in range(8):
        for rec in last.records(r, link="inter"):
            if rec.dtype == torch.float32:
                extra["of which fp32 scales"] += rec.bytes_sent
            elif rec.dtype == torch.float16:
                extra["of which fp16 fall-back units (embed, ln_f)"] += rec.bytes_sent
    for name, b in extra.items():
        out.append({"collective": name, **{run: "" for run in runs}})
        out[-1]["+ hpZ + qwZ + qgZ"] = Fraction(b, 2 * psi)
        out[-1]["paper: ZeRO"] = out[-1]["paper: ZeRO++"] = ""
    return out


@pytest.mark.slow
@pytest.mark.claim("D1")
@pytest.mark.claim("D2")
def test_at_384_gpus_zeropp_cuts_3M_to_0_75M_across_each_node(md_snapshot, claim_values):
    """The 100B shape on 48 × 8 meta GPUs: node 0 sends 3M(N−1)/N across with ZeRO-3 (D1); with
    hpZ + qwZ + qgZ exactly half of stage 3's forward all-gather bytes (int8), none of its
    backward ones, and qgZ's int4 from all 8 GPUs, plus the fp32 scales and the two units that
    fall back to fp16 (embed, ln_f), each counted from first principles (D2: 0.75M)."""
    base, led = at_scale()
    psi, units = base.psi_padded, base.units
    assert led.crossing_bytes(0) == 2 * sum(theory.stage3_node_crossing(psi, 384).values())
    zpp = at_scale(hpz=8, qwz=True, qgz=True)[1]
    got = ledger_left(zpp)
    fwd16 = ledger_left(led, phase="forward")[("all_gather", torch.float16)]
    assert got[("all_gather", torch.int8)] * 2 == fwd16          # qwZ: 1 B for 2
    gathers = Counter(rec.numel for rec in last_rank().comm_ledger([383]).records(
        383, op="all_gather", phase="forward"))
    scales = sum(times * 383 * n_scales(p // 384) * 4
                 for p, times in gathers.items())
    want = qgz_bytes(units, 384, 8)
    assert {k: v for k, v in got.items() if v} == {
        ("all_gather", torch.int8): fwd16 // 2, ("all_gather", torch.float32): scales,
        ("all_to_all", torch.uint8): want["int4"],
        ("all_to_all", torch.float32): want["scales"],
        ("reduce_scatter", torch.float16): want["fp16 fall-back"]}
    quantized = sum(u.padded for u in units if not falls_back(u, 384))
    assert want["int4"] == 2 * theory.zeropp_node_crossing(quantized, 384, 8, qgz=True)[
        "reduce-scatter"]
    rows = headline()
    assert rows[1]["+ hpZ"] == 0 == rows[1]["+ hpZ + qwZ + qgZ"]
    cells = [[v if isinstance(v, str) else f"{float(v):.4f}M" for v in row.values()] for row in rows]
    assert markdown(list(rows[0]), cells) == md_snapshot
    total = rows[3]
    claim_values(f"{float(total['ZeRO-3']):.4f}M → {float(total['+ hpZ + qwZ + qgZ']):.4f}M per "
                 f"node ({float(total['ZeRO-3'] / total['+ hpZ + qwZ + qgZ']):.2f}×)",
                 "3M → 0.75M, 4× (D1, D2)", "100B shape, 48 × 8 meta GPUs")


# -- spec/figures/zeropp_node_bytes.svg: bytes inside vs across nodes, per collective ---------------
def figure_runs():
    """The figure's runs (zerospec/plan/nodes.py FIGURE_RUNS) on the measurements above."""
    from zerospec.plan import nodes
    assert (nodes.FIGURE_MODEL, nodes.FIGURE_GPUS, nodes.FIGURE_PER_NODE) == (BIG, 384, 8)
    return nodes.figure_runs(lambda **kw: at_scale(**kw)[0])


@pytest.mark.slow
@pytest.mark.claim("D1")
@pytest.mark.claim("D2")
@pytest.mark.claim("M3")
def test_bytes_inside_and_across_nodes_per_collective_at_384_gpus(md_snapshot):
    """What spec/figures/zeropp_node_bytes.svg draws, at 48 × 8 meta GPUs: node 0's bytes per
    collective inside and across, for ZeRO-3, hpZ, qwZ, qgZ, all three and MiCS; each across
    column is the ledger's crossing_bytes, hpZ's backward and MiCS's gathers cross nothing."""
    from zerospec.plan.nodes import FIGURE_RUNS, markdown as node_markdown
    runs = figure_runs()
    for name, nb in runs.items():
        led = at_scale(**FIGURE_RUNS[name])[1]
        assert nb.across() == led.crossing_bytes(0)
        assert nb.node_total("forward all-gather", "inter") == led.crossing_bytes(
            0, phase="forward", op="all_gather")
        assert nb.inside() == sum(led.bytes(r, link="intra") for r in range(8))
    zero3, hpz, qwz, mics = runs["ZeRO-3"], runs["hpZ h = 8"], runs["qwZ"], runs["MiCS p = 8"]
    assert zero3.node_total("backward all-gather", "inter") > 0
    assert hpz.node_total("backward all-gather", "inter") == 0 < hpz.node_total(
        "backward all-gather", "intra")
    # qwZ: int8 codes, half of stage 3's fp16 bytes, plus fp32 scales: over half, under 0.51
    f3, fq = (nb.node_total("forward all-gather", "inter") for nb in (zero3, qwz))
    assert f3 // 2 < fq < f3 * 51 // 100
    assert runs["qgZ"].across() < zero3.across()
    assert {c for c in mics.sent if mics.node_total(c, "inter")} == {"replica all-reduce (MiCS)"}
    # M2's 2(R−1)/R·Ψ/p per GPU, R = 48. A ring all-reduce of S elements cut into R near-equal
    # chunks c_i (the first S mod R one larger) has ring index i send every chunk but c_i in the
    # reduce-scatter and every chunk but c_(i+1) in the all-gather: 2S − c_i − c_(i+1). Node 0's
    # GPU k is index 0 of its replica ring (k, k + 8, …), S = a unit's padded shard over p = 8:
    # exactly this, per unit. Against the mean 2(R−1)S/R it differs by 2S/R − c_0 − c_1, and each
    # c_i lies within one element of S/R: under 2 elements per unit and GPU, 8·units·2·2 bytes.
    got, units = mics.node_total("replica all-reduce (MiCS)", "inter"), at_scale()[0].units
    mics_units = at_scale(shard_group=8)[0].units
    chunk = lambda s, i: s // 48 + (i < s % 48)      # noqa: E731
    assert got == sum(8 * 2 * (2 * s - chunk(s, 0) - chunk(s, 1))
                      for s in (u.padded // 8 for u in mics_units))
    assert abs(got - 8 * 2 * theory.mics_replica_all_reduce(mics.psi_padded, 384, 8)) \
        < 8 * len(units) * 2 * 2
    assert node_markdown(runs) == md_snapshot
