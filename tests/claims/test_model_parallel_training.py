"""Model parallelism with the rest of training: loss scaling, clipping and checkpoint files on the
N_d × N_m grid (P4, P5, P7 with N_m > 1), as the paper's 100B runs combined MP, ZeRO and fp16.

* The overflow vote spans every rank of the grid: an inf in one MP rank's gradient stops its MP
  peers too (a vote over the DP group alone would let the replica's slices step apart).
* The global norm is the one model's: sliced parameters' squares summed over the MP group, a
  replicated parameter (megatron.replicated) counted once, not N_m times. The integer bins of
  zerospec/optim/clip.py make it exact, so the oracle is ``math.fsum`` over the unsharded gradient
  (megatron.unshard of the run's own slices), compared with ``==``. Against an N_m = 1 run the
  gradient itself differs (row-parallel partials are added in another order), and the derived
  tolerance is the triangle inequality: | ‖g_m‖ − ‖g_1‖ | ≤ ‖g_m − g_1‖, the norm of the difference
  of the two runs' own unsharded gradients. Rounding on top: each reported norm is correctly
  rounded (≤ 2^-53 relative, the exact test), and ‖g_m − g_1‖ is one fp64 rounding per square,
  one fsum and one sqrt (≤ 2^-51 relative), so 2^-50 relative on each side covers it — the norm
  is 1-Lipschitz in the gradient, nothing is tuned.
* A checkpoint written at N_d × N_m holds each MP index's slices; it continues at another N_d with
  the same N_m bit for bit when each step sees the same micro-batches (N_d·G fixed, exact sums, as
  at N_m = 1: test_checkpoints.py), and another N_m is refused naming both values.
"""
from __future__ import annotations

import functools
import math
import pathlib

import pytest
import torch

from tests.claims.test_model_parallel import MP_LLAMA, MP_ODD
from tests.support.runs import SCALER, assert_same_training, cached, stage_id, train_with
from zerospec.model import megatron
from zerospec.optim.loss_scale import LossScale
from zerospec.training import checkpoint
from zerospec.training.config import TrainConfig
from zerospec.training.sections import MeshOptions, OptimOptions
from zerospec.training.run import train

CLIP = 0.5                           # below every norm of these runs (1.3–1.7): clipping acts
STEPS = 4
MP_RANK = 1                          # global rank 1 = DP index 0, MP index 1 (comm/groups.py)


def grid_run(stage: int, n_d: int = 2, n_m: int = 2, overflow=None, **kw):
    cfg = TrainConfig.of(stage=stage, n_d=n_d, n_m=n_m, model=MP_ODD, steps=STEPS, **kw)
    return cached(("threads", cfg, overflow), lambda: train_with(cfg, overflow))


FULL = {"loss_scale": SCALER, "clip_grad_norm": CLIP}      # both on
INJECT = {**FULL, "overflow": (2, MP_RANK)}                # MP rank 1's gradient overflows at step 2


# -- the overflow vote and stage equality --------------------------------------------------------
@pytest.mark.parametrize("stage", [pytest.param(s, id=stage_id(s), marks=[pytest.mark.slow] * (s != 3))
                                   for s in (1, 2, 3)])   # the default run: the most sharded stage
@pytest.mark.claim("P4")
def test_with_loss_scaling_and_clipping_every_stage_is_bit_identical_at_a_fixed_n_m(stage):
    """2 × 2 grid, scale 2^10, clip 0.5, an inf on MP rank 1 at step 2: stages 1–3 give DP's bits —
    losses, weights, pre-clip norms, scales and skipped steps."""
    dp, zero = grid_run(0, **INJECT), grid_run(stage, **INJECT)
    assert_same_training(dp, zero)
    assert zero.grad_norms[0] == dp.grad_norms[0] and zero.grad_norms[2:] == dp.grad_norms[2:]
    assert zero.loss_scales == dp.loss_scales == [1024.0, 1024.0, 512.0, 512.0]
    assert all(n > CLIP for n in dp.grad_norms[2:])        # clipping acted


