"""C-I3 inside a training run: ``TrainConfig.of(tiles=T)`` / ``zerospec train --tiles T``
(spec/infinity.md, "Memory-centric tiling"). Each block's MLP weights are T units of their own,
gathered just before their slice of the MLP runs and freed right after, forward and backward."""
from __future__ import annotations

import functools
from unittest import mock

import pytest
import torch
import torch.nn.functional as F

from tests.support.cli import assert_usage_error
from tests.support.runs import assert_same_training
from zerospec.cluster import threads
from zerospec.cluster.threads import VirtualCluster
from zerospec.model import gpt
from zerospec.model.gpt import GPTConfig
from zerospec.runtime.observe import Observer
from zerospec.training.config import TrainConfig
from zerospec.training.sections import MeshOptions, OffloadOptions, ZeroROptions
from zerospec.training.run import train

# hd 16, d_ff 64: every unit and tile divides by N_d = 2, so no padding blurs the ÷ T
M = GPTConfig(vocab_size=37, block_size=12, n_layer=2, n_head=4, n_embd=16)
D, F_ = M.n_embd, M.ff
MLP = 2 * D * F_ + F_                   # c_fc's weight and bias, c_proj's weight: what tiles move


class _GatheredPeak(Observer):
    """The observer, plus, per phase, the most bytes of storages the ledger names "gathered" live
    at once, and the most of them at once that are one MLP tile's size (``tile_bytes``)."""

    def __init__(self, ctx, tile_bytes: int):
        super().__init__(ctx)
        self.tile_bytes = tile_bytes
        self.gathered: dict[str, int] = {}
        self.tiles: dict[str, int] = {}

    def _settle(self) -> None:   # before every op: the last op's storages are counted by now
        super()._settle()
        ledger = self.ctx.memory
        live = [rec.nbytes for key, rec in self._live.items()
                if (ledger.counted(key) or ("",))[0] == "gathered"]
        phase = self.ctx.phase_name
        self.gathered[phase] = max(self.gathered.get(phase, 0), sum(live))
        self.tiles[phase] = max(self.tiles.get(phase, 0), live.count(self.tile_bytes))


