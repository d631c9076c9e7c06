"""Global-norm gradient clipping from shards, with the same bits in every stage.

The global norm is ‖g‖ over every real gradient element, each counted once. No rank of stages
1–3 holds the whole gradient, so the norm is assembled from partial sums of squares — and
floating-point addition is not associative, so *where* each partial is taken decides the bits.
zerospec fixes one summation order and makes every stage follow it:

* Lay each unit out as stages 1–3 do for N ranks (padded to a multiple of N, rank r owns chunk r);
  the *partial* of (rank r, unit u) is the fp32 sum of squares of the real elements of chunk r —
  padding is excluded by construction, and every element is in exactly one chunk.
* Rank r adds its partials in unit order (fp32). Stage 0 holds the whole gradient, but rank r
  still takes only chunk r's partials: the chunk layout is a choice of summation order, not of
  where memory lives.
* The N per-rank sums are all-gathered (N fp32 values — exact copies, whatever the backend) and
  every rank adds them in rank order 0, 1, …, N−1 in fp32. An all-reduce would be shorter, but
  gloo's ring adds ranks in an order of its own; a gather moves bits, it does not round them.

So stage 0's norm is the same number as stage 3's (test: tests/claims/test_robustness.py), and it
is the unsharded norm up to fp32 summation order (tolerance derived there). The coefficient is
torch's ``clip_grad_norm_``: ``max_norm / (norm + 1e-6)``, applied only when it is below 1.
"""
from __future__ import annotations

import dataclasses

import torch

EPS = 1e-6   # torch.nn.utils.clip_grad_norm_'s guard against a zero norm


def chunk_of(unit, n_d: int, rank: int) -> tuple[int, int]:
    """[start, stop) of rank ``rank``'s real elements of ``unit`` under the padded N-rank layout."""
    laid = dataclasses.replace(unit, n_d=n_d, pad=True)
    start = laid.shard(rank).start
    return start, start + laid.real_in_shard(rank)


def partial_sum_sq(grad: torch.Tensor) -> torch.Tensor:
    """fp32 sum of squares of ``grad`` (a fresh fp32 copy, so its layout cannot change the sum)."""
    g = grad.to(torch.float32, copy=True)
    return (g * g).sum()


def rank_sum_sq(stage) -> torch.Tensor:
    """This rank's share of ‖g‖²: its chunk's partials, added in unit order (fp32 scalar)."""
    rank, n_d = stage.ctx.rank, stage.ctx.n_ranks
    total = torch.zeros((), dtype=torch.float32)
    for i, u in enumerate(stage.units):
        start, stop = chunk_of(u, n_d, rank)
        own = stage._owned(u).start        # where the stage's owned gradient starts in the unit
        total += partial_sum_sq(stage._grad_for_step(i)[start - own:stop - own])
    return total


def global_norm(stage) -> float:
    """‖g‖ of the stage's reduced (still loss-scaled) gradient, equal in every stage and rank."""
    n_d = stage.ctx.n_ranks
    mine = rank_sum_sq(stage).reshape(1).to(stage.ctx.device)
    every = torch.empty(n_d, dtype=torch.float32, device=stage.ctx.device)
    stage.comm.all_gather(every, mine)
    total = torch.zeros((), dtype=torch.float32)
    for r in range(n_d):                   # rank order, fp32, as a rank-ordered reduction would
        total += every[r].cpu()
    return float(total.sqrt())


def clip_coefficient(norm: float, max_norm: float) -> float:
    """The factor applied to the gradient: 1 unless the norm exceeds ``max_norm``."""
    coef = max_norm / (norm + EPS)
    return coef if coef < 1.0 else 1.0
