"""The evaluation (§10) in simulation: Table 3's configurations, throughput, cached memory.

Each configuration (C1–C5, zerospec/evaluation/configs.py) runs the stage code on meta tensors at the
paper's shapes; model sizes come from a memory-fit search over those steps' measured peaks, and
throughput from the measured FLOPs and collectives through the spec-sheet machine model
(zerospec/paper/hardware.py, zerospec/evaluation/timing.py). spec/evaluation.md shows the tables and
says where, and why, they part from the paper.
"""
from __future__ import annotations

import functools

import pytest

from zerospec.model.presets import gpt
from zerospec.paper import evaluation as ev
from zerospec.paper import theory
from zerospec.paper.hardware import DGX2
from zerospec.evaluation import tables as pf
from zerospec.evaluation import runs as pr
from zerospec.evaluation.configs import BUCKET_ELEMENTS, CONFIGS
from zerospec.training.scale import measure
from zerospec.training.config import TrainConfig
from tools import specfigures

PAGE = "spec/evaluation.md"


# -- C46: Table 3 --------------------------------------------------------------------------------------
TABLE3_MODEL = gpt(4, 8192, 64)    # Ψ = 3,641,761,792: 5 buckets of B per MP rank's gradient stream
N_D, N_M = 2, 2


@functools.lru_cache(maxsize=None)
def table3_step(name: str):
    """One step of ``name`` for 4 blocks of 8192 on a 2 × 2 grid (N_d × N_m), 2 sequences: large
    enough that C_B's buckets fill (a model whose stream fits one bucket never tests the bound)."""
    return measure(TrainConfig.of(stage=CONFIGS[name].stage, n_d=N_D, model=TABLE3_MODEL,
                                  **CONFIGS[name].kwargs(n_m=N_M)), micro_batch=2, trace=True)


