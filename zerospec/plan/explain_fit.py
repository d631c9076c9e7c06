"""The largest micro-batch and sequence length that fit (``plan --explain --fit``), by meta steps.

The step's peak grows with both (activations are linear in the micro-batch, and linear or
quadratic in the sequence), so "fits" is monotone and a search finds its edge. :func:`largest`
alternates an interpolation step (the secant through the bracket: exact in one step where the
peak is linear) with a bisection step (so at most about 2·log2 of the range), and returns an
answer only once it has measured both it fitting and the next value not fitting (or the bound).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

MAX_MICRO_BATCH = 1 << 16     # the micro-batch search's bound (a model with no activations)


@dataclasses.dataclass(frozen=True)
class Edge:
    """The largest fitting value (None: not even the smallest) and every value measured."""

    value: int | None
    bound: int                       # the search's upper bound: ``value == bound`` means all fit
    peaks: dict[int, int]            # value → the step's peak, each one meta step

    @property
    def steps(self) -> int:
        return len(self.peaks)


def largest(peak: Callable[[int], int], capacity: int, lo: int = 1, hi: int | None = None) -> Edge:
    """The largest x in [lo, hi] with peak(x) <= capacity, for a non-decreasing ``peak``
    (hi None: :data:`MAX_MICRO_BATCH`, searched by extrapolation)."""
    bound = MAX_MICRO_BATCH if hi is None else hi
    seen: dict[int, int] = {}

    def p(x: int) -> int:
        if x not in seen:
            seen[x] = peak(x)
        return seen[x]

    if p(lo) > capacity:
        return Edge(None, bound, seen)
    good, bad = lo, None
    if hi is not None:
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


def step_peak(ex, micro_batch: int | None = None, seq: int | None = None,
              checkpoint_activations: int | None = None, *, n_d: int | None = None,
              stage: int | None = None, settings: dict | None = None) -> int:
    """The ledger peak (the highest rank class's) of ``ex``'s step with another micro-batch,
    sequence length, checkpointing, N_d, stage or settings (each None: the explained step's):
    one meta step."""
    from ..training.config import TrainConfig
    from ..training.scale import measure
    model = dataclasses.replace(ex.model, block_size=ex.seq if seq is None else seq)
    k = ex.checkpoint_activations if checkpoint_activations is None else checkpoint_activations
    kw = {**ex.settings, **(settings or {})}
    if checkpoint_activations is not None:   # Megatron's segments in place of torchtitan's mode
        kw.pop("activation_checkpointing", None)
    cfg = TrainConfig.of(model=model, stage=ex.stage if stage is None else stage,
                         n_d=ex.n_d if n_d is None else n_d, n_m=ex.n_m,
                         checkpoint_activations=k, **kw)
    r = measure(cfg, micro_batch=ex.micro_batch if micro_batch is None else micro_batch)
    return max(c.memory.peak_total for c in r.classes)


def fit_table(ex, units: str = "GB"):
    """The largest micro-batch (at the explained sequence length) and the largest sequence length
    (at the explained micro-batch) whose step peak fits the GPU, each found by meta steps; where
    the step does not checkpoint every block, both again with a checkpoint every block."""
    from ..render.format import Table, fmt_bytes
    t = Table("explain_fit", f"What fits {ex.where} ({fmt_bytes(ex.capacity, units)} per GPU)",
              ["Largest", "Value", "Peak there (bytes)", "Next value's peak (bytes)",
               "Meta steps (new)"])
    # the explained step is one point of each search; where it fits, the search starts there
    # (the peak does not fall as either grows, so every smaller value fits too)
    mb = largest(lambda m: ex.peak if m == ex.micro_batch else step_peak(ex, m, ex.seq),
                 ex.capacity, lo=ex.micro_batch if ex.fits else 1)
    sq = largest(lambda s: ex.peak if s == ex.seq else step_peak(ex, ex.micro_batch, s),
                 ex.capacity, lo=ex.seq if ex.fits else 1, hi=ex.model.block_size)
    rows = [(f"micro-batch at seq {ex.seq}", mb, ex.micro_batch),
            (f"sequence length at micro-batch {ex.micro_batch}", sq, ex.seq)]
    if ex.checkpoint_activations != 1:      # the same searches with recompute traded for memory
        mb1 = largest(lambda m: step_peak(ex, m, ex.seq, 1), ex.capacity)
        sq1 = largest(lambda s: step_peak(ex, ex.micro_batch, s, 1), ex.capacity,
                      hi=ex.model.block_size)
        rows += [(f"micro-batch at seq {ex.seq}, a checkpoint every block", mb1, None),
                 (f"sequence length at micro-batch {ex.micro_batch}, a checkpoint every block",
                  sq1, None)]
    for what, e, mine in rows:
        v = e.value
        nxt = "— (the bound)" if v == e.bound else (f"{e.peaks[v + 1 if v else 1]:,}")
        t.add(what, "none fits" if v is None else f"{v:,}",
              "—" if v is None else f"{e.peaks[v]:,}", nxt, e.steps - (mine in e.peaks))
    t.notes.append("Fits: the ledger's step peak <= the GPU's memory (the allocator model's "
                   "fragmentation comes on top). Sequence length up to the model's context "
                   f"{ex.model.block_size:,}; micro-batch up to {MAX_MICRO_BATCH:,}.")
    return t