@pytest.mark.parametrize("stage", [pytest.param(0, id=stage_id(0), marks=pytest.mark.slow), 3], ids=stage_id)
@pytest.mark.claim("P4")
def test_an_inf_on_one_mp_rank_is_skipped_by_every_rank_of_the_grid(stage):
    """Rank 1 (MP index 1 of replica 0) makes an inf at step 2; after the DP reduction only MP
    index 1's ranks (1, 3) can hold it, MP index 0's (0, 2) see none — yet all 4 ranks of the
    2 × 2 grid skip it, in one all-reduce max of one element over the whole grid."""
    finite = {}

    def look(step, st):
        if step == 2:
            finite[st.ctx.global_rank] = all(bool(torch.isfinite(st.grad_for_step(i)).all())
                                             for i in range(len(st.units)))
    cfg = TrainConfig.of(stage=stage, n_d=2, n_m=2, model=MP_ODD, steps=3, **FULL)
    r = train_with(cfg, INJECT["overflow"], on_step=look)
    assert len(finite) == 4 and finite[0] and finite[2] and not (finite[1] and finite[3])
    assert [[rep.skipped for rep in o.reports] for o in r.ranks] == [[False, True, False]] * 4
    for rank in range(4):
        votes = r.comm.records(rank, step=2, phase="step", op="all_reduce")   # skipped: no norm
        assert [(v.group, v.group_size, v.numel, v.dtype) for v in votes] == \
            [("world", 4, 1, torch.float32)]


# -- the global norm -----------------------------------------------------------------------------
def _full_grads(model, stage: int, n_d: int, n_m: int, steps: int):
    """(the run, per step the unsharded reduced gradient {"unit/param": fp32}): each MP index's
    slices from its DP rank 0 (stage 0 holds the whole slice), put together by megatron.unshard —
    replicated parameters from MP index 0, once."""
    per_step: dict[int, list] = {}

    def look(step, st):
        if st.ctx.rank == 0:                             # DP rank 0 of each MP index
            g = {f"{u.name}/{n}": t.float().clone()
                 for u, g16 in zip(st.units, st.grad16) for n, t in u.views(g16).items()}
            per_step.setdefault(step, [None] * n_m)[getattr(st.ctx, "global_rank", 0) % n_m] = g
    cfg = TrainConfig(stage=stage, n_d=n_d, model=model, steps=steps,
                      optim=OptimOptions(clip_grad_norm=CLIP), mesh=MeshOptions(n_m=n_m))
    r = train(cfg, on_step=look)
    full = [megatron.unshard(model, per_step[s]) for s in sorted(per_step)]
    return r, full


_full_grads = functools.cache(_full_grads)


def fsum_norm(grads: dict[str, torch.Tensor]) -> float:
    """sqrt(math.fsum(g²)) over every element: the correctly rounded norm of the whole gradient."""
    return math.sqrt(math.fsum(x * x for t in grads.values() for x in t.double().reshape(-1).tolist()))


MODELS = [pytest.param(MP_ODD, 2, id="gpt2-2"), pytest.param(MP_ODD, 4, id="gpt2-4", marks=pytest.mark.slow),
          pytest.param(MP_LLAMA, 2, id="llama-2", marks=pytest.mark.slow)]   # its MP slicing: test_model_parallel


@pytest.mark.parametrize("model,n_m", MODELS)
@pytest.mark.claim("P5")
def test_the_norm_on_the_grid_is_the_exact_norm_of_the_unsharded_gradient(model, n_m):
    """DP and P_os+g+p at N_d = 2 × N_m: each step's pre-clip norm equals, bit for bit, fsum's
    norm of the run's own gradient with the slices put back together (each replicated parameter
    once) — what one process holding the whole model computes from that gradient."""
    dp, full = _full_grads(model, 0, 2, n_m, 3)
    z3 = train(TrainConfig(stage=3, n_d=2, model=model, steps=3,
                           optim=OptimOptions(clip_grad_norm=CLIP), mesh=MeshOptions(n_m=n_m)))
    assert dp.grad_norms == z3.grad_norms == [fsum_norm(g) for g in full]
    once = sum(t.numel() for k, t in full[0].items() if megatron.replicated(*k.split("/", 1)))
    assert once > 0                      # replicated parameters are in the norm (not vacuous)


@pytest.mark.parametrize("model,n_m", MODELS)
@pytest.mark.claim("P5")
def test_the_norm_on_the_grid_is_the_n_m_1_norm_within_the_gradients_own_difference(model, n_m):
    """Step 1 from the same weights: | ‖g‖(N_m) − ‖g‖(N_m = 1) | ≤ ‖g(N_m) − g(1)‖ (triangle
    inequality, derived in the module docstring); the gradients differ (sum order), not the norm."""
    mp, one = _full_grads(model, 0, 2, n_m, 1), _full_grads(model, 0, 2, 1, 1)
    g_m, g_1 = mp[1][0], one[1][0]
    assert g_m.keys() == g_1.keys()
    diff = math.sqrt(math.fsum(float(x) ** 2 for k in g_1 for x in (g_m[k].double() - g_1[k].double())
                               .reshape(-1).tolist()))
    gap = abs(mp[0].grad_norms[0] - one[0].grad_norms[0])
    assert gap <= diff * (1 + 2.0 ** -50) + 2.0 ** -50 * one[0].grad_norms[0]
    assert diff > 0                      # the two gradients do differ: the bound is not 0 = 0


