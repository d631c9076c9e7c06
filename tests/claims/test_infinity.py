"""ZeRO-Infinity (spec/infinity.md): stage 3's parameters on the NVMe tier, fetched NVMe → host →
device; bandwidth-centric partitioning against the owner's broadcast (C-I8); memory-centric
tiling (C-I3); the efficiency model (C-I5, C-I6); the capacity per tier (C-I7); the byte counts
(C-I1, C-I2, C-I4).

Runs: the ODD model (units divide by no N, so padding shows) on N = 4 virtual GPUs, 3 steps.
"""
from __future__ import annotations

import functools
from fractions import Fraction

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.support.runs import assert_same_training
from zerospec.model.gpt import ODD
from zerospec.training.config import TrainConfig
from zerospec.training.sections import BatchOptions, OffloadOptions, ZeroROptions
from zerospec.training.run import train

N, STEPS = 4, 3
GB = 10**9


@functools.lru_cache(maxsize=None)
def run(stage: int = 3, **kw):
    return train(TrainConfig.of(stage=stage, n_d=N, model=ODD, steps=STEPS, **kw))


def infinity(params: str, partition: str = "bandwidth", optimizer: str = "cpu", **kw):
    return run(3, offload_optimizer=optimizer, offload_params=params,
               offload_partition=partition, **kw)


def fetches(r, rank: int, step: int = 2, phase: str | None = None):
    """Rank's fetches in order: (collective, its numel, bytes this rank's PCIe link carried
    host→device for it, bytes its NVMe link carried NVMe→host for it)."""
    out, host, nvme = [], 0, 0
    for x in r.comm.records(rank, step=step, phase=phase):
        if x.op == "from_host":
            host += x.bytes_recv
        elif x.op == "from_nvme":
            nvme += x.bytes_recv
        elif x.op in ("all_gather", "broadcast") and x.phase != "param_sync":
            out.append((x.op, x.numel, host, nvme))
            host = nvme = 0
    return out


# -- the NVMe tier for parameters -----------------------------------------------------------------
@pytest.mark.parametrize("optimizer", ["cpu", pytest.param("nvme", marks=pytest.mark.slow)])
@pytest.mark.claim("C-I8")
def test_parameters_on_nvme_train_bit_identically_to_stage_3(optimizer):
    """Stage 3's fp16 chunks in NVMe swap files (and the optimizer states on the host or on NVMe
    too): moving bytes through files changes no arithmetic, so every loss and master weight is
    stage 3's bit for bit, and the device holds no model state between steps."""
    r = infinity("nvme", optimizer=optimizer)
    assert_same_training(r, run(3))
    assert all(r.model_states(k) == 0 for k in range(N))


@pytest.mark.claim("C-I8")
def test_each_fetch_hops_nvme_to_host_then_host_to_device_then_all_gathers():
    """Every fetch of a unit in forward and backward reads this rank's 1/N chunk from its file
    (from_nvme, on the nvme link), copies it up (from_host, on the PCIe link) and all-gathers it;
    after the step the updated chunk goes host → NVMe (to_nvme), and nothing else crosses a link."""
    r = infinity("nvme")
    for rank in range(N):
        recs = r.comm.records(rank, step=2)
        gathers = [k for k, x in enumerate(recs) if x.op == "all_gather"]
        assert gathers
        for k in gathers:
            nv, up, g = recs[k - 2], recs[k - 1], recs[k]
            assert (nv.op, nv.link, up.op, up.link) == ("from_nvme", "nvme", "from_host", "host")
            assert nv.bytes_recv == up.bytes_recv == 2 * g.numel // N and not nv.bytes_sent
        sync = r.comm.records(rank, step=2, phase="param_sync")
        assert [(x.op, x.link, x.bytes_sent) for x in sync] == [
            ("to_nvme", "nvme", 2 * u.chunk) for u in r.units]
        links = {(x.op, x.link) for x in recs}
        assert links == {("from_nvme", "nvme"), ("from_host", "host"), ("to_nvme", "nvme"),
                         ("to_host", "host"), ("all_gather", "intra"),
                         ("reduce_scatter", "intra")}


@pytest.mark.claim("C-I8")
def test_the_swap_files_hold_the_trained_fp16_parameters(tmp_path):
    """The files on disk, read by numpy (not by the code under test), are the NVMe tier's
    observer: one per unit and rank, of the chunk's size, equal to the NVMe ledger; together they
    are the trained master weights rounded to fp16, bit for bit."""
    r = train(TrainConfig(stage=3, n_d=N, model=ODD, steps=STEPS,
                          offload=OffloadOptions(offload_optimizer="cpu", offload_params="nvme",
                                                 nvme_path=str(tmp_path))))
    for rank in range(N):
        files = {p.name: p for p in (tmp_path / f"rank{rank}").glob("*.param16.swap")}
        assert sorted(files) == sorted(f"{u.name}.param16.swap" for u in r.units)
        on_disk = sum(p.stat().st_size for p in files.values())
        assert on_disk == 2 * sum(u.chunk for u in r.units) == r.nvme[rank].current["param16"]
    for u in r.units:
        got = np.concatenate([np.fromfile(tmp_path / f"rank{k}" / f"{u.name}.param16.swap",
                                          dtype=np.float16) for k in range(N)])
        want = u.flatten({p: r.master[f"{u.name}/{p}"] for p in u.names}, dtype=torch.float16)
        assert np.array_equal(got.view(np.uint16), want.numpy().view(np.uint16)), u.name