@functools.lru_cache(maxsize=None)
def _observed(tiles: int, checkpoint_activations: int = 0) -> _GatheredPeak:
    seen = []

    def make(ctx):
        seen.append(_GatheredPeak(ctx, 2 * MLP // tiles))
        return seen[-1]

    with mock.patch.object(threads, "Observer", make):
        train(TrainConfig.of(stage=3, n_d=2, model=M, steps=1, tiles=tiles,
                          checkpoint_activations=checkpoint_activations),
              cluster=VirtualCluster(2, observe=True))
    return seen[0]


@pytest.mark.claim("C-I3")
def test_a_tiled_run_gathers_one_mlp_tile_at_a_time(claim_values):
    """Stage 3 with tiles T: the observer sees at most the block's other parameters plus one
    tile gathered in forward — 2·(rest + MLP/T) bytes, the MLP's part ÷ T — and in backward
    (each tile gathered again for its gradients) never two tiles at once, nor more than the
    block without its MLP: the block's whole 2·(rest + MLP) at T = 1."""
    rest = 2 * (M.units(2)[1].numel - MLP)               # fp16 bytes of a block but its MLP
    seen = {t: _observed(t) for t in (1, 2, 4)}
    for t, o in seen.items():
        assert o.gathered["forward"] == rest + 2 * MLP // t
    assert seen[1].gathered["backward"] == rest + 2 * MLP    # untiled: the whole block again
    for t in (2, 4):
        assert seen[t].tiles == {"setup": 0, "forward": 1, "backward": 1, "step": 0, "param_sync": 0}
        assert seen[t].gathered["backward"] == rest   # the block's other parameters, regathered
    seen = {t: o.gathered for t, o in seen.items()}
    fwd = ", ".join(f"T={t}: {g['forward']:,} B" for t, g in seen.items())
    claim_values(f"gathered at forward's peak {fwd}"
                 f" (the MLP's {2 * MLP:,} B ÷ T)", "tiling divides the MSWM by T (C-I3)",
                 f"stage 3, N_d 2, hd {D}, d_ff {F_}")


def test_tiled_run_table(md_snapshot):
    """spec/infinity.md's tiled-run table: per T, the bytes gathered at forward's peak, the
    block's parameters but its MLP, and the MLP's share (stage 3, N_d 2, hd 16, d_ff 64)."""
    from zerospec.render.format import markdown
    rest = 2 * (M.units(2)[1].numel - MLP)
    rows = [[f"{t}", f"{_observed(t).gathered['forward']:,}", f"{rest:,}", f"{2 * MLP // t:,}"]
            for t in (1, 2, 4)]
    assert md_snapshot == markdown(["T", "gathered at forward's peak (B)", "the block but its MLP (B)",
                                    "the MLP ÷ T (B)"], rows)


def test_stages_are_bit_identical_at_a_fixed_tiling():
    """At the same T, stages 0–3 run the same math path: losses and master weights bit for bit."""
    runs = [train(TrainConfig(stage=s, n_d=2, model=M, steps=2, offload=OffloadOptions(tiles=2))) for s in range(4)]
    for r in runs[1:]:
        assert_same_training(runs[0], r)


def test_tiles_hold_the_untiled_parameters_and_psi():
    """Tiling moves parameters, draws none: the tiles put back together are the untiled init bit
    for bit, and Ψ is the same for every T."""
    plain = gpt.init_params(M, 0)
    for t in (2, 4):
        tiled = gpt.init_params(M, 0, t)
        assert sum(u.numel for u in M.units(2, tiles=t)) == M.psi
        for i in range(M.n_layer):
            tiles = [tiled[f"h.{i}.mlp{k}"] for k in range(t)]
            for name in ("mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight"):
                dim = 1 if name == "mlp.c_proj.weight" else 0
                assert torch.equal(torch.cat([x[name] for x in tiles], dim), plain[f"h.{i}"][name])
            assert set(tiled[f"h.{i}"]) | {"mlp.c_fc.weight", "mlp.c_fc.bias",
                                           "mlp.c_proj.weight"} == set(plain[f"h.{i}"])


@pytest.mark.claim("C-I3")
def test_the_runs_tiled_mlp_is_within_the_derived_bound():
    """The run's own tiled MLP (gpt.tiled_mlp) against one matmul: the output and the input
    gradient, sums over d_ff that tiling regroups, within 2·γ_K·Σ|xᵢyᵢ| (K = d_ff + 1 with the
    bias, d_ff: tiling.reorder_bound), and not equal. (The weight gradients are the same dot
    products, but autograd's kernels may order a reduction by the tensor's shape — c_fc's bias
    gradient at T = 4 differs in its last bit on x86 — so they are not claimed bit for bit.)"""
    from contextlib import contextmanager
    from zerospec.offload.tiling import reorder_bound
    g = torch.Generator().manual_seed(0)
    p = {k: v.requires_grad_() for k, v in gpt.init_params(M, 0)["h.0"].items()}
    p["mlp.c_proj.bias"] = (torch.randn(D, generator=g) * .1).requires_grad_()
    h0, dy = torch.randn(8, D, generator=g), torch.randn(8, D, generator=g)
    h = h0.clone().requires_grad_()
    y1 = F.linear(gpt._mlp_in(M, h, p), p["mlp.c_proj.weight"], p["mlp.c_proj.bias"])
    y1.backward(dy)
    a = gpt._mlp_in(M, h0, p).detach()
    terms_y = a.abs() @ p["mlp.c_proj.weight"].detach().abs().T + p["mlp.c_proj.bias"].detach().abs()
    w_fc, w_proj = p["mlp.c_fc.weight"].detach(), p["mlp.c_proj.weight"].detach()
    z = F.linear(h0, w_fc, p["mlp.c_fc.bias"].detach()).requires_grad_()
    F.gelu(z).backward(dy @ w_proj)
    terms_dh = z.grad.abs() @ w_fc.abs()          # Σⱼ |dzⱼ · W_fc[j, :]|: dh's sum over d_ff
    changed = False
    for t in (2, 4):
        tiles = gpt.tile_params(M, gpt.init_params(M, 0) | {"h.0": {k: v.detach()
                                                                    for k, v in p.items()}}, t)
        leaves = {k: {n: v.clone().requires_grad_() for n, v in tiles[f"h.0.mlp{k}"].items()}
                  for k in range(t)}

        @contextmanager
        def fetch(i):
            yield leaves[i - 1]

        hh = h0.clone().requires_grad_()
        y = gpt.tiled_mlp(M, hh, fetch, 1, t, p["mlp.c_proj.bias"].detach())
        y.backward(dy)
        assert torch.all((y.detach() - y1.detach()).abs() <= reorder_bound(terms_y, F_ + 1))
        assert torch.all((hh.grad - h.grad).abs() <= reorder_bound(terms_dh, F_))
        changed |= not torch.equal(y.detach(), y1.detach()) or not torch.equal(hh.grad, h.grad)
    assert changed   # the order did change something: the bound is not vacuous


@pytest.mark.parametrize("tiles", [0, 7, "2", True])
def test_a_tiling_that_does_not_divide_d_ff_is_one_error_naming_it(tiles):
    """tiles must be an integer >= 1 dividing d_ff: one ValueError naming the value and d_ff."""
    with pytest.raises(ValueError, match=rf"tiles must be an integer >= 1 dividing the MLP's "
                                         rf"d_ff = 64, got {tiles!r}"):
        TrainConfig(stage=3, n_d=2, model=M, offload=OffloadOptions(tiles=tiles))


@pytest.mark.parametrize("stage", [1, 3])
def test_activation_checkpointing_of_a_tiled_run_is_bit_identical_to_the_tiled_run(stage):
    """The recompute runs the same tiles in the same order: every loss and master weight of
    tiles + activation checkpointing equals the tiled run's bit for bit (k = 1 and 2)."""
    tiled = train(TrainConfig.of(stage=stage, n_d=2, model=M, steps=2, tiles=4))
    for k in (1, 2):
        assert_same_training(train(TrainConfig.of(stage=stage, n_d=2, model=M, steps=2, tiles=4,
                                               checkpoint_activations=k)), tiled)


@pytest.mark.claim("C-I3")
def test_with_activation_checkpointing_backward_still_gathers_one_tile_at_a_time():
    """k = 1: the recompute gathers each tile, uses it and lets it go; its backward gathers it
    again. Backward never holds two tiles at once, and at most the block's other parameters
    plus one tile — forward's peak: checkpointing adds no gathered byte to a tiled run."""
    rest = 2 * (M.units(2)[1].numel - MLP)
    for t in (2, 4):
        o = _observed(t, 1)
        assert o.tiles["backward"] == 1
        assert o.gathered["backward"] == o.gathered["forward"] == rest + 2 * MLP // t


def test_with_model_parallelism_each_rank_tiles_its_slice_and_stages_stay_bit_identical():
    """N_m = 2: each MP rank's d_ff / N_m is cut into T tiles, their partial outputs summed, then
    summed over the MP group (the row-parallel exit): stages 0–3 train the same bits at a fixed
    tiling, and P_a, which only moves checkpoints, changes none. Tiling adds no MP collective:
    the MP group's all-reduces and their elements are the untiled run's (Megatron's two per
    block in forward, one after attention and one after the MLP)."""
    runs = [train(TrainConfig.of(stage=s, n_d=2, n_m=2, model=M, steps=2, tiles=2)) for s in range(4)]
    untiled = train(TrainConfig.of(stage=0, n_d=2, n_m=2, model=M, steps=2))
    for rank in range(4):
        mp = [(x.op, x.phase, x.elements_sent) for x in runs[0].comm.records(rank, group="mp")]
        assert mp == [(x.op, x.phase, x.elements_sent) for x in untiled.comm.records(rank, group="mp")]
    runs.append(train(TrainConfig.of(stage=3, n_d=2, n_m=2, model=M, steps=2, tiles=2,
                                  checkpoint_activations=1, partition_activations=True)))
    for r in runs[1:]:
        assert_same_training(runs[0], r)
    with pytest.raises(ValueError, match=r"d_ff / n_m = 64/2 = 32, got 3"):
        TrainConfig.of(stage=3, n_d=2, n_m=2, model=M, tiles=3)


def test_a_tiled_run_saved_and_resumed_continues_bit_for_bit_and_only_at_its_tiling(tmp_path):
    """The checkpoint holds the run's own units (each tile its own): saved after step 1 and
    resumed, the run continues with the uninterrupted run's losses and masters bit for bit; an
    untiled run refuses it, naming the layout."""
    from zerospec.training import checkpoint
    cfg = TrainConfig.of(stage=3, n_d=2, model=M, steps=2, tiles=2)
    whole = train(cfg)
    train(TrainConfig.of(stage=3, n_d=2, model=M, steps=1, tiles=2), save={1: tmp_path / "ck"})
    rest = train(cfg, resume=checkpoint.load(tmp_path / "ck", n_ranks=2))
    assert rest.losses == whole.losses[1:]
    assert all(torch.equal(rest.master[k], whole.master[k]) for k in whole.master)
    with pytest.raises(ValueError, match="the checkpoint's model layout differs from cfg.model"):
        train(TrainConfig(stage=3, n_d=2, model=M, steps=2),
              resume=checkpoint.load(tmp_path / "ck", n_ranks=2))


def test_the_cli_trains_tiled_and_refuses_a_bad_t(capsys):
    """`zerospec train --tiles 4` runs; `--tiles 7` on d_ff 60 exits 2 with one line naming it."""
    from tests.support.cli import run_cli
    code, out, err = run_cli(capsys, "train", "--ranks", "2", "--model", "odd", "--steps", "1",
                             "--tiles", "4")
    assert code == 0, err
    assert_usage_error(capsys, "train", "--ranks", "2", "--model", "odd", "--tiles", "7",
                       named="tiles must be an integer >= 1 dividing the MLP's d_ff = 60, got 7")
