"""Table 3's configurations through the caching allocator model: Figure 7's cached memory (C48)
and Figure 6's fit with fragmentation (C47).

A GPU runs out on what PyTorch's caching allocator has reserved, not on what the tensors hold.
:func:`step_memory` measures one meta step of a configuration with its complete storage trace
(``measure(..., trace=True)``: every storage a rank makes and lets go, temporaries included) and
replays each rank class's trace through the allocator model (zerospec/runtime/allocator.py,
spec/allocator.md): the ledger's peak, the allocated and the reserved ("cached") peaks on a
device without a limit, and whether the step runs out on a device of ``capacity`` bytes.

:func:`c30_trace` is C30's case (GPT-2 1.5B, P_os+g+p, N_d = 400) traced once per process: the
report's fragmentation figure and the claim tests read the same trace.

:func:`max_layers_replayed` is Figure 6's search with the allocator's OutOfMemory as the fit
criterion. Fitting is not monotone in L under fragmentation (a step may run out where one more
layer fits), so the search does not bisect: it finds L_a, the most layers whose allocated peak
(what the step holds, no fragmentation) is within the capacity — L_a + 1 cannot fit whatever the
allocator does — and walks down from L_a replaying each L at the capacity; the answer is the
first that fits, every L above it up to L_a measured to run out. A step's rank classes (at 400
GPUs and MP 16: ranks 0–23 and the padded last) are stepped one at a time where one settles the
verdict: a layer count runs out once one GPU does, and holds more than the device once one GPU
does; "fits" (the answer, L_a, and the two probes whose line is the first guess) steps them all.
``StepMemory.classes`` says how many a step saw. A step asked whether it runs out is replayed on
the capacity while it runs (``measure(..., capacity=)``, zerospec/runtime/replay.py's
LiveReplay) and ends at its first OutOfMemory: the same OOMPoint as the whole trace's replay, its
peaks only up to there (``StepMemory.stopped``).
"""
from __future__ import annotations

import dataclasses

from ..model.presets import gpt, preset
from ..paper import evaluation as ev
from ..paper.hardware import DGX2
from ..runtime.trace import OOMPoint, replay
from ..training.config import TrainConfig
from ..training.scale import measure
from ..training.sections import ZeroROptions
from ..training.fit import largest
from .configs import CONFIGS, FIG6, FIG6_PROBES, ZeroConfig
from .runs import memoised


@dataclasses.dataclass(frozen=True)
class StepMemory:
    """One meta step's memory, the highest of the rank classes stepped (bytes): every class of
    the step unless a search stopped at the first that settled its question, each to its end
    unless it ran out (``stopped``: its peaks are up to the OOM); ``complete``: both."""

    ledger: int              # the ledger's peak: what the stage code counts
    allocated: int           # the allocator's allocated peak: every storage, rounded to 512 B
    reserved: int            # its reserved peak without a limit: PyTorch's "max cached memory"
    oom: OOMPoint | None     # the first rank class's OutOfMemory on a device of the capacity
    samples: list[tuple[int, int]] | None = None   # rank class 0's (allocated, reserved) series
    classes: int = 1         # rank classes stepped, the first ones in rank order ...
    of: int = 1              # ... of the step's
    stopped: bool = False    # a class's step ended at its OOM: the peaks are up to there

    @property
    def complete(self) -> bool:
        """Every rank class stepped, each to the end of its step: whole-step peaks."""
        return self.classes == self.of and not self.stopped


UNTIL = ("oom", "over")      # step_memory's verdicts that one rank class settles


def settled(m: StepMemory, until: str | None, capacity: int | None) -> bool:
    """Whether ``m`` answers ``until``: every class stepped; or one of them ran out ("oom"), or
    held more than ``capacity`` at its allocated peak ("over"). What "fits" needs is every
    class; that one GPU runs out, or holds more than the device, needs that GPU alone."""
    return m.complete or (until == "oom" and m.oom is not None) or (
        until == "over" and capacity is not None and m.allocated > capacity)


