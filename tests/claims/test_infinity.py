"""ZeRO-Infinity (spec/infinity.md): stage 3's parameters on the NVMe tier, fetched NVMe → host →
device; bandwidth-centric partitioning against the owner's broadcast (C-I8); memory-centric
tiling (C-I3); the efficiency model (C-I5, C-I6); the capacity per tier (C-I7); the byte counts
(C-I1, C-I2, C-I4).

Runs: the ODD model (units divide by no N, so padding shows) on N = 4 virtual GPUs, 3 steps.
"""
from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.support.runs import assert_same_training
from zerospec.model.gpt import ODD
from zerospec.training.config import TrainConfig
from zerospec.training.run import train

N, STEPS = 4, 3


@functools.lru_cache(maxsize=None)
def run(stage: int = 3, **kw):
    return train(TrainConfig(stage=stage, n_d=N, model=ODD, steps=STEPS, **kw))


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
    r = train(TrainConfig(stage=3, n_d=N, model=ODD, steps=STEPS, offload_optimizer="cpu",
                          offload_params="nvme", nvme_path=str(tmp_path)))
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
    if tier == "nvme":
        claim_values(f"busiest PCIe link per fetch: owner {sum(busiest['owner'])} B, "
                     f"bandwidth-centric {sum(busiest['bandwidth'])} B per step (÷{N}); same "
                     f"{total['owner']} B over all links", "each PCIe link carries 1/dp of each "
                     f"parameter, not one link all of it (C-I8)", f"N = {N}, forward + backward "
                     f"of step 2; the prefetcher is not built")


# -- C-I3: memory-centric tiling -------------------------------------------------------------------
HD, D_FF, TOKENS = 64, 256, 8     # the MLP of a small block; few tokens, so weights dominate


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
    plain = F.linear(F.gelu(F.linear(h.detach(), *(x.half().float() for x in (w_fc, b_fc)))),
                     w_proj.half().float()) + b_proj     # the bias added after, as the operator does
    return y.detach(), h.grad, grads, o.observation, comm, plain


def _working(peak, cats=("gathered", "grad16")) -> int:
    return sum(s.nbytes for s in peak.live if s.category in cats)


@pytest.mark.claim("C-I3")
def test_tiling_divides_the_operators_working_memory_by_t(claim_values):
    """C-I3's MSWM is the fp16 parameters and gradients of the largest operator; tiling the MLP
    into T tiles along d_ff, fetched and freed one by one, leaves one tile's worth live: the
    observer sees exactly 4 bytes per parameter of one tile at backward's peak (2 per parameter
    in forward), ÷ T, and the whole peak shrinks with T; the link bytes stay the same."""
    from zerospec.offload.tiling import mswm_bytes
    seen = {}
    for t in (1, 2, 4, 8):
        *_, obs, comm, _ = _tiled_run(t)
        back, fwd = obs.peaks["backward@1"], obs.peaks["forward@1"]
        assert _working(back) == mswm_bytes(HD, D_FF, t)
        assert _working(fwd) == mswm_bytes(HD, D_FF, t) // 2
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
    two fp32 summation orders, 2·γ_K·Σ|xᵢyᵢ|, K = d_ff + 1 (tiling.reorder_bound) — not zero."""
    from zerospec.offload.tiling import reorder_bound
    y1, dh1, g1, *_, plain = _tiled_run(1)
    assert torch.equal(y1, plain)
    for t in (2, 4, 8):
        y, dh, g, *_ = _tiled_run(t)
        assert all(torch.equal(a, b) for a, b in zip(g, g1))
        assert torch.all((y - y1).abs() <= reorder_bound(_abs_terms_y(), D_FF + 1))
        assert torch.all((dh - dh1).abs() <= reorder_bound(_abs_terms_dh(), D_FF + 1))
    assert not torch.equal(y, y1) or not torch.equal(dh, dh1)   # the order did change something


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
