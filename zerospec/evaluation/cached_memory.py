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
first that fits, every L above it up to L_a measured to run out.
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
from .configs import CONFIGS, FIG6, ZeroConfig, boundary
from .runs import memoised


@dataclasses.dataclass(frozen=True)
class StepMemory:
    """One meta step's memory, the highest of any rank class (bytes)."""

    ledger: int              # the ledger's peak: what the stage code counts
    allocated: int           # the allocator's allocated peak: every storage, rounded to 512 B
    reserved: int            # its reserved peak without a limit: PyTorch's "max cached memory"
    oom: OOMPoint | None     # the first rank class's OutOfMemory on a device of the capacity
    samples: list[tuple[int, int]] | None = None   # rank class 0's (allocated, reserved) series


def step_memory(config: ZeroConfig, layers: int, capacity: int | None = None, *, gpus: int,
                n_m: int, micro_batch: int, d: int, heads: int,
                samples: bool = False) -> StepMemory:
    """One meta step of ``config`` for ``layers`` blocks of width ``d``, each rank class's storage
    trace replayed twice: without a limit (the peaks) and on ``capacity`` bytes (the OOM)."""
    r = measure(TrainConfig.of(model=gpt(layers, d, heads), stage=config.stage, n_d=gpus // n_m,
                               **config.kwargs(n_m)), micro_batch=micro_batch, trace=True)
    free = [replay(c.allocations, samples=samples and i == 0) for i, c in enumerate(r.classes)]
    # a device refuses a segment only past its capacity: where the free replay never reserved that
    # much, the capped one is the same replay and cannot run out (tests/unit/runtime/test_allocator.py)
    capped = [replay(c.allocations, capacity).oom if f.peak_reserved > capacity else None
              for c, f in zip(r.classes, free)] if capacity else []
    return StepMemory(ledger=max(c.memory.peak_total for c in r.classes),
                      allocated=max(f.peak_allocated for f in free),
                      reserved=max(f.peak_reserved for f in free),
                      oom=next((o for o in capped if o is not None), None),
                      samples=free[0].samples if samples else None)


# C30's micro-batch: the most sequences per GPU whose step needs less than the 32 GB V100 yet runs
# out in backward (on an fp32 gradient of the logits) with over 30% free; one fewer fits
C30_BATCH = 44


@memoised
def c30_trace(micro_batch: int = C30_BATCH, md: bool = False) -> list:
    """C30's case: GPT-2 1.5B, P_os+g+p at N_d = 400 (one rank class), a checkpoint every 2
    blocks, ``micro_batch`` sequences per GPU, with or without M_D: rank 0's storage trace of one
    step. The report's fragmentation figure and the claim tests read this one trace."""
    r = measure(TrainConfig(stage=3, n_d=400, model=preset("1.5B").model,
                            zero_r=ZeroROptions(checkpoint_activations=2, contiguous_checkpoints=md)),
                micro_batch=micro_batch, trace=True)
    if len(r.classes) != 1:
        raise AssertionError(f"C30's case has one rank class at N_d = 400, got {len(r.classes)}")
    return r.classes[0].allocations


@memoised
def figure7(size: str, capacity: int | None = DGX2.memory_bytes,
            samples: bool = False) -> dict[str, StepMemory]:
    """Figure 7's run ``size`` ("40B": 50 × 8192 at 16 sequences per GPU; "100B": 125 × 8192 at
    32; 400 GPUs, MP 16, [SC] appendix Table 5) under each configuration C1–C5."""
    run = next((r for r in ev.FIGURE7 if r.size == size), None)
    if run is None:
        raise ValueError(f"Figure 7 has runs {[r.size for r in ev.FIGURE7]}, not {size!r}")
    return {n: step_memory(c, run.layers, capacity, gpus=run.gpus, n_m=run.mp,
                           micro_batch=run.batch_per_gpu, d=run.hd, heads=run.heads,
                           samples=samples)
            for n, c in CONFIGS.items()}


def max_layers_replayed(config: ZeroConfig, capacity: int, probes=(8, 16),
                        seen: dict | None = None, **shape) -> int:
    """The most layers whose step runs on ``capacity`` bytes through the allocator model (0 if
    none; see the module doc). ``seen``, if given, receives every measured StepMemory by L."""
    shape = {**FIG6, **shape}
    seen = {} if seen is None else seen

    def at(L: int) -> StepMemory:
        if L not in seen:
            seen[L] = step_memory(config, L, capacity, **shape)
        return seen[L]

    L = boundary(lambda L: at(L).allocated, capacity, probes)   # L_a, the most the step holds
    if L == 0:
        return 0
    while at(L).oom is not None:             # down past every L that fragmentation stops
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
    every step measured, by L: the evidence). Some 70 paper-scale steps with traces: ~3 min on
    2 cores."""
    out = {}
    for name, c in CONFIGS.items():
        seen: dict[int, StepMemory] = {}
        L = max_layers_replayed(c, DGX2.memory_bytes, seen=seen)
        out[name] = (L, max(k for k, m in seen.items() if m.allocated <= DGX2.memory_bytes), seen)
    return out
