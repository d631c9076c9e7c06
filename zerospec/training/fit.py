"""Memory-fit searches on meta tensors: the largest batch, model, sequence or layer count whose
measured peak fits — one search (:func:`largest`) for the library, the planner's ``--fit`` and the
evaluation's figures.

What fits is decided by the ledger of a real (meta) step, never by a formula: a candidate is run
with :func:`zerospec.training.scale.measure` and fits when its peak — model states, or model
states plus activations and buffers — is at most the device's capacity. The peak does not fall as
the batch, the sequence or the layer count grows, so "fits" is monotone and the search finds its
edge: it extrapolates the line through the last two fitting values until one does not fit, then
alternates an interpolation step (the secant through the bracket: exact in one step where the peak
is linear), a step to the interpolated value's neighbour, and a bisection step (so at most about
2·log2 of the range). It answers only once it has measured the answer fitting and the next value
not fitting (or the bound). Used by C17 (Table 2's largest model per MP degree), C34 (the batch P_a
makes room for), C56, ``plan --explain --fit`` and the evaluation's Figures 4 and 6.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

from .config import TrainConfig
from .scale import ScaleResult, measure

BOUND = 1 << 16     # the default upper bound (a micro-batch search of a model with no activations)


@dataclasses.dataclass(frozen=True)
class Edge:
    """The largest fitting value (None: not even the smallest) and every value measured."""

    value: int | None
    bound: int                       # the search's upper bound: ``value == bound`` means all fit
    peaks: dict[int, int]            # value → the step's peak, each one meta step

    @property
    def steps(self) -> int:
        return len(self.peaks)


def largest(peak: Callable[[int], int], capacity: int, lo: int = 1, hi: int | None = None,
            probes: tuple[int, ...] = ()) -> Edge:
    """The largest x in [lo, hi] with peak(x) <= capacity, for a non-decreasing ``peak`` (hi None:
    :data:`BOUND`, searched by extrapolation); ``probes``: values measured first, whose line is
    the first guess (the evaluation's layer counts)."""
    bound = BOUND if hi is None else hi
    seen: dict[int, int] = {}

    def p(x: int) -> int:
        if x not in seen:
            seen[x] = peak(x)
        return seen[x]

    for x in probes:
        p(x)
    good = max((x for x in seen if seen[x] <= capacity), default=None)
    bad = min((x for x in seen if seen[x] > capacity), default=None)
    if good is None:             # no probe fits (or none given): the smallest value must
        if p(lo) > capacity:
            return Edge(None, bound, seen)
        good = lo
    if hi is not None and bad is None:
        if p(hi) <= capacity:
            return Edge(hi, bound, seen)
        bad = hi
    while bad is None:          # no bracket yet: extrapolate the line through the last two fits
        prev = max((x for x in seen if x < good), default=None)
        if prev is None or seen[good] == seen[prev]:
            guess = 2 * good
        else:
            slope = (seen[good] - seen[prev]) / (good - prev)
            guess = good + int((capacity - seen[good]) // slope) + 1
        x = min(max(guess, good + 1), bound)
        if p(x) <= capacity:
            if x == bound:
                return Edge(bound, bound, seen)
            good = x
        else:
            bad = x
    mode, last_fit = "secant", True
    while bad - good > 1:
        if mode == "secant" and seen[bad] > seen[good]:
            x = good + int((capacity - seen[good]) * (bad - good) // (seen[bad] - seen[good]))
            x, mode = min(max(x, good + 1), bad - 1), "confirm"
        elif mode == "confirm":      # the secant's neighbour: exact where the peak is linear
            x, mode = (good + 1 if last_fit else bad - 1), "bisect"
        else:
            x, mode = (good + bad) // 2, "secant"
        last_fit = p(x) <= capacity
        if last_fit:
            good = x
        else:
            bad = x
    return Edge(good, bound, seen)


def peak(result: ScaleResult, rank: int = 0, states_only: bool = False) -> int:
    """The measured peak bytes of ``rank``: its whole step's, or its model states'."""
    return result.model_states(rank) if states_only else result.memory(rank).peak_total


def max_micro_batch(model, stage: int, n_d: int, capacity: int, seen: dict | None = None,
                    **kw) -> int:
    """The most sequences per GPU (per MP group with N_m > 1) whose step peaks within
    ``capacity`` bytes on every rank class; ``kw`` as :func:`measure` (n_m, P_a, …). ``seen``, if
    given, receives each measured step by batch, the answer's among them (not measured again)."""
    seen = {} if seen is None else seen

    def highest(b: int) -> int:
        cfg = TrainConfig.of(model=model, stage=stage, n_d=n_d, **kw)
        r = seen[b] = measure(cfg, micro_batch=b)
        return max(c.memory.peak_total for c in r.classes)
    return largest(highest, capacity).value or 0


def max_layers(make_model: Callable[[int], object], stage: int, n_d: int, capacity: int,
               **kw) -> int:
    """The most layers L whose model ``make_model(L)`` keeps its model states within ``capacity``
    per GPU (measured after setup; Table 2's cells are model states only)."""
    def states(L: int) -> int:
        r = measure(TrainConfig.of(model=make_model(L), stage=stage, n_d=n_d, **kw),
                    setup_only=True)
        return max(c.model_states for c in r.classes)
    return largest(states, capacity).value or 0
