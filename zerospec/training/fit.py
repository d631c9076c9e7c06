"""Memory-fit searches on meta tensors: the largest batch, or model, whose measured peak fits.

What fits is decided by the ledger of a real (meta) step, never by a formula: a candidate is run
with :func:`zerospec.training.scale.measure` and fits when its peak — model states, or model
states plus activations and buffers — is at most the device's capacity. Memory only grows with
the batch and with the layer count, so the search doubles until a candidate does not fit, then
bisects: about 2·log2(answer) measured steps. Used by C17 (Table 2's largest model per MP
degree), C34 (the batch P_a makes room for) and the evaluation's Figure 6.
"""
from __future__ import annotations

from typing import Callable

from .config import TrainConfig
from .scale import ScaleResult, measure


def largest(fits: Callable[[int], bool], start: int = 1) -> int:
    """The largest n >= ``start`` with ``fits(n)`` (``fits`` monotone: true, then false); 0 if
    ``fits(start)`` is false."""
    if not fits(start):
        return 0
    lo, hi = start, start * 2
    while fits(hi):
        lo, hi = hi, hi * 2
    while hi - lo > 1:           # fits(lo), not fits(hi)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def peak(result: ScaleResult, rank: int = 0, states_only: bool = False) -> int:
    """The measured peak bytes of ``rank``: its whole step's, or its model states'."""
    return result.model_states(rank) if states_only else result.memory(rank).peak_total


def max_micro_batch(model, stage: int, n_d: int, capacity: int, seen: dict | None = None,
                    **kw) -> int:
    """The most sequences per GPU (per MP group with N_m > 1) whose step peaks within
    ``capacity`` bytes on every rank class; ``kw`` as :func:`measure` (n_m, P_a, …). ``seen``, if
    given, receives each measured step by batch, the answer's among them (not measured again)."""
    seen = {} if seen is None else seen

    def fits(b: int) -> bool:
        cfg = TrainConfig.of(model=model, stage=stage, n_d=n_d, **kw)
        r = seen[b] = measure(cfg, micro_batch=b)
        return all(c.memory.peak_total <= capacity for c in r.classes)
    return largest(fits)


def max_layers(make_model: Callable[[int], object], stage: int, n_d: int, capacity: int,
               **kw) -> int:
    """The most layers L whose model ``make_model(L)`` keeps its model states within ``capacity``
    per GPU (measured after setup; Table 2's cells are model states only)."""
    def fits(L: int) -> bool:
        r = measure(TrainConfig.of(model=make_model(L), stage=stage, n_d=n_d, **kw),
                    setup_only=True)
        return all(c.model_states <= capacity for c in r.classes)
    return largest(fits)