def step_memory(config: ZeroConfig, layers: int, capacity: int | None = None, *, gpus: int,
                n_m: int, micro_batch: int, d: int, heads: int, samples: bool = False,
                until: str | None = None, start: StepMemory | None = None) -> StepMemory:
    """One meta step of ``config`` for ``layers`` blocks of width ``d``, each rank class's storage
    trace replayed twice: without a limit (the peaks) and on ``capacity`` bytes (the OOM).
    ``until`` ("oom" or "over", :func:`settled`): step the classes one at a time, in rank order,
    and stop at the first that settles it, each replayed on ``capacity`` as it runs for "oom"
    and ended at its OOM (``stopped``); ``start``: such a partial StepMemory of the same step,
    to go on from (one that stopped is stepped again, but for "oom": its peaks are partial)."""
    if until not in (None, *UNTIL):
        raise ValueError(f"until must be one of {UNTIL} or None, got {until!r}")
    cfg = TrainConfig.of(model=gpt(layers, d, heads), stage=config.stage, n_d=gpus // n_m,
                         **config.kwargs(n_m))
    if until is None and start is None:
        r = measure(cfg, micro_batch=micro_batch, trace=True)
        return _combine([_one(c, capacity, samples and i == 0)
                         for i, c in enumerate(r.classes)], len(r.classes))
    m = None if start is not None and start.stopped and until != "oom" else start
    live = capacity if until == "oom" and capacity else None
    while m is None or not settled(m, until, capacity):
        i = 0 if m is None else m.classes
        r = measure(cfg, micro_batch=micro_batch, trace=True, only=i, capacity=live)
        c, replayed = r.classes[0], live
        if c.oom is not None and c.oom.phase is None:
            # it ran out outside every phase, so no marker followed to name the phase the whole
            # step's replay names (the next one's): that step, whole, replayed after
            c, replayed = measure(cfg, micro_batch=micro_batch, trace=True, only=i).classes[0], None
        m = _combine(([m] if m else []) + [_one(c, capacity, samples and i == 0, replayed)],
                     r.class_count)
    return m


def _one(c, capacity: int | None, samples: bool, live: int | None = None) -> StepMemory:
    """One rank class's trace replayed: free (its peaks), and on ``capacity`` (its OOM); ``live``:
    it was replayed on that capacity as it ran, and ended at ``c.oom`` if it ran out."""
    if c.oom is not None:        # stopped at its OOM: the free replay's peaks up to the request
        free = replay(c.allocations[:c.oom.event], samples=samples)
        return StepMemory(c.memory.peak_total, free.peak_allocated, free.peak_reserved, c.oom,
                          free.samples if samples else None, stopped=True)
    free = replay(c.allocations, samples=samples)
    # a device refuses a segment only past its capacity: where the free replay never reserved that
    # much, the capped one is the same replay and cannot run out (tests/unit/runtime/test_allocator.py)
    oom = replay(c.allocations, capacity).oom \
        if capacity and not live and free.peak_reserved > capacity else None
    return StepMemory(c.memory.peak_total, free.peak_allocated, free.peak_reserved, oom,
                      free.samples if samples else None)


def _combine(parts: list[StepMemory], of: int) -> StepMemory:
    """Rank classes stepped in rank order (a partial StepMemory's first): their highest peaks,
    the first OOM, the first class's samples."""
    return StepMemory(ledger=max(p.ledger for p in parts),
                      allocated=max(p.allocated for p in parts),
                      reserved=max(p.reserved for p in parts),
                      oom=next((p.oom for p in parts if p.oom is not None), None),
                      samples=parts[0].samples, classes=sum(p.classes for p in parts), of=of,
                      stopped=any(p.stopped for p in parts))


# C30's micro-batch: the most sequences per GPU whose step needs less than the 32 GB V100 yet runs
# out in backward (on an fp32 gradient of the logits) with over 30% free; one fewer fits
C30_BATCH = 44


