"""Global-norm gradient clipping from shards: the exact norm, the same bits in every stage and at
every N.

The global norm is ‖g‖ over every real gradient element, each counted once. No rank of stages
1–3 holds the whole gradient, so ‖g‖² is assembled from per-rank partial sums — and floating-point
addition is not associative: summing fp32 partials chunk by chunk in rank order would give every
stage the same bits at one N, but a different last bit at another N (the chunks move), so a run
resharded from N to M ranks could not reproduce its own clip coefficients.

zerospec computes ‖g‖² *exactly* instead, with integers:

* g is what Adam sees, an fp32 number: ``g = m · 2^(e−24)`` with an integer |m| < 2^24 (frexp).
  So ``g² = m² · 2^(2e−48)``: an integer m² < 2^48 in the binade of exponent e.
* Each rank adds m² into one int64 bin per exponent e (split as m² = hi·2^24 + lo so no bin can
  overflow before 2^39 elements). Integer addition is associative: any split of the elements over
  ranks, chunks or units gives the same bins.
* Stages 1–3 all-reduce the bins (one int64 vector, ``sum``; exact on any backend). Stage 0 holds
  the whole gradient and bins it locally — no collective, the same integers.
* ‖g‖² = Σ_e bin_e · 2^(2e−48) is then an exact integer times a power of two, rounded once to a
  float (Python's int division is correctly rounded), and ‖g‖ is its correctly rounded square root.

With model parallelism the bins are summed over the MP group too, and a parameter every MP rank
holds whole is binned by one of them (:class:`zerospec.optim.update.Reach`): the same integers as
one process holding the whole model.

So the norm is the same number in every stage, at every N, on every backend, and it is the
correctly rounded unsharded norm (test: ``math.fsum`` of the squares gives the same bits). Padding
is excluded because only real elements are binned; each element is binned by exactly one rank.
The coefficient is torch's ``clip_grad_norm_``: ``max_norm / (norm + 1e-6)``, applied below 1.

On meta tensors (which measure bytes, not values) the same kernels run on the same shapes, every
element taken as finite (the shape of the no-overflow step), the bins' all-reduce is booked as a
real run books it, and Adam's one multiply by the coefficient is the same operation whatever its
value: a meta step makes clipping's bytes as a real one does, and its norm is nan (no value).
"""
from __future__ import annotations

import math

import torch

EPS = 1e-6                       # torch.nn.utils.clip_grad_norm_'s guard against a zero norm
EXP_MIN, EXP_MAX = -148, 128     # frexp exponents of finite fp32 numbers (2^-149 = 0.5·2^-148)
N_BINS = EXP_MAX - EXP_MIN + 1
LOW = 2 ** 24


def square_bins(grad: torch.Tensor) -> torch.Tensor:
    """int64 [hi bins, lo bins, non-finite count]: Σ g² of ``grad`` (cast to fp32), exactly."""
    g = grad.reshape(-1).to(torch.float32)
    out = torch.zeros(2 * N_BINS + 1, dtype=torch.int64, device=g.device)
    finite = torch.isfinite(g)
    out[-1] = (~finite).sum()
    # the finite elements: all of them on meta, which has no values (module doc)
    g = g.clone() if g.device.type == "meta" else g[finite]
    mant, exp = torch.frexp(g)
    m = (mant.abs() * LOW).to(torch.int64)          # exact: at most 24 significant bits
    sq = m * m                                      # < 2^48: exact in int64
    idx = (exp.to(torch.int64) - EXP_MIN)
    out[:N_BINS].index_add_(0, idx, sq >> 24)
    out[N_BINS:2 * N_BINS].index_add_(0, idx, sq & (LOW - 1))
    return out


def owned_bins(stage, counts=None) -> torch.Tensor:
    """This rank's bins over the real elements of the gradient it owns (all of it in stage 0);
    ``counts(unit, param)``, if given, says which parameters this rank bins (model parallelism:
    a parameter replicated across the MP group is binned by one of its ranks only)."""
    total = torch.zeros(2 * N_BINS + 1, dtype=torch.int64, device=stage.ctx.device)
    for i, u in enumerate(stage.units):
        own = stage.owned_slice(u)
        real = max(0, min(own.stop, u.numel) - own.start)   # padding is never binned
        g = stage.grad_for_step(i)[:real]
        if counts is None:
            total += square_bins(g)
            continue
        for p in u.params:         # the owned range cut by parameter: [own.start, own.start + real)
            lo, hi = max(p.offset, own.start), min(p.offset + p.numel, own.start + real)
            if hi > lo and counts(u.name, p.name):
                total += square_bins(g[lo - own.start:hi - own.start])
    return total


def norm_from_bins(bins: torch.Tensor) -> float:
    """‖g‖ from (summed) bins: one correct rounding of the exact Σ g², then a correct sqrt."""
    if int(bins[-1]):
        return math.nan
    exact = 0
    for b in range(N_BINS):
        v = (int(bins[b]) << 24) + int(bins[N_BINS + b])
        if v:
            exact += v << (2 * b)          # bin b holds exponent 2(b + EXP_MIN) − 48
    return math.sqrt(exact / (1 << (48 - 2 * EXP_MIN)))


def global_norm(stage, over="stage", counts=None) -> float:
    """‖g‖ of the stage's reduced (still loss-scaled) gradient: exact, equal everywhere.

    ``over``: the interconnect whose ranks together own every gradient element once, whose bins
    are summed — by default the stage's DP group from stage 1 on, and none in stage 0 (each rank
    already holds every element). With model parallelism the caller passes the grid's (stages
    1–3) or the MP group's (stage 0), and ``counts`` so that a replicated parameter is binned by
    one MP rank: zerospec/optim/update.py's :class:`~.update.Reach`. The bins are integers, so
    the order they are summed in is irrelevant: the same bits at any N_d × N_m split."""
    if over == "stage":
        over = stage.comm if stage.stage > 0 else None
    bins = owned_bins(stage, counts)
    if over is not None:
        bins = over.all_reduce(bins.to(stage.ctx.device), "sum")
    return math.nan if bins.device.type == "meta" else norm_from_bins(bins.cpu())


def clip_coefficient(norm: float, max_norm: float) -> float:
    """The factor applied to the gradient: 1 unless the norm exceeds ``max_norm``."""
    coef = max_norm / (norm + EPS)
    return coef if coef < 1.0 else 1.0