@pytest.mark.claim("C46")
def test_each_table3_configuration_runs_the_zero_dp_stage_and_zero_r_options_it_names(
        claim_values):
    """Table 3: C1/C2 partition optimizer states (P_os: every rank holds all fp16 gradients), C3–C5
    also gradients; C_B fuses collectives into buckets of B; P_a keeps 1/N_m of each checkpoint
    per GPU; P_a+cpu keeps none on the GPU and that 1/N_m on the host; M_D copies checkpoints into
    one buffer (C46): the device's allocation trace shows one checkpoint allocation per step
    holding them all, where the 4 blocks would make 4. Read off each preset's own ledgers, on a
    model whose gradient stream needs at least 3 buckets: every bucket but the last is full, and
    none is larger."""
    peak = {n: table3_step(n).memory(0).peak for n in CONFIGS}
    states = {n: table3_step(n).model_states(0) for n in CONFIGS}
    host = {n: table3_step(n).host(0).peak.get("checkpoints", 0) for n in CONFIGS}
    whole = peak["C1"]["checkpoints"]
    grad_share = peak["C1"]["param16"] // 2            # the fp16 gradient's (N_d − 1)/N_d at N_d = 2
    assert states["C1"] == states["C2"] == states["C3"] + grad_share
    assert states["C3"] == states["C4"] == states["C5"]
    assert [peak[n]["checkpoints"] for n in CONFIGS] == [whole, whole // 2, whole, whole // 2, 0]
    assert [host[n] for n in CONFIGS] == [0, 0, 0, 0, whole // 2]
    # C_B: per stream of T = Σ chunk columns, ⌈T / ⌊B/N_d⌋⌉ reduce-scatters (gradients) and as many
    # all-gathers (parameters after the step), each bucket N_d·⌊B/N_d⌋ fp16 elements at most
    buckets = {}
    for n in CONFIGS:
        r = table3_step(n)
        columns = sum(u.chunk for u in r.units)
        buckets[n] = theory.bucket_collectives(columns, BUCKET_ELEMENTS, N_D)
        assert peak[n]["bucket"] == 2 * N_D * (BUCKET_ELEMENTS // N_D), n
        led = r.comm_ledger([0])
        assert led.by_op(0, group="dp") == {"reduce_scatter": columns, "all_gather": columns}  # ring, N_d = 2
        assert led.count(0, group="dp") == 2 * buckets[n], n
        made = [e.nbytes for e in r.memory(0).trace if e.op == "alloc" and e.category == "checkpoints"]
        assert made == ([peak[n]["checkpoints"]] if peak[n]["checkpoints"] else []), n   # M_D: one buffer
    assert min(buckets.values()) >= 3
    claim_values("; ".join(f"{c.name} {'P_os' if c.stage == 1 else 'P_os+g'} + {c.zero_r}"
                           for c in CONFIGS.values())
                 + f" ({min(buckets.values())} buckets of B per gradient stream)",
                 "Table 3 (C46)", "meta, 2 × 2 grid, 4 × 8192")


# -- C49: 170B needs C5 ----------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def peak_170b(name: str) -> int:
    """Highest peak of any rank: 170B (212 × 8192, 64 heads), 400 GPUs, MP 16, 12 per GPU. C5's
    step is Figure 2's 170B row (pr.FIGURE2_CONFIG): its peak is pr.peak's, rank 0's class read
    from the row's counted step (counting changes no byte: tests/unit/evaluation/test_timing.py)
    and the other class stepped for it."""
    run = next(r for r in ev.FIGURE8 if r.size == "170B")
    if name == pr.FIGURE2_CONFIG[run.size]:
        return pr.peak(run, config=name)
    r = measure(TrainConfig.of(stage=CONFIGS[name].stage, n_d=run.n_d,
                               model=gpt(run.layers, run.hd, run.heads),
                               **CONFIGS[name].kwargs(run.mp)), micro_batch=run.batch_per_gpu)
    return max(c.memory.peak_total for c in r.classes)


@pytest.mark.slow   # five 212-layer meta steps: ~15 s
@pytest.mark.claim("C49")
def test_170b_at_its_appendix_batch_fits_32_gb_only_with_p_a_cpu(claim_values):
    """Figure 8: C5 (P_a+cpu) is needed for the 170B model to run at all — C1–C4 peak above
    32 GB at its appendix batch of 12, C5 below (C49)."""
    peaks = {n: peak_170b(n) for n in CONFIGS}
    assert [n for n in CONFIGS if peaks[n] <= DGX2.memory_bytes] == ["C5"]
    claim_values(", ".join(f"{n} {p / 1e9:.1f} GB" for n, p in peaks.items()),
                 "only C5 runs 170B (C49)", "400 GPUs, MP 16, batch 12, meta")


@pytest.mark.slow   # the same five steps, cached when the claim test ran first
def test_170b_peaks_table(md_snapshot):
    """spec/evaluation.md's 170B row per configuration: the highest measured peak of any rank."""
    rows = ["| config | 170B, 12 per GPU: highest peak (B) | fits 32 GB |", "|---|---|---|"]
    rows += [f"| {n} | {peak_170b(n):,} | {'yes' if peak_170b(n) <= DGX2.memory_bytes else 'no'} |"
             for n in CONFIGS]
    assert md_snapshot == "\n".join(rows)


# -- C41: the 100B run's throughput ------------------------------------------------------------------------
FIG2 = ("1.5B", "8B", "40B", "100B")


def figure2_time(size: str, overlap: str):
    """(the run, its ZeRO step timed on the DGX-2 model with ``overlap``): C4, or C3 at MP 1."""
    (z, _), = pr.figure2((size,))
    return z.run, {"none": z.none, "backward": z.overlap}[overlap]


@pytest.mark.slow   # the 100B step with FLOPs: ~3 s
@pytest.mark.claim("C41", status="modelled_differs", page=f"{PAGE}#throughput-figure-2-c41")
def test_100b_on_400_gpus_is_timed_above_38_tflops_per_gpu_and_15_pflops(claim_values):
    """100B on 400 GPUs runs at over 38 TFLOPS per GPU, over 15 PFLOPS in all (C41). The model,
    a per-op roofline (each op at the slower of its FLOPs at a published 83/125 of peak and its
    bytes at HBM's spec-sheet 900 GB/s; no launch gaps or stragglers), gives more: an upper
    bound, 1.3–1.4× the paper's."""
    for overlap in ("none", "backward"):
        run, t = figure2_time("100B", overlap)
        assert t.tflops_per_gpu > ev.TFLOPS_PER_GPU_100B
        assert t.tflops_per_gpu * run.gpus > ev.AGGREGATE_PFLOPS * 1000
    (_, none), (_, over) = figure2_time("100B", "none"), figure2_time("100B", "backward")
    claim_values(f"{none.tflops_per_gpu:.1f} TFLOPS/GPU (no overlap), {over.tflops_per_gpu:.1f} "
                 f"(backward overlap)", "over 38 TFLOPS/GPU, over 15 PFLOPS (C41)",
                 "100B, 400 GPUs, MP 16, batch 32, DGX-2 model")


@pytest.mark.slow
def test_figure2_throughput_table(md_snapshot):
    """spec/evaluation.md's throughput table for four of Figure 2's ZeRO rows: the measured FLOPs
    per GPU (exact) and the model's seconds and TFLOPS (pure-Python doubles from integers and
    spec-sheet constants, printed to 3 and 1 decimals: the same on every machine)."""
    assert md_snapshot == pf.bare(pf.figure2_detail(FIG2))


# -- C38, C41, C42, C53: the Megatron-LM baseline -------------------------------------------------------------
def baseline(size: str):
    """Figure 2's baseline row ``size`` (stage 0 over its N_d × MP grid), measured and timed."""
    (_, b), = pr.figure2((size,))
    return b


@pytest.mark.slow   # two meta steps with FLOPs: ~2 s
@pytest.mark.claim("C38", status="modelled_differs",
                   page=f"{PAGE}#the-megatron-lm-baseline-c38-c42-c53")
def test_megatron_40b_over_two_nodes_falls_to_about_5_tflops_only_read_as_one_ib_link(
        claim_values):
    """Megatron-LM's 40B across two DGX-2 nodes runs at about 5 TFLOPS per GPU, against near 30
    inside a node (C38). Timed with a ring leaving the node paced by one 12.5 GB/s link (C42's
    reading), the 40B baseline (MP 32) falls within 2× of 5 and over 2.5× below the 20B's (MP
    16, one node); with all 8 of the node's links it keeps over 15 TFLOPS: no collapse.

    The lower side is derived: the model takes every resource at its spec-sheet peak and leaves
    out launches and stragglers, so it can only time a step faster than it ran — at least the
    paper's "about 5", which to its one figure is 4.5. The upper side is not: how much faster the
    model may be is the ratio of one IB link's 12.5 GB/s to what NCCL 2.4.8 achieved on it, which
    neither the paper nor the spec sheet gives; 2× is the page's reading (spec/evaluation.md)."""
    inside, across = baseline("20B"), baseline("40B")
    assert (inside.run.mp, across.run.mp) == (16, 32)          # one node; two nodes
    about = ev.MEGATRON_40B_TFLOPS
    assert about - 0.5 <= across.link.tflops_per_gpu <= about * 2
    assert inside.link.tflops_per_gpu / across.link.tflops_per_gpu > 2.5
    assert across.none.tflops_per_gpu > 15
    claim_values(f"40B over 2 nodes: {across.link.tflops_per_gpu:.1f} TFLOPS/GPU (one IB link), "
                 f"{across.none.tflops_per_gpu:.1f} (8 links); 20B in a node: "
                 f"{inside.none.tflops_per_gpu:.1f}", "about 5 over 2 nodes, near 30 in one (C38)",
                 "Megatron-LM as stage 0 with MP, DGX-2 model")


@pytest.mark.slow   # Figure 2's ten baseline steps with FLOPs: ~10 s
@pytest.mark.claim("C42", status="modelled_differs",
                   page=f"{PAGE}#the-megatron-lm-baseline-c38-c42-c53")
def test_once_mp_crosses_a_node_the_baselines_mp_all_reduces_take_most_of_its_step(claim_values):
    """The baseline slows down because MP across nodes drops from NVSwitch (300 GB/s, both ways)
    to 12.5 GB/s per InfiniBand link (C42). Measured traffic, timed: with MP ≤ 16 (one node)
    the MP all-reduces take under a quarter of each baseline step; with MP ≥ 32 and one link per
    ring, over two thirds; with all 8 links the 40B row (MP 32) spends under 40% there — at two
    nodes the drop is the paper's only if a ring gets one link. (The bar was 70% while compute
    timed GEMMs only; the per-op roofline's memory-bound ops lengthen the step, and 40B's share
    is now 69%.)"""
    rows = [b for _, b in pr.figure2()]
    share = {b.run.size: (b.none.comm_s.get("mp", 0) / b.none.step_s,
                          b.link.comm_s.get("mp", 0) / b.link.step_s) for b in rows}
    inside = [b.run.size for b in rows if b.run.mp <= DGX2.gpus_per_node]
    across = [b.run.size for b in rows if b.run.mp > DGX2.gpus_per_node]
    assert inside == ["1.5B", "8B", "20B"] and across[0] == "40B"
    assert all(share[s][1] < 0.25 for s in inside) and all(share[s][1] > 2 / 3 for s in across)
    assert share["40B"][0] < 0.4
    claim_values(", ".join(f"{s} {share[s][1]:.0%}" for s in inside + across)
                 + f" of the step in MP (one IB link); 40B {share['40B'][0]:.0%} with 8 links",
                 "300 GB/s NVSwitch → 12.5 GB/s per IB link (C42)", "DGX-2 model")


@pytest.mark.slow   # Figure 2's twenty steps with FLOPs: ~40 s
@pytest.mark.claim("C41", status="modelled_differs",
                   page=f"{PAGE}#the-megatron-lm-baseline-c38-c42-c53")
def test_zero_outruns_the_baseline_at_every_size_by_more_as_models_grow(claim_values):
    """ZeRO is "up to 10×" faster than the Megatron-LM baseline (C41). Timed per GPU at every
    Figure 2 size, ZeRO is faster everywhere and its lead grows from 1.5B to 100B, where it is
    5–20× with all 8 IB links per node; the largest ratio, at 170B (the baseline at MP 256 over
    16 nodes), is above the paper's 10×, and larger still with one link per ring. (With the LM
    head replicated the baseline's TFLOPS counted every MP rank's copy of its FLOPs: 14.4× then.)

    At 100B the ratio has a derived ceiling. Both sides are timed faster than they ran (every
    resource at its spec-sheet peak), so modelled ZeRO / modelled baseline ≤ (modelled ZeRO /
    real ZeRO) × (real ZeRO / real baseline) ≤ (modelled ZeRO / 38) × 10: ZeRO-100B ran at over
    38 TFLOPS and at most 10× the baseline. Its floor is only the paper's > 1: how much the model
    speeds the baseline's IB-bound all-reduces is not on the spec sheet."""
    rows = pf.figure2()[0].rows
    node = {r[0]: r[9] for r in rows}
    link = {r[0]: r[10] for r in rows}
    zero = {r[0]: r[3] for r in rows}                    # ZeRO's modelled TFLOPS per GPU
    sizes = list(node)
    assert all(v > 1 for v in node.values()) and all(v > 1 for v in link.values())
    assert node["1.5B"] < node["8B"] < node["20B"] < node["40B"] < node["60B"] < node["100B"]
    ceiling = zero["100B"] / ev.TFLOPS_PER_GPU_100B * ev.SPEEDUP_OVER_BASELINE
    assert node["100B"] <= ceiling and max(node, key=node.get) == "170B"
    assert link["100B"] > ceiling    # one link per ring times the 100B baseline slower than it ran
    assert max(node.values()) > 10 and max(link.values()) > max(node.values())
    claim_values(f"up to {max(node.values()):.1f}× ({max(node, key=node.get)}; 8 IB links), "
                 f"{max(link.values()):.1f}× (one link per ring), over {len(sizes)} sizes",
                 "up to 10× (C41)", "Figure 2's rows, DGX-2 model")


@pytest.mark.slow
def test_figure2_baseline_table(md_snapshot):
    """spec/evaluation.md's Figure 2 table: ZeRO and the baseline per size at their appendix
    runs, both readings of the node's InfiniBand (TFLOPS and ratios to 1 decimal)."""
    assert md_snapshot == pf.bare(pf.figure2()[0])


@pytest.mark.slow
def test_figure2_baseline_mp_share_table(md_snapshot):
    """spec/evaluation.md's C42 table: per baseline row, the share of its step the MP all-reduces
    take under both readings of the node's InfiniBand (the model's seconds, to a percent)."""
    rows = ["| model | baseline run | MP over nodes | MP all-reduces' share of the step "
            "| the same, one IB link |", "|---|---|---|---|---|"]
    for _, b in pr.figure2():
        share = [t.comm_s.get("mp", 0) / t.step_s for t in (b.none, b.link)]
        rows.append(f"| {b.run.size} | {b.run.gpus} × MP {b.run.mp} "
                    f"| {'yes' if b.run.mp > DGX2.gpus_per_node else 'no'} "
                    f"| {share[0]:.0%} | {share[1]:.0%} |")
    assert md_snapshot == "\n".join(rows)


@pytest.mark.slow   # the 170B baseline with FLOPs: ~2 s
@pytest.mark.claim("C53", status="closed_form")
def test_the_baselines_run_at_a_multiple_of_their_mp_and_the_170b_one_moves_no_dp_bytes(
        claim_values):
    """The baselines ran on 384 or 256 GPUs, a multiple of their MP degree; the 170B baseline at
    MP 256 has N_d = 1, so no DP communication (C53). Each baseline row ran as an N_d × MP grid
    of exactly its GPUs, and the 170B one's ledger books not one DP byte. A closed form, though
    the steps run: N_d = GPUs // MP is how the grid is built, the GPU counts are the paper's, and
    a ring of one moves (N−1)/N·S = 0."""
    rows = [baseline(s) for s in ("40B", "170B")]
    for b in rows:
        cfg = pr.step(b.run, "baseline").config
        assert cfg.n_d * cfg.n_m == b.run.gpus in (384, 256)
    r170 = pr.step(rows[1].run, "baseline")
    records = r170.comm_ledger([0]).records(0)
    dp = [x for x in records if x.group in ("dp", "world")]     # booked, over a group of one
    assert {x.group_size for x in dp} == {1} and sum(x.bytes_sent + x.bytes_recv for x in dp) == 0
    assert sum(x.bytes_sent for x in records if x.group == "mp") > 0
    assert rows[1].none.comm_s.get("dp", 0) == 0
    claim_values(f"40B on {rows[0].run.gpus} GPUs ({rows[0].run.n_d} × {rows[0].run.mp}); 170B on "
                 f"{rows[1].run.gpus} (1 × 256): 0 DP bytes in {len(dp)} DP collectives",
                 "384 or 256 GPUs; 170B baseline has no DP communication (C53)", "meta")


# -- C43: Figure 3, super-linear scaling -------------------------------------------------------------------
@pytest.mark.slow   # four 75-layer meta steps with FLOPs: ~5 s
@pytest.mark.claim("C43", status="modelled_differs", page=f"{PAGE}#super-linear-scaling-figure-3-c43")
def test_60b_throughput_more_than_doubles_from_64_to_128_gpus_but_not_from_128_to_256(
        claim_values):
    """Figure 3: from 64 to 400 GPUs, performance "more than doubles" when the GPU count doubles,
    because a larger N_d frees memory for a larger batch (C43). Timed on the DGX-2 model: 64 → 128
    GPUs (batch 16 → 48) gives more than twice the aggregate throughput, and 256 → 400 more than
    the GPUs' 1.5625×; but 128 → 256, at the same batch of 48, gives slightly under 2×."""
    agg = [x.none.tflops_per_gpu * x.run.gpus for x in pr.figure3()]
    per_gpu = [x.none.tflops_per_gpu for x in pr.figure3()]
    assert agg[1] / agg[0] > 2 and agg[3] / agg[2] > 400 / 256
    assert agg[2] / agg[1] < 2 and per_gpu[3] > per_gpu[0]
    claim_values(f"aggregate ×{agg[1] / agg[0]:.2f}, ×{agg[2] / agg[1]:.2f}, ×{agg[3] / agg[2]:.2f} "
                 f"(GPUs ×2, ×2, ×1.56)", "more than doubles per doubling, 64–400 GPUs (C43)",
                 "60B, MP 16, C4, DGX-2 model")


@pytest.mark.slow
def test_figure3_table(md_snapshot):
    """spec/evaluation.md's Figure 3 table: the measured peak and FLOPs per GPU (exact), and the
    model's seconds and TFLOPS (pure-Python doubles, printed to 3 and 1 decimals)."""
    assert md_snapshot == pf.bare(pf.figure3()[0])


@pytest.mark.slow
def test_figure3_growth_table(md_snapshot):
    """spec/evaluation.md's C43 table: from each GPU count to the next, how the GPUs, the batch
    per GPU and the aggregate throughput grow (ratios to 2 decimals)."""
    rows = ["| GPUs | × GPUs | batch/GPU | × aggregate TFLOPS |", "|---|---|---|---|"]
    xs = pr.figure3()
    for a, b in zip(xs, xs[1:]):
        grow = b.none.tflops_per_gpu * b.run.gpus / (a.none.tflops_per_gpu * a.run.gpus)
        rows.append(f"| {a.run.gpus} → {b.run.gpus} | {b.run.gpus / a.run.gpus:.2f} "
                    f"| {a.run.batch_per_gpu} → {b.run.batch_per_gpu} | {grow:.2f} |")
    assert md_snapshot == "\n".join(rows)


# -- C44: Figure 4, data parallelism alone -----------------------------------------------------------------
@pytest.mark.slow   # eleven steps with FLOPs at N_d = 128 and three fit searches: ~25 s
@pytest.mark.claim("C44", status="modelled_differs",
                   page=f"{PAGE}#data-parallelism-alone-figure-4-c44-c5-c55")
def test_dp_alone_zero_trains_13b_above_40_tflops_where_stage_0_stops_below_2b(claim_values):
    """Figure 4: without MP, ZeRO trains up to 13B on 128 GPUs at over 40 TFLOPS/GPU on
    average; the baseline tops out at 1.4B (C44). Measured: every ZeRO row (P_os+g, C_B, M_D)
    fits 32 GB at its appendix batch, averaging over 40 TFLOPS/GPU under either IB reading;
    ZeRO's fit in the 13B family is 13–15B; stage 0 fits none of the rows from 2.5B up at any
    batch, and its own fits stop below 2B — above the paper's 1.4B, and its 1.16B row runs far
    above the paper's 20 TFLOPS (the model has no small-GEMM inefficiency)."""
    rows = pr.figure4_rows()
    zero = [x for x in rows if x.how == "zero"]
    assert all(x.fits for x in rows)
    for reading in ("none", "link"):
        assert sum(getattr(x, reading).tflops_per_gpu for x in zero) / len(zero) > 40
    assert [pr.baseline_batch(x.run) for x in zero if x.run.params >= 2.5 * ev.B] == [0] * 8
    z, *base = pr.figure4_limits()
    assert 13 * ev.B <= z.psi <= 15 * ev.B and all(ev.B < b.psi < 2 * ev.B for b in base)
    avg = sum(x.none.tflops_per_gpu for x in zero) / len(zero)
    claim_values(f"ZeRO fits {z.psi / 1e9:.1f}B (13B family) at {avg:.1f} TFLOPS/GPU on average; "
                 f"stage 0 fits {', '.join(f'{b.psi / 1e9:.2f}B' for b in base)}",
                 "ZeRO 13B at > 40 TFLOPS/GPU; baseline 1.4B, < 20 TFLOPS/GPU (C44)",
                 "128 GPUs, no MP, meta, DGX-2 model")


@pytest.mark.slow
def test_figure4_tables(md_snapshot):
    """spec/evaluation.md's Figure 4 tables: each appendix row's Ψ, peak (exact), TFLOPS and
    stage 0's largest batch; the largest layer count each fits by fit.largest."""
    assert md_snapshot == "\n\n".join(pf.bare(t) for t in pf.figure4())


@pytest.mark.slow
def test_figure4_zero_mean_table(md_snapshot):
    """spec/evaluation.md's C44 average: ZeRO's rows of Figure 4, mean TFLOPS per GPU under both
    readings of the node's InfiniBand (the paper: over 40)."""
    zero = [x for x in pr.figure4_rows() if x.how == "zero"]
    mean = [sum(getattr(x, k).tflops_per_gpu for x in zero) / len(zero) for k in ("none", "link")]
    assert md_snapshot == "\n".join([
        "| ZeRO's rows | mean TFLOPS/GPU | mean TFLOPS/GPU, one IB link |", "|---|---|---|",
        f"| {len(zero)} | {mean[0]:.1f} | {mean[1]:.1f} |"])


# -- C49: Figure 8, throughput per configuration -----------------------------------------------------------
@pytest.mark.slow   # five 75-layer meta steps with FLOPs: ~5 s
@pytest.mark.claim("C49", status="modelled_differs",
                   page=f"{PAGE}#throughput-per-configuration-figure-8-c49")
def test_60b_throughput_per_configuration_follows_its_batch_and_c5_loses_to_c4(claim_values):
    """Figure 8: throughput follows the batch each configuration's memory allows, and C4 → C5
    loses throughput on the 60B model (C49). Timed on the DGX-2 model at the appendix batches,
    with or without overlap, each step C1 → C2 → C3 gains, and C4 → C5 loses, over a fifth: the
    step's DP traffic is the same at every batch, so a larger batch spreads it over more FLOPs.
    But C3's batch of 32 peaks far above 32 GB here: without P_a, its 75 checkpoints alone are
    40 GB."""
    f = pr.figure8()
    for k in ("none", "overlap"):
        tf = {n: getattr(f[n], k).tflops_per_gpu for n in CONFIGS}
        assert min(tf["C2"] / tf["C1"], tf["C3"] / tf["C2"], tf["C4"] / tf["C5"]) > 1.2
    assert f["C3"].peak > DGX2.memory_bytes >= max(f[n].peak for n in ("C1", "C2", "C4", "C5"))
    claim_values(", ".join(f"{n} {f[n].none.tflops_per_gpu:.1f}" for n in CONFIGS)
                 + " TFLOPS/GPU; C3 peaks at " + f"{f['C3'].peak / 1e9:.1f} GB",
                 "gains track memory; C4 → C5 loses at 60B (C49)", "60B, 128 GPUs, MP 16, DGX-2 model")


@pytest.mark.slow
def test_figure8_table(md_snapshot):
    """spec/evaluation.md's Figure 8 table: per configuration, the appendix batch, the measured
    peak (exact), and the model's TFLOPS per GPU (pure-Python doubles, to 1 decimal)."""
    assert md_snapshot == pf.bare(pf.figure8()[0])


# -- C48: Figure 7, cached memory per configuration ---------------------------------------------------------
def pa_checkpoints(size: str) -> int:
    """Bytes of the checkpoints P_a keeps on each GPU: L checkpoints of b·s·d fp16, 1/N_m each."""
    run = next(r for r in ev.FIGURE7 if r.size == size)
    return run.layers * run.batch_per_gpu * 1024 * run.hd * 2 // run.mp


@pytest.mark.slow   # ten meta steps of 50 and 125 layers with their storage traces: ~25 s
@pytest.mark.claim("C48", status="differs", page=f"{PAGE}#cached-memory-per-configuration-c48")
def test_cached_memory_drops_c1_to_c2_and_c4_to_c5_by_the_checkpoints_p_a_cpu_moves_off(
        claim_values):
    """Figure 7: max cached memory drops from C1 to C2 (P_a), and from C4 to C5 (P_a+cpu) for
    100B but not for 40B (C48). Replayed through the allocator model, C1 → C2 drops at both
    sizes; C4 → C5 drops at both, by exactly P_a's checkpoints in allocated bytes (0.84 GB at 40B,
    4.19 GB at 100B: the step's peak falls in backward, while they are held) — a smaller share
    of the cache at 40B than at 100B, not none."""
    from zerospec.evaluation.cached_memory import figure7
    for size in ("40B", "100B"):
        f = figure7(size)
        assert f["C2"].reserved < f["C1"].reserved
        assert f["C4"].allocated - f["C5"].allocated == pa_checkpoints(size)
        assert f["C5"].reserved < f["C4"].reserved
    drop = {s: 1 - figure7(s)["C5"].reserved / figure7(s)["C4"].reserved for s in ("40B", "100B")}
    assert drop["40B"] < drop["100B"]
    claim_values("; ".join(f"{s}: " + ", ".join(f"{n} {m.reserved / 1e9:.1f}" for n, m in
                                                figure7(s).items()) + " GB" for s in ("40B", "100B"))
                 + f"; C4 → C5 −{drop['40B']:.0%} (40B), −{drop['100B']:.0%} (100B)",
                 "C1 → C2 drops; C4 → C5 drops for 100B, not for 40B (C48)",
                 "400 GPUs, MP 16, allocator model, meta")


@pytest.mark.slow
def test_figure7_table(md_snapshot):
    """spec/evaluation.md's Figure 7 table: per run and configuration, the ledger's peak, the
    allocator model's allocated and reserved ("cached") peaks without a limit (bytes, exact:
    integers from meta steps), and whether the step runs on a 32 GB V100."""
    from zerospec.evaluation.cached_memory import figure7
    for size in ("40B", "100B"):
        assert all(m.ledger <= m.allocated <= m.reserved for m in figure7(size).values())
    assert md_snapshot == pf.bare(pf.figure7()[0])


@pytest.mark.slow
def test_figure7_drops_table(md_snapshot):
    """spec/evaluation.md's C48 table: how much the max cached memory drops from C1 to C2 and from
    C4 to C5 per run, P_a's checkpoints per GPU, and the C4 → C5 drop as a share of C4's cache."""
    from zerospec.evaluation.cached_memory import figure7
    rows = ["| model | C1 → C2 (B) | C4 → C5 (B) | P_a's checkpoints per GPU (B) "
            "| C4 → C5, of C4's cache |", "|---|---|---|---|---|"]
    for size in ("40B", "100B"):
        f = figure7(size)
        c12, c45 = f["C1"].reserved - f["C2"].reserved, f["C4"].reserved - f["C5"].reserved
        rows.append(f"| {size} | {c12:,} | {c45:,} | {pa_checkpoints(size):,} "
                    f"| {c45 / f['C4'].reserved:.1%} |")
    assert md_snapshot == "\n".join(rows)


@pytest.mark.slow   # five 125-layer meta steps with their storage traces, sampled: ~15 s
def test_figure7_cached_memory_curves_at_100b(md_snapshot):
    """spec/figures/fragmentation_by_config_100B.svg's data (tools/specfigures.py draws it only
    from these): per configuration, rank 0's allocated and reserved samples over the 100B step,
    their count, peaks and digest; the max cached column is Figure 7's table's."""
    assert md_snapshot == specfigures.figure7_curves_data("100B")