def c30_config(md: bool = False) -> TrainConfig:
    """C30's case: GPT-2 1.5B, P_os+g+p at N_d = 400 (one rank class), a checkpoint every 2
    blocks, with or without M_D."""
    return TrainConfig(stage=3, n_d=400, model=preset("1.5B").model,
                       zero_r=ZeroROptions(checkpoint_activations=2, contiguous_checkpoints=md))


@memoised
def c30_trace(micro_batch: int = C30_BATCH, md: bool = False) -> list:
    """C30's case (:func:`c30_config`) at ``micro_batch`` sequences per GPU: rank 0's storage
    trace of one step. The report's fragmentation figure and the claim tests read this one trace."""
    r = measure(c30_config(md), micro_batch=micro_batch, trace=True)
    if len(r.classes) != 1:
        raise AssertionError(f"C30's case has one rank class at N_d = 400, got {len(r.classes)}")
    return r.classes[0].allocations


@memoised
def figure7(size: str, capacity: int | None = DGX2.memory_bytes) -> dict[str, StepMemory]:
    """Figure 7's run ``size`` ("40B": 50 × 8192 at 16 sequences per GPU; "100B": 125 × 8192 at
    32; 400 GPUs, MP 16, [SC] appendix Table 5) under each configuration C1–C5, with rank class
    0's (allocated, reserved) series: the table and the curves read the same steps."""
    run = next((r for r in ev.FIGURE7 if r.size == size), None)
    if run is None:
        raise ValueError(f"Figure 7 has runs {[r.size for r in ev.FIGURE7]}, not {size!r}")
    return {n: step_memory(c, run.layers, capacity, gpus=run.gpus, n_m=run.mp,
                           micro_batch=run.batch_per_gpu, d=run.hd, heads=run.heads,
                           samples=True)
            for n, c in CONFIGS.items()}


def max_layers_replayed(config: ZeroConfig, capacity: int, probes=(8, 16),
                        seen: dict | None = None, **shape) -> int:
    """The most layers whose step runs on ``capacity`` bytes through the allocator model (0 if
    none; see the module doc). ``seen``, if given, receives every measured StepMemory by L."""
    shape = {**FIG6, **shape}
    seen = {} if seen is None else seen

    def at(L: int, until: str | None = None) -> StepMemory:
        m = seen.get(L)
        if m is None or not settled(m, until, capacity):
            m = seen[L] = step_memory(config, L, capacity, until=until, start=m, **shape)
        return m

    for L in probes:                         # the line through them is the first guess: exact
        at(L)
    L = largest(lambda L: at(L, "over").allocated, capacity, probes=probes).value or 0   # L_a
    if L == 0:
        return 0
    while at(L, "oom").oom is not None:      # down past every L that fragmentation stops
        if L == 1:
            return 0
        L -= 1
    return L


def on_device(m: StepMemory) -> str:
    """Whether the step ran on the capacity; if not, the request that failed and what was free
    then (capacity − allocated), in GB to 2 decimals (from integers: the same on every machine)."""
    if m.oom is None:
        return "runs"
    return (f"OOM in {m.oom.phase}: {m.oom.error.requested / 1e9:.2f} GB asked, "
            f"{m.oom.free / 1e9:.2f} GB free")


@memoised
def figure6_replayed() -> dict[str, tuple[int, int, dict[int, StepMemory]]]:
    """Per configuration: (the most layers at hidden 8192 that run on 32 GB through the allocator
    model at 400 GPUs, MP 16, 16 per GPU; L_a, the most whose allocated peak is within 32 GB;
    every step measured, by L: the evidence). Some 55 paper-scale steps with traces, 32 of them
    ended at their first GPU's OOM: ~30 s of one core."""
    out = {}
    for name, c in CONFIGS.items():
        seen: dict[int, StepMemory] = {}
        L = max_layers_replayed(c, DGX2.memory_bytes, FIG6_PROBES, seen=seen)
        out[name] = (L, max(k for k, m in seen.items()
                            if m.complete and m.allocated <= DGX2.memory_bytes), seen)
    return out