# -- checkpoints -----------------------------------------------------------------------------------
BATCH, SAVED = 4, 2
CKPT = {"global_batch": BATCH, "clip_grad_norm": CLIP, "exact_grads": True,
        "loss_scale": LossScale(init_scale=2.0 ** 8, growth_interval=1)}
# (stage, N_d, G) with N_d·G = 4 = the original's 2 × 2: the same micro-batches each step
CONTINUATIONS = [(0, 1, 4), (1, 2, 2), (3, 1, 4)]


def ckpt_cfg(stage: int, n_d: int, g: int, steps: int = STEPS, n_m: int = 2) -> TrainConfig:
    return TrainConfig.of(stage=stage, n_d=n_d, n_m=n_m, model=MP_ODD, steps=steps,
                          grad_accum_steps=g, **CKPT)


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> pathlib.Path:
    return tmp_path_factory.mktemp("mpckpt") / f"step-{SAVED}"


@functools.cache
def _original(path: pathlib.Path):
    """P_os+g+p on 2 × 2, G = 2, uninterrupted, writing the checkpoint after step 2."""
    return train(ckpt_cfg(3, 2, 2), save={SAVED: path})


@pytest.fixture(scope="module")
def original(saved):
    return _original(saved)


@pytest.mark.parametrize("stage,n_d,g", [pytest.param(*c, id=f"{stage_id(c[0])}/nd={c[1]}/G={c[2]}",
                                                      marks=[pytest.mark.slow] * (c[0] == 0))
                                         for c in CONTINUATIONS])   # the default run: the sharded stages
@pytest.mark.claim("P7")
def test_a_checkpoint_of_the_grid_continues_at_another_n_d_bit_identically(original, saved, stage, n_d, g):
    """Written by 2 × 2 after step 2, loaded at N_d × 2 (N_d·G = 4): steps 3–4 equal the
    uninterrupted run bit for bit — losses of every rank, weights, norms, loss scales."""
    c = train(ckpt_cfg(stage, n_d, g), resume=checkpoint.load(saved, n_ranks=n_d, model=MP_ODD))
    assert c.losses == original.losses[SAVED:] and c.loss_scales == original.loss_scales[SAVED:]
    assert c.grad_norms == original.grad_norms[SAVED:]
    assert all(torch.equal(c.master[k], original.master[k]) for k in original.master)


@pytest.mark.claim("P7")
def test_the_grid_checkpoint_holds_each_mp_slice_and_consolidates_to_the_whole_model(original, saved):
    """Its files hold every MP index's slice exactly as a run stopped after step 2 kept it, and
    consolidate(dir, model) puts them back together into that run's fp32 weights."""
    stopped = train(ckpt_cfg(3, 2, 2, steps=SAVED), keep_state=True)
    ck, st = checkpoint.load(saved), stopped.state()
    assert ck.meta["n_m"] == 2 and [n for n, _ in ck.spec] == [n for n, _ in st.spec]
    assert [n for n, _ in ck.spec][:2] == ["mp0/embed", "mp0/h.0"]
    for kind in checkpoint.KINDS:
        assert all(torch.equal(a, b) for a, b in zip(ck.tensors[kind], st.tensors[kind]))
    with pytest.raises(checkpoint.CheckpointError, match="holds n_m=2 model-parallel slices"):
        checkpoint.consolidate(saved)                  # joining slices needs the model's shapes
    full = checkpoint.consolidate(saved, model=MP_ODD)
    assert full.keys() == stopped.master.keys()
    assert all(torch.equal(full[k], stopped.master[k]) for k in full)


@pytest.mark.parametrize("n_m,other", [(2, 1), (1, 2)])
def test_resuming_at_another_n_m_is_refused_naming_both(tmp_path, n_m, other):
    """A checkpoint holds the slices of its N_m: a run at another N_m is refused, naming both."""
    train(ckpt_cfg(0, 1, 4, steps=1, n_m=n_m), save={1: tmp_path / "c"})
    with pytest.raises(ValueError, match=f"written at n_m={n_m} .* the config has n_m={other}"):
        train(ckpt_cfg(0, 1, 4, steps=2, n_m=other),
              resume=checkpoint.load(tmp_path / "c", n_ranks=1))