# -- C-I8: bandwidth-centric partitioning against the owner's broadcast -----------------------------
@pytest.mark.parametrize("tier", ["cpu", "nvme"])
@pytest.mark.claim("C-I8")
def test_bandwidth_centric_puts_1_nth_on_every_link_the_owner_all_on_one(tier, claim_values):
    """C-I8, measured per link against the baseline built for it: bandwidth-centric, every fetch
    puts 1/N of the unit on each rank's PCIe link (and on NVMe, each rank's NVMe link) and then
    all-gathers it; the owner's way, one rank's link carries the whole unit and the others none,
    then a broadcast. The busiest link per fetch carries N times less bandwidth-centric — the
    aggregate PCIe bandwidth of all ranks at work — with the same bytes in all; both train
    stage 3's bits."""
    bw, own = infinity(tier, "bandwidth"), infinity(tier, "owner")
    assert_same_training(own, run(3))
    nv = tier == "nvme"
    f_bw = [fetches(bw, k) for k in range(N)]
    f_own = [fetches(own, k) for k in range(N)]
    for per_rank in zip(*f_bw):                 # one fetch, seen by every rank
        (op, numel), = {(x[0], x[1]) for x in per_rank}
        assert op == "all_gather"
        assert [x[2:] for x in per_rank] == [(2 * numel // N, 2 * numel // N if nv else 0)] * N
    for per_rank in zip(*f_own):
        (op, numel), = {(x[0], x[1]) for x in per_rank}
        assert op == "broadcast"
        assert sorted(x[2:] for x in per_rank) == [(0, 0)] * (N - 1) + [(2 * numel, 2 * numel if nv else 0)]
    busiest = {name: [max(x[2] for x in per_rank) for per_rank in zip(*f)]
               for name, f in (("bandwidth", f_bw), ("owner", f_own))}
    assert [o // b for o, b in zip(busiest["owner"], busiest["bandwidth"])] == [N] * len(f_bw[0])
    total = {name: sum(x[2] for fs in f for x in fs) for name, f in (("bandwidth", f_bw), ("owner", f_own))}
    assert total["bandwidth"] == total["owner"]
    # over the step, one link's own sum: the owner's units are dealt round the ranks, so its
    # busiest link carries less than N× the even share, and more than it
    step = {name: [sum(x[2] for x in fs) for fs in f] for name, f in (("bandwidth", f_bw), ("owner", f_own))}
    assert step["bandwidth"] == [total["bandwidth"] // N] * N
    assert step["bandwidth"][0] < max(step["owner"]) < N * step["bandwidth"][0]
    if tier == "nvme":
        claim_values(f"busiest PCIe link: per fetch {N}× (owner {sum(busiest['owner'])} B, "
                     f"bandwidth-centric {sum(busiest['bandwidth'])} B over the step's fetches); "
                     f"over the step {max(step['owner']) / step['bandwidth'][0]:.2f}× ("
                     f"{max(step['owner'])} B vs {step['bandwidth'][0]} B); same {total['owner']} B "
                     f"over all links", "each PCIe link carries 1/dp of each parameter, not one "
                     f"link all of it (C-I8)", f"N = {N}, forward + backward of step 2")


def test_owner_against_bandwidth_table(md_snapshot):
    """spec/infinity.md's C-I8 table (NVMe tier, step 2's fetches, PCIe host → device): per
    layout, the busiest link of each fetch summed over the fetches, the busiest link's own sum
    over the step, and all links together."""
    from zerospec.render.format import markdown
    rows = []
    for layout in ("bandwidth", "owner"):
        f = [fetches(infinity("nvme", layout), k) for k in range(N)]
        per_fetch = sum(max(x[2] for x in per_rank) for per_rank in zip(*f))
        per_link = [sum(x[2] for x in fs) for fs in f]
        rows.append([layout, f"{per_fetch:,}", f"{max(per_link):,}", f"{sum(per_link):,}"])
    assert md_snapshot == markdown(["layout", "busiest link per fetch, summed (B)",
                                    "busiest link over the step (B)", "all links (B)"], rows)


@pytest.mark.claim("C-I8")
def test_the_owner_baseline_deals_unit_i_to_rank_i_mod_n():
    """The owner baseline's layout: unit i lives whole on rank i mod N (dealt round the ranks from
    rank 0), so its fetch crosses that rank's PCIe link and is broadcast from it — the one rank
    that receives nothing in the broadcast's chain. Forward fetches embed, h.0, h.1, ln_f and the
    tied head's embed again."""
    r = infinity("cpu", "owner")
    order = [0, 1, 2, 3, 0]                          # unit indexes in forward order
    fwd = [fetches(r, k, phase="forward") for k in range(N)]
    assert [x[1] for x in fwd[0]] == [r.units[i].padded for i in order]
    for f, i in enumerate(order):
        pcie = [k for k in range(N) if fwd[k][f][2]]
        assert pcie == [i % N], (f, pcie)
    for k in range(N):
        casts = [x for x in r.comm.records(k, step=2, phase="forward") if x.op == "broadcast"]
        assert [x.bytes_recv == 0 for x in casts] == [i % N == k for i in order]


# -- C-I3: memory-centric tiling -------------------------------------------------------------------
HD, D_FF, TOKENS = 64, 256, 8     # the MLP of a small block; few tokens, so weights dominate


@functools.lru_cache(maxsize=None)
def _tiled_run(tiles: int):
    """Forward and backward of the tiled MLP on one rank: (y, dh, weight grads, observation,
    comm ledger). The observer sees the storages; the ledger only names their categories."""
    from types import SimpleNamespace
    from zerospec.comm.ledger import CommLedger
    from zerospec.offload.tiling import TiledMLP
    from zerospec.runtime.memory import MemoryLedger
    from zerospec.runtime.observe import Observer

    g = torch.Generator().manual_seed(0)
    w_fc, b_fc = torch.randn(D_FF, HD, generator=g) * .1, torch.randn(D_FF, generator=g) * .1
    w_proj, b_proj = torch.randn(HD, D_FF, generator=g) * .1, torch.randn(HD, generator=g) * .1
    h = torch.randn(TOKENS, HD, generator=g).requires_grad_()
    dy = torch.randn(TOKENS, HD, generator=g)
    b_proj.requires_grad_()      # held whole, outside the tiles: autograd's own gradient
    ctx = SimpleNamespace(phase_name="forward", step=1, memory=MemoryLedger("cpu"))
    comm = CommLedger(1)
    link = SimpleNamespace(book_link=lambda op, t: comm.book(
        0, op, t.dtype, t.numel(), ctx.phase_name, 1, group="host", n=1, index=0))
    op = TiledMLP(w_fc, b_fc, w_proj, b_proj, tiles, ctx.memory, link)
    with Observer(ctx) as o:
        y = op(h)
        ctx.phase_name = "backward"
        y.backward(dy)
    grads = [torch.cat([t[j] for t in op.grad_host], dim=1 if j == 2 else 0) for j in range(3)]
    grads.append(b_proj.grad)
    plain = F.linear(F.gelu(F.linear(h.detach(), *(x.half().float() for x in (w_fc, b_fc)))),
                     w_proj.half().float()) + b_proj.detach()   # the bias after, as the operator
    return y.detach(), h.grad, grads, o.observation, comm, plain


def _working(peak, cats=("gathered", "grad16")) -> int:
    return sum(s.nbytes for s in peak.live if s.category in cats)


@pytest.mark.claim("C-I3")
def test_tiling_divides_the_operators_working_memory_by_t(claim_values):
    """C-I3's MSWM is the fp16 parameters and gradients of the largest operator; tiling the MLP
    into T tiles along d_ff, fetched and freed one by one, leaves one tile's worth live: the
    observer sees exactly 4 bytes per parameter of one tile at backward's peak (2 per parameter
    in forward), ÷ T, and the whole peak shrinks with T; the link bytes stay the same."""
    from zerospec.paper.infinity import mswm_bytes
    assert D_FF == 4 * HD                 # the paper's MLP: c_fc hd → 4hd, c_proj 4hd → hd
    # the tiled pair: c_fc's and c_proj's weights, each the paper's hd × 4hd linear (4·hd·4hd
    # bytes of fp16 parameter + gradient, C-I3), and c_fc's 4hd bias at 2 + 2 bytes; ÷ T
    pair = 2 * mswm_bytes(HD) + 4 * D_FF
    seen = {}
    for t in (1, 2, 4, 8):
        *_, obs, comm, _ = _tiled_run(t)
        back, fwd = obs.peaks["backward@1"], obs.peaks["forward@1"]
        assert _working(back) == pair // t
        assert _working(fwd) == pair // t // 2            # forward: the parameters only
        seen[t] = (_working(back), back.bytes)
        per_pass = 2 * (2 * HD * D_FF + D_FF)
        by = {}
        for x in comm.records(0):
            by[(x.op, x.phase)] = by.get((x.op, x.phase), 0) + x.bytes_sent + x.bytes_recv
        assert by == {("from_host", "forward"): per_pass, ("from_host", "backward"): per_pass,
                      ("to_host", "backward"): per_pass}
    assert [seen[1][0] // seen[t][0] for t in seen] == list(seen)
    assert all(seen[a][1] > seen[b][1] for a, b in ((1, 2), (2, 4), (4, 8)))
    claim_values(f"MSWM observed {', '.join(f'T={t}: {w:,} B' for t, (w, _) in seen.items())}; "
                 f"whole backward peak {seen[1][1]:,} → {seen[8][1]:,} B",
                 "MSWM = 4 × hd × 4hd bytes for the largest operator; tiling divides it (C-I3)",
                 f"hd {HD}, d_ff {D_FF}, MLP's c_fc + c_proj weights")


@pytest.mark.claim("C-I3")
def test_tiling_is_exact_along_the_output_dim_and_within_the_derived_bound_along_d_ff():
    """Tiles along c_fc's output dim change no dot product: every weight gradient equals the
    untiled one bit for bit, and T = 1 equals plain autograd. c_proj's output and the input
    gradient are sums over d_ff that tiling regroups: each element within the derived bound for
    two fp32 summation orders, 2·γ_K·Σ|xᵢyᵢ|, K = d_ff + 1 (tiling.reorder_bound) — not zero.
    (The bound holds for any order the kernel sums in, so it cannot bind within 10× of what a
    real order does: spec/infinity.md says why.)"""
    from zerospec.offload.tiling import reorder_bound
    y1, dh1, g1, *_, plain = _tiled_run(1)
    assert torch.equal(y1, plain)
    for t in (2, 4, 8):
        y, dh, g, *_ = _tiled_run(t)
        assert all(torch.equal(a, b) for a, b in zip(g, g1, strict=True))
        assert torch.all((y - y1).abs() <= reorder_bound(_abs_terms_y(), D_FF + 1))
        assert torch.all((dh - dh1).abs() <= reorder_bound(_abs_terms_dh(), D_FF + 1))
    assert not torch.equal(y, y1) or not torch.equal(dh, dh1)   # the order did change something
    assert torch.equal(g1[3], _weights()[5].sum(0))     # c_proj's bias: Σ over tokens of dy


def test_tiling_table(md_snapshot):
    """spec/infinity.md's C-I3 operator table: per T, the fp16 tile bytes the observer sees live
    at backward's and forward's peaks, and the whole backward peak (hd 64, d_ff 256, 8 tokens)."""
    from zerospec.render.format import markdown
    rows = []
    for t in (1, 2, 4, 8):
        obs = _tiled_run(t)[3]
        back, fwd = obs.peaks["backward@1"], obs.peaks["forward@1"]
        rows.append([f"{t}", f"{_working(back):,}", f"{_working(fwd):,}", f"{back.bytes:,}"])
    assert md_snapshot == markdown(["T", "tile at backward's peak (B)", "at forward's peak (B)",
                                    "whole backward peak (B)"], rows)


def _weights():
    g = torch.Generator().manual_seed(0)
    w_fc, b_fc = torch.randn(D_FF, HD, generator=g) * .1, torch.randn(D_FF, generator=g) * .1
    w_proj, b_proj = torch.randn(HD, D_FF, generator=g) * .1, torch.randn(HD, generator=g) * .1
    h = torch.randn(TOKENS, HD, generator=g)
    dy = torch.randn(TOKENS, HD, generator=g)
    return [x.half().float() for x in (w_fc, b_fc, w_proj)] + [b_proj, h, dy]


def _abs_terms_y():
    """Σⱼ |aⱼ · W_proj[:, j]| + |b|: the terms of y's sum over d_ff."""
    w_fc, b_fc, w_proj, b_proj, h, _ = _weights()
    a = F.gelu(F.linear(h, w_fc, b_fc))
    return a.abs() @ w_proj.abs().T + b_proj.abs()


def _abs_terms_dh():
    """Σⱼ |dzⱼ · W_fc[j, :]|: the terms of dh's sum over d_ff."""
    w_fc, b_fc, w_proj, _, h, dy = _weights()
    z = F.linear(h, w_fc, b_fc).requires_grad_()
    a = F.gelu(z)
    dz, = torch.autograd.grad(a, z, dy @ w_proj)
    return dz.abs() @ w_fc.abs()


def test_a_tile_count_that_does_not_divide_d_ff_is_one_clear_error():
    """T must divide d_ff (equal tiles): one ValueError naming T, d_ff and what is accepted."""
    from zerospec.offload.tiling import check_tiles
    for bad in (3, 0, -2, 2.0, True):
        with pytest.raises(ValueError, match=rf"tiles={bad!r} cannot split the MLP's d_ff=256"):
            check_tiles(256, bad)
    assert check_tiles(256, 8) == 8


# -- C-I5, C-I6: the efficiency model from measured FLOPs and bytes ---------------------------------
@functools.lru_cache(maxsize=None)
def _measured():
    """One GPU (the paper's per-GPU view), everything offloaded to NVMe, a checkpoint per block,
    FLOPs counted: (ait per data type, tokens, result)."""
    from zerospec.evaluation import infinity_efficiency as ev
    r = train(TrainConfig(stage=3, n_d=1, model=ODD, steps=2, count_flops=True,
                          batching=BatchOptions(global_batch=4),
                          zero_r=ZeroROptions(checkpoint_activations=1),
                          offload=OffloadOptions(offload_optimizer="nvme", offload_params="nvme")))
    return ev.measured_ait(r), 4 * ODD.block_size, r


@pytest.mark.claim("C-I5", status="modelled_differs", page="spec/infinity.md#the-efficiency-model-c-i5-c-i6")
def test_arithmetic_intensity_measured_per_data_type(claim_values):
    """C-I5's ait = FLOPs / bytes moved, from the op counter's FLOPs and the ledgers' bytes on one
    GPU: parameters and gradients 4/3 × seq·bsz (zerospec gathers each unit twice per step, once
    in forward and once in backward for recompute and gradients together, where the paper counts
    three loads), optimizer states 4/3 × seq·bsz/4 (24 bytes per parameter cross NVMe, the paper
    counts 32 with fp32 gradients), each within the FLOPs the model adds beyond 8·tokens·Ψ."""
    from zerospec.evaluation import infinity_efficiency as ev
    from zerospec.paper import hardware
    from zerospec.paper import infinity as zi
    aits, tokens, r = _measured()
    f, psi = ev.step_flops(r), r.psi_padded
    moved = ev.moved_bytes(r)
    assert moved["params"] == (2 + 2 + 2) * psi          # 2 loads + 1 gradient, fp16
    assert moved["optimizer"] == 2 * 12 * psi            # master, momentum, variance: in and out
    assert aits["params"] == Fraction(f, 6 * psi) and aits["optimizer"] == Fraction(f, 24 * psi)
    scale = Fraction(f, 8 * tokens * psi)                # the model's FLOPs against C-I5's count
    assert abs(scale - 1) < Fraction(1, 100)
    paper = {d: zi.ait(d, seq=ODD.block_size, bsz=4) for d in ("params", "optimizer")}
    assert {d: aits[d] / paper[d] / scale for d in paper} == {"params": Fraction(4, 3),
                                                             "optimizer": Fraction(4, 3)}
    eff = zi.efficiency(aits["params"], hardware.DGX2.host_bytes_per_s)
    claim_values(f"ait params {float(aits['params']):.1f}, optimizer {float(aits['optimizer']):.1f}, "
                 f"checkpoints {float(aits['checkpoints']):.1f} (tokens {tokens}); at this ait a DGX-2 "
                 f"GPU's PCIe runs at {float(eff):.1%}", f"seq·bsz = {tokens}, seq·bsz/4 = {tokens // 4}, "
                 f"24·hd·ci = {24 * ODD.n_embd} (C-I5)", "one GPU, ODD, NVMe tier, checkpoint per block")


def test_ait_table(md_snapshot):
    """spec/infinity.md's C-I5 table: the measured ait per data type on one GPU (ODD, batch 4 ×
    seq 12, everything on NVMe, a checkpoint per block) beside the paper's formula at that shape."""
    from zerospec.paper import infinity as zi
    from zerospec.render.format import markdown
    aits, tokens, _ = _measured()
    paper = {"params": zi.ait("params", seq=ODD.block_size, bsz=4),
             "optimizer": zi.ait("optimizer", seq=ODD.block_size, bsz=4),
             "checkpoints": zi.ait("checkpoints", hd=ODD.n_embd)}
    rows = [[d, f"{float(aits[d]):.1f}", f"{float(paper[d]):g}"] for d in paper]
    assert md_snapshot == markdown(["data", "measured ait", "the paper's formula"], rows)


@pytest.mark.claim("C-I6", status="closed_form")
def test_the_bandwidth_thresholds_of_figure_3(claim_values):
    """C-I6 at Fig. 3's peak of 70 TFLOPS, from C-I5's formula (closed form: nothing is run):
    70 GB/s gives > 50% on parameters at batch 1 (seq 1024); optimizer states need 4× that
    bandwidth for the same efficiency and about 1.5 TB/s (1.23) for 90% at batch 2; checkpoints
    at 2 GB/s give > 50% at hd 2K and need under 1 GB/s beyond hd 8K; a DGX-2 GPU's PCIe (15.75
    GB/s on its spec sheet, of which the paper uses 3) gives > 80% at hd ≥ 8K. The same
    thresholds hold with aits 4/3 of the paper's, the ratio C-I5's test measures."""
    from zerospec.paper import hardware
    from zerospec.paper import infinity as zi
    ratio = {"params": Fraction(4, 3), "optimizer": Fraction(4, 3), "checkpoints": Fraction(1)}
    rows = {}
    for label, k in (("paper", {d: 1 for d in ratio}), ("zerospec", ratio)):
        a = lambda d, **kw: zi.ait(d, **kw) * k[d]        # noqa: E731
        e_p = zi.efficiency(a("params", seq=1024, bsz=1), 70 * GB)
        need_os = zi.bandwidth_for(e_p, a("optimizer", seq=1024, bsz=1))
        os90 = zi.bandwidth_for(Fraction(9, 10), a("optimizer", seq=1024, bsz=2))
        ck2k = zi.efficiency(a("checkpoints", hd=2048), 2 * GB)
        ck8k_need = zi.bandwidth_for(Fraction(1, 2), a("checkpoints", hd=8192))
        pcie = zi.efficiency(a("checkpoints", hd=8192), 3 * GB)
        dgx2 = zi.efficiency(a("checkpoints", hd=8192), hardware.DGX2.host_bytes_per_s)
        assert e_p > Fraction(1, 2) and need_os == 4 * 70 * GB     # 4× for the same efficiency
        if label == "paper":
            assert 1.2e12 < os90 < 1.5e12
        assert ck2k > Fraction(1, 2) and ck8k_need < GB and pcie > Fraction(8, 10) and dgx2 > pcie
        rows[label] = (e_p, os90, ck2k, pcie)
    assert round(float(rows["paper"][2]), 3) == 0.584       # the sanity check: 98.3/(98.3+70)
    p = rows["paper"]
    claim_values(f"params @70 GB/s {float(p[0]):.1%}; optimizer 90% @bsz 2 needs "
                 f"{float(p[1]) / 1e12:.2f} TB/s; checkpoints hd 2K @2 GB/s {float(p[2]):.1%}, hd 8K "
                 f"@3 GB/s {float(p[3]):.1%}", "> 50%; ~1.5 TB/s; > 50%; > 80% (C-I6)",
                 f"peak 70 TFLOPS; zerospec's aits: params {float(rows['zerospec'][0]):.1%}")


def efficiency_table() -> str:
    """Fig. 3 as a table: C-I5's efficiency per data type and bandwidth at the paper's aits."""
    from zerospec.paper import infinity as zi
    from zerospec.render.format import markdown
    cases = [("params & grads, bsz 1", zi.ait("params", seq=1024, bsz=1)),
             ("params & grads, bsz 16", zi.ait("params", seq=1024, bsz=16)),
             ("optimizer, bsz 2", zi.ait("optimizer", seq=1024, bsz=2)),
             ("optimizer, bsz 16", zi.ait("optimizer", seq=1024, bsz=16)),
             ("checkpoints, hd 2K", zi.ait("checkpoints", hd=2048)),
             ("checkpoints, hd 8K", zi.ait("checkpoints", hd=8192))]
    bws = (1, 3, 16, 70, 300, 1500)
    rows = [[name, f"{int(a):,}"] + [f"{float(zi.efficiency(a, b * GB)):.0%}" for b in bws]
            for name, a in cases]
    return markdown(["data", "ait"] + [f"{b} GB/s" for b in bws], rows)


def test_efficiency_table(md_snapshot):
    """The spec's Fig. 3 table: efficiency per data type and bandwidth (C-I5, peak 70 TFLOPS)."""
    assert efficiency_table() == md_snapshot


# -- C-I7: the largest model per tier --------------------------------------------------------------
def _per_param(**kw):
    from zerospec.evaluation import infinity_efficiency as ev
    return ev.bytes_per_param_per_tier(run(3, **kw) if kw else run(3))


@pytest.mark.claim("C-I7", status="differs", page="spec/infinity.md#capacity-per-tier-c-i7")
def test_the_largest_model_per_tier_on_one_dgx2_and_512_gpus(claim_values):
    """C-I7 from the model-state bytes per parameter each tier holds, read off the ledgers of
    runs with nothing, the host and NVMe offloaded (16 on the GPU; 16 on the host; 2 on the host
    and 14 on NVMe), and the tiers' spec-sheet capacities: one DGX-2 fits 32B on its GPUs, 94B
    with the host and 750B with NVMe — short of the paper's 1T, because zerospec's NVMe tier keeps
    the fp16 gradients in host memory (2 bytes per parameter, 1.5 TB); with the paper's 20 bytes
    all on NVMe, 1.5T. 512 GPUs: 24T with NVMe here, 49T with the paper's placement (≥ 32T). NVMe
    is 60× the GPUs' memory and 20× the host's (the paper: about 50× and 20×)."""
    from zerospec.evaluation import infinity_efficiency as ev
    from zerospec.paper import hardware
    from zerospec.paper import infinity as zi
    t = hardware.DGX2_TIERS
    per = {"GPU": _per_param(), "+ CPU": _per_param(offload_optimizer="cpu", offload_params="cpu",
                                                    offload_partition="bandwidth"),
           "+ NVMe": _per_param(offload_optimizer="cpu", offload_params="nvme",
                                offload_partition="bandwidth")}
    assert per == {"GPU": {"gpu": 16, "cpu": 0, "nvme": 0}, "+ CPU": {"gpu": 0, "cpu": 16, "nvme": 0},
                   "+ NVMe": {"gpu": 0, "cpu": 14, "nvme": 2}}
    per["+ NVMe"] = ev.bytes_per_param_per_tier(_measured()[2])    # the optimizer on NVMe too
    assert per["+ NVMe"] == {"gpu": 0, "cpu": 2, "nvme": 14}
    fit = {(k, nodes): ev.largest_model(v, t, nodes) for k, v in per.items() for nodes in (1, 32)}
    assert {k: round(v / 1e9) for k, v in fit.items()} == {
        ("GPU", 1): 32, ("GPU", 32): 1024, ("+ CPU", 1): 94, ("+ CPU", 32): 3000,
        ("+ NVMe", 1): 750, ("+ NVMe", 32): 24000}
    papers = {n: ev.largest_model({"nvme": Fraction(zi.BYTES_PER_PARAM)}, t, n) for n in (1, 32)}
    assert papers[1] >= 10**12 and papers[32] >= 32 * 10**12
    assert round(t.nvme_bytes / t.gpu_bytes) == 60 and round(t.nvme_bytes / t.host_bytes) == 20
    claim_values(f"one DGX-2: GPU {fit['GPU', 1] / 1e9:.0f}B, +CPU {fit['+ CPU', 1] / 1e9:.0f}B, "
                 f"+NVMe {fit['+ NVMe', 1] / 1e9:.0f}B (20 B on NVMe: {papers[1] / 1e12:.2f}T); "
                 f"512 GPUs +NVMe {fit['+ NVMe', 32] / 1e12:.0f}T ({papers[32] / 1e12:.0f}T)",
                 "1T on one DGX-2; 32T on 512 V100s; NVMe ~50× GPU, ~20× CPU (C-I7)",
                 "model states only; spec-sheet capacities")


@pytest.mark.claim("C-I9")
def test_zero3_offload_fits_over_40b_on_one_gpu_and_over_2t_on_512(claim_values):
    """C-I9's capacity bullets, as C-I7's: ZeRO-3 Offload (parameters and optimizer on the host)
    leaves no model-state byte on the GPU and 16 per parameter on the host (measured, the
    ledgers); one GPU with its DGX-2 node's 1.5 TB of host memory fits over 40B, 512 GPUs (32
    nodes) over 2T (spec-sheet capacities)."""
    from zerospec.evaluation import infinity_efficiency as ev
    from zerospec.paper import hardware
    per = _per_param(offload_optimizer="cpu", offload_params="cpu", offload_partition="bandwidth")
    assert per == {"gpu": 0, "cpu": 16, "nvme": 0}
    one, many = (ev.largest_model(per, hardware.DGX2_TIERS, n) for n in (1, 32))
    assert one > 40 * 10**9 and many > 2 * 10**12
    claim_values(f"{one / 1e9:.0f}B on one GPU (its node's host), {many / 1e12:.0f}T on 512 GPUs",
                 "over 40B on one GPU, over 2T on 512 GPUs (C-I9)", "model states only; host tier")


def test_capacity_table(md_snapshot):
    """spec/infinity.md's C-I7 table: per placement the model-state bytes per parameter on each
    tier (measured: the ledgers of the runs above; the last row is the paper's 20 B on NVMe), and
    the largest model whose model states fit one DGX-2 and 32 of them (spec-sheet capacities)."""
    from zerospec.evaluation import infinity_efficiency as ev
    from zerospec.paper import hardware
    from zerospec.paper import infinity as zi
    from zerospec.render.format import markdown

    def size(psi: int) -> str:
        return f"{psi / 1e12:.3g}T" if psi >= 10**12 else f"{psi / 1e9:.0f}B"
    kw = {"offload_optimizer": "cpu", "offload_partition": "bandwidth"}
    rows = [("GPU", _per_param()), ("+ CPU", _per_param(offload_params="cpu", **kw)),
            ("+ NVMe (zerospec's placement)", ev.bytes_per_param_per_tier(_measured()[2])),
            ("+ NVMe (the paper's 20 B all on NVMe)", {"gpu": 0, "cpu": 0,
                                                      "nvme": Fraction(zi.BYTES_PER_PARAM)})]
    out = [[name, *(f"{per[t]}" for t in ("gpu", "cpu", "nvme")),
            *(size(ev.largest_model(per, hardware.DGX2_TIERS, n)) for n in (1, 32))]
           for name, per in rows]
    assert md_snapshot == markdown(["tiers", "B/param on the GPUs", "on the host", "on NVMe",
                                    "one DGX-2", "512 GPUs (32 nodes)"], out)


# -- C-I1, C-I2, C-I4: the byte counts -------------------------------------------------------------
@pytest.mark.claim("C-I1", status="differs", page="spec/infinity.md#the-byte-counts-c-i1-c-i2-c-i4")
def test_model_state_bytes_per_parameter(claim_values):
    """C-I1: the ledgers hold 16 bytes of model states per parameter wherever they sit (fp16
    parameter and gradient, fp32 master, momentum, variance), not the paper's 20, which counts an
    fp32 gradient the host Adam here never makes (it reads the fp16 one, cast exactly). Ψ ≈
    12·nl·hd²: the model's own parameter count is within 1% at hd 8K, nl 100."""
    from zerospec.model.family import GPTConfig
    from zerospec.model.units import make_units
    from zerospec.paper import infinity as zi
    from zerospec.evaluation import infinity_efficiency as ev
    for kw in ({}, {"offload_optimizer": "cpu", "offload_params": "cpu",
                    "offload_partition": "bandwidth"}):
        assert sum(_per_param(**kw).values()) == 16
    assert sum(ev.bytes_per_param_per_tier(_measured()[2]).values()) == 16
    big = GPTConfig(vocab_size=50257, block_size=1024, n_layer=100, n_head=64, n_embd=8192)
    psi = sum(u.numel for u in make_units(big.unit_spec(), 1, pad=False))
    assert abs(Fraction(psi, zi.params(100, 8192)) - 1) < Fraction(1, 100)
    claim_values(f"16 B/param on the ledgers; Ψ / 12·nl·hd² = {psi / zi.params(100, 8192):.4f}",
                 "20 B/param, Ψ ≈ 12·nl·hd² (C-I1)", "hd 8192, nl 100")


@pytest.mark.claim("C-I2")
def test_checkpoint_bytes_are_two_bsz_seq_hd_nl_over_ci():
    """C-I2, on meta: the device ledger's checkpoints are exactly 2·bsz·seq·hd·nl/ci bytes."""
    from zerospec.model.family import GPTConfig
    from zerospec.paper import infinity as zi
    from zerospec.training.scale import measure
    m = GPTConfig(vocab_size=1024, block_size=128, n_layer=4, n_head=8, n_embd=256)
    for ci in (1, 2, 4):
        r = measure(TrainConfig(stage=0, n_d=1, model=m,
                                zero_r=ZeroROptions(checkpoint_activations=ci)), micro_batch=2)
        assert r.memory(0).peak["checkpoints"] == zi.checkpoint_bytes(2, 128, 256, 4, ci)


@pytest.mark.claim("C-I4", status="differs", page="spec/infinity.md#the-byte-counts-c-i1-c-i2-c-i4")
def test_activation_working_memory_per_token(claim_values):
    """C-I4, on meta: the recomputed blocks' activations per token are 32·hd + 2·heads·seq bytes
    (and a constant) per block — the heads·seq term the paper's, the hd term twice its 16·hd:
    autograd keeps 16 hd-sized fp16 tensors per block here (LN inputs, qkv, the MLP's 4hd input
    and its GELU output …), the paper counts 8."""
    from zerospec.model.family import GPTConfig
    from zerospec.paper import infinity as zi
    from zerospec.training.scale import measure

    def per_token(hd, heads, seq, ci=1):
        m = GPTConfig(vocab_size=1024, block_size=seq, n_layer=2, n_head=heads, n_embd=hd)
        r = measure(TrainConfig(stage=0, n_d=1, model=m,
                                zero_r=ZeroROptions(checkpoint_activations=ci)), micro_batch=2)
        return Fraction(r.memory(0).peak["recomputed"], 2 * seq * ci)
    base = per_token(256, 8, 128)
    assert per_token(512, 8, 128) - base == 32 * 256            # ∂/∂hd: 32 bytes
    assert per_token(256, 16, 128) - base == 2 * 8 * 128        # ∂/∂heads: 2·seq bytes
    assert per_token(256, 8, 128, ci=2) == base                 # ci blocks: ci × per block
    paper = Fraction(zi.awm_bytes(1, 128, 1, 256, 8), 128)
    claim_values(f"{float(base):,.0f} B per token per block at hd 256, 8 heads, seq 128",
                 f"{float(paper):,.0f} = 16·hd + 2·heads·seq (C-I4)", "meta, fp16")


# -- C-I8: the prefetcher ---------------------------------------------------------------------------
def _schedule(n: int) -> list[tuple[str, int]]:
    """C-I8's order of hops for a step of n fetches: before operator i runs, the all-gather for
    i+1, the host→device copy for i+2 and the NVMe→host read for i+3 (operator 0 fetched whole)."""
    out, done = [], set()

    def hop(op, q):
        if q < n and (op, q) not in done:
            out.append((op, q))
            done.add((op, q))
    for p in range(n):
        for q in ([p] if p == 0 else []) + [p + 1]:
            hop("from_nvme", q), hop("from_host", q), hop("all_gather", q)
        hop("from_nvme", p + 2), hop("from_host", p + 2)
        hop("from_nvme", p + 3)
    return out


@pytest.mark.claim("C-I8")
def test_the_prefetcher_reads_i_plus_3_copies_i_plus_2_and_gathers_i_plus_1():
    """C-I8's prefetcher, traced on the first step and followed from the second: the links carry
    the hops in exactly the schedule — before operator i, NVMe→host for i+3, host→device for i+2,
    the all-gather for i+1 — and each hop moves the bytes of the unit it is for (the trace of a
    run without prefetch); the device holds more gathered bytes meanwhile; the training is stage
    3's bit for bit."""
    big = max(u.chunk for u in run(3).units)
    pre = infinity("nvme", offload_prefetch=True, offload_buffer_elements=big)
    plain = infinity("nvme")
    assert_same_training(pre, run(3))
    hops = ("from_nvme", "from_host", "all_gather")
    for rank in range(N):
        recs = [x for x in pre.comm.records(rank, step=2) if x.op in hops and x.phase != "param_sync"]
        order = [x for x in plain.comm.records(rank, step=2) if x.op == "all_gather"]
        want = _schedule(len(order))
        assert [x.op for x in recs] == [op for op, _ in want]
        assert [x.numel for x in recs] == [order[q].numel // (N if op != "all_gather" else 1)
                                           for op, q in want]
        assert pre.memory[rank].peak["gathered"] > plain.memory[rank].peak["gathered"]
