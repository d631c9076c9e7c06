"""Mixed-precision Adam on fp32 master shards (C2: K = 12 bytes per parameter = master + m + v).

The update is elementwise, and written only with single, correctly rounded operations (mul, add,
div, sqrt) — no fused ``addcmul``/``lerp``, whose vectorised and scalar paths may round differently.
So updating a 1/N shard gives, element for element, exactly the bits of updating the whole vector:
the optimizer step is where stages 1–3 could silently diverge, and here they cannot.

It is the update rule of ``torch.optim.Adam`` (bias-corrected, eps added after the square root,
L2 weight decay added to the gradient), which the single-process reference uses.
"""
from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass(frozen=True)
class AdamConfig:
    lr: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0

    def __post_init__(self):
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr!r}")
        for name in ("beta1", "beta2"):
            b = getattr(self, name)
            if not 0.0 <= b < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {b!r}")
        if not self.eps > 0:
            raise ValueError(f"eps must be > 0, got {self.eps!r}")


def adam_update(master: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor,
                grad: torch.Tensor, step: int, cfg: AdamConfig, grad_mul: float = 1.0) -> None:
    """One Adam step in place on fp32 ``master``/``exp_avg``/``exp_avg_sq`` from ``grad`` (any dtype,
    cast up) times ``grad_mul`` (1/loss scale × clip coefficient). ``step`` counts from 1."""
    # One scratch buffer, reused in place: the same elementwise operations in the same order as
    # the expressions in the comments, without a fresh multi-MB allocation (and its page faults)
    # per operation. The gradient is only read; it is copied (to fp32) only to be scaled.
    g = grad
    if grad.dtype != torch.float32 or grad_mul != 1.0 or cfg.weight_decay:
        g = grad.to(torch.float32, copy=True)   # an fp32 gradient must not be modified through g
    if grad_mul != 1.0:   # one correctly rounded multiply; skipped at 1 so unscaled runs keep their bits
        g.mul_(grad_mul)
    if cfg.weight_decay:
        g.add_(master * cfg.weight_decay)
    tmp = g * (1.0 - cfg.beta1)
    exp_avg.mul_(cfg.beta1).add_(tmp)                          # m = β1·m + (1−β1)·g
    torch.mul(g, g, out=tmp).mul_(1.0 - cfg.beta2)
    exp_avg_sq.mul_(cfg.beta2).add_(tmp)                       # v = β2·v + (g·g)·(1−β2)
    bias1 = 1.0 - cfg.beta1 ** step
    bias2 = 1.0 - cfg.beta2 ** step
    torch.div(exp_avg_sq, bias2, out=tmp).sqrt_().add_(cfg.eps)  # denom = sqrt(v/bias2) + eps
    torch.div(exp_avg, tmp, out=tmp).mul_(cfg.lr / bias1)
    master.sub_(tmp)                                           # w -= (m/denom)·(lr/bias1)


def reference_optimizer(params, cfg: AdamConfig) -> torch.optim.Adam:
    """torch's own Adam with the same hyper-parameters, for the fp32 single-process reference."""
    return torch.optim.Adam(params, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps,
                            weight_decay=cfg.weight_decay, foreach=False)


def update_bound(steps: int, cfg: AdamConfig) -> float:
    """An upper bound on |w_t − w_0| summed over ``steps`` Adam updates, whatever the gradients:
    so two runs from the same weights differ by at most twice this per element (spec/model_parallel.md
    derives it; it is how runs whose gradients differ only by rounding are compared).

    m_t = (1−β1)·Σ_k β1^k g_{t−k}, v_t = (1−β2)·Σ_k β2^k g²_{t−k} (k < t). By Cauchy–Schwarz,
    |Σ β1^k g| ≤ sqrt(Σ (β1²/β2)^k) · sqrt(Σ β2^k g²), so with the bias corrections
    |m̂_t| / sqrt(v̂_t) ≤ (1−β1)/(1−β1^t) · sqrt((1−β2^t)/(1−β2)) · sqrt(Σ_{k<t} (β1²/β2)^k)
    (= 1 at t = 1); eps only shrinks the update. Each step's fp32 arithmetic (eight correctly
    rounded operations) is covered by a factor 1 + 2⁻²⁰. Needs β1² < β2 and no weight decay."""
    b1, b2 = cfg.beta1, cfg.beta2
    if cfg.weight_decay or not b1 * b1 < b2:
        raise ValueError(f"update_bound needs weight_decay = 0 and beta1² < beta2, got "
                         f"weight_decay={cfg.weight_decay}, beta1={b1}, beta2={b2}")
    total = 0.0
    for t in range(1, steps + 1):
        geo = sum((b1 * b1 / b2) ** k for k in range(t))
        total += (1 - b1) / (1 - b1 ** t) * ((1 - b2 ** t) / (1 - b2)) ** 0.5 * geo ** 0.5
    return cfg.lr * total * (1 + 2.0 ** -20)
