"""zerospec's predictions beside measurements published from real GPUs (spec/validation.md).

Each row of :func:`validation_table` and :func:`figure6_table` is one :class:`~zerospec.paper.measurements.Published`
measurement beside what zerospec predicts for its configuration, both from mechanisms only:

- **a memory reading** (torchtitan's ``max_reserved``): one meta step of the configuration, the
  rank's storage trace (every storage made and let go) replayed through the caching allocator
  model (zerospec/runtime/allocator.py) with the allocator settings the run used; its allocated
  and reserved peaks, and reserved / published;
- **a largest model** (ZeRO's Figure 6, ZeRO-Offload's one-V100 size): the search of
  zerospec/evaluation/cached_memory.py — the most layers whose allocated peak is within the GPU
  (*allocated*) and the most whose step runs through the allocator model there (*reserved*) —
  as parameters, and the reserved one / published.

A row more than 10% off names its residual (:data:`RESIDUALS`), and spec/validation.md says
what of it is measured.
"""
from __future__ import annotations

import dataclasses
from fractions import Fraction

from ..model.presets import gpt, preset
from ..paper import measurements as pm
from ..paper.hardware import DGX2
from ..render.format import Table, round_half_up
from ..runtime.trace import replay
from ..training.config import TrainConfig
from ..training.scale import measure
from ..training.fit import largest
from .runs import memoised

GiB = pm.GiB
WITHIN = Fraction(1, 10)          # the bar: FSDPMemTracker's own test asks ±10% of the CUDA peak

# torchtitan's Llama 3.1 8B (torchtitan/models/llama/__init__.py "8B" at 9dec370: dim 4096, 32
# layers, 32 heads, 8 KV heads, FFN 14336, vocab 128,256): the preset llama-3.1-8b. What zerospec
# runs for torchtitan's FSDP rows: stage 3's FSDP2 flavour in bf16 (zerospec/zero/fsdp2.py, its
# buffers on FSDP2's streams), torchtitan's selective per-op checkpointing
# (zerospec/zero_r/selective.py) and the loss's fp32 upcast (zerospec/model/gpt.py::loss).
TORCHTITAN_PRESET = "llama-3.1-8b"
TORCHTITAN_SETTINGS = dict(stage=3, flavour="fsdp2", precision="bf16",
                           activation_checkpointing="selective-op")
TORCHTITAN_ALLOC = dict(expandable_segments=True)     # run_llama_train.sh @9dec370, l.22
TORCHTITAN_BATCH, TORCHTITAN_SEQ = 2, 8192

# ZeRO-Offload's one-V100 model: the shape family and batch of DeepSpeed's own 10B example
# (microsoft/DeepSpeedExamples Megatron-LM/scripts/ds_zero-offload_10B_pretrain_gpt2_model_parallel.sh
# @f972ae84: MP_SIZE 1, hidden 4096, 32 heads, batch 10, seq 1024, --checkpoint-activations
# --deepspeed-activation-checkpointing, fp16), the layer count searched; its
# ds_zero-offload_10B_config.json: stage 2 with cpu_offload, and the activation_checkpointing
# section as it sets it: partition_activations, contiguous_memory_optimization and
# cpu_checkpointing all true. Without MP, DeepSpeed partitions over mp_size 1 (the whole
# checkpoint) and keeps it on the host (zerospec/zero_r/partition.py).
OFFLOAD_SHAPE = dict(d=4096, heads=32, micro_batch=10)
OFFLOAD_SETTINGS = dict(stage=2, n_d=1, offload_optimizer="cpu", checkpoint_activations=1,
                        partition_activations=True, contiguous_checkpoints=True,
                        cpu_checkpointing=True)

RESIDUALS = {   # by the first of these names a row's key contains
    "compile": "torch.compile's fusions (fewer saved intermediates) are not modelled",
    "torchtitan": "not modelled here: cuBLAS's workspaces (inside reserved) and the optimizer "
                  "step's foreach temporaries beyond what the stage code makes",
    "zero-fig6": "not accounted for: the fit is past the next size the paper lists; the CUDA "
                 "context and NCCL's buffers take none of the 32 GB here",
    "zero-offload": "the paper does not give its 13B run's batch; DeepSpeed's 10B example's "
                    "(10 sequences) is searched",
}


@dataclasses.dataclass(frozen=True)
class Prediction:
    """zerospec's side of a row: bytes (a memory reading) or parameters (a largest model)."""

    allocated: int
    reserved: int
    unit: str          # "bytes" or "parameters"


@memoised
def torchtitan_traces(n_d: int) -> list:
    """One meta step of torchtitan's FSDP row on ``n_d`` GPUs: each rank class's storage trace."""
    model = dataclasses.replace(preset(TORCHTITAN_PRESET).model, block_size=TORCHTITAN_SEQ)
    r = measure(TrainConfig.of(model=model, n_d=n_d, **TORCHTITAN_SETTINGS),
                micro_batch=TORCHTITAN_BATCH, trace=True)
    return [c.allocations for c in r.classes]


def torchtitan_step(n_d: int, *, one_stream: bool = False) -> Prediction:
    """The highest allocated and reserved peaks of torchtitan's row on ``n_d`` GPUs, the traces
    replayed with expandable segments; ``one_stream``: every storage on the default stream (what
    the owners' side streams add to reserved is the difference)."""
    traces = torchtitan_traces(n_d)
    if one_stream:
        traces = [[e._replace(stream="default") for e in t] for t in traces]
    runs = [replay(t, **TORCHTITAN_ALLOC) for t in traces]
    return Prediction(max(x.peak_allocated for x in runs), max(x.peak_reserved for x in runs),
                      "bytes")


def residual_table() -> Table:
    """What of torchtitan's reserved reading is measured here: per row, the allocated peak, the
    reserved peak with every storage on one stream and with the owners' streams, the streams'
    share of reserved − allocated, and the rest of the gap to the published reading."""
    t = Table("validation_residual", "torchtitan's rows: the reserved peak's parts",
              ["row", "allocated", "reserved, one stream", "reserved, streams",
               "streams' share", "published − reserved"])
    for m in pm.TORCHTITAN:
        if "compile" in m.key:
            continue
        n = 128 if "128" in m.key else 8
        p, one = torchtitan_step(n), torchtitan_step(n, one_stream=True)
        t.add(m.key, _gib(p.allocated), _gib(one.reserved), _gib(p.reserved),
              _gib(p.reserved - one.reserved), _gib(m.bytes - p.reserved))
    return t


def _offload_run(layers: int, host: bool = True):
    """One meta step of DeepSpeed's example at ``layers`` layers; ``host`` False: with
    cpu_checkpointing off, the checkpoints kept on the GPU (what the example's key buys)."""
    cfg = TrainConfig.of(model=gpt(layers, OFFLOAD_SHAPE["d"], OFFLOAD_SHAPE["heads"]),
                         **OFFLOAD_SETTINGS)
    return measure(cfg if host else cfg.replace(cpu_checkpointing=False),
                   micro_batch=OFFLOAD_SHAPE["micro_batch"], trace=True)


def offload_checkpoints(layers: int, host: bool = True) -> tuple[int, int]:
    """The peak bytes of activation checkpoints ZeRO-Offload's step of ``layers`` layers holds,
    (on the GPU, on the host): the ledgers' "checkpoints" peaks."""
    r = _offload_run(layers, host)
    return r.memory(0).peak.get("checkpoints", 0), r.host(0).peak.get("checkpoints", 0)


def _offload_step(layers: int, capacity: int, host: bool) -> tuple[int, int, bool]:
    """(Ψ, the allocated peak on a device without a limit, whether it runs on ``capacity``)."""
    r = _offload_run(layers, host)
    free = replay(r.classes[0].allocations)
    runs = free.peak_reserved <= capacity or replay(r.classes[0].allocations, capacity).oom is None
    return r.psi_padded, free.peak_allocated, runs


@memoised
def zero_offload_fit(capacity: int = DGX2.memory_bytes, host: bool = True,
                     ) -> tuple[Prediction, int, int]:
    """The most layers of OFFLOAD_SHAPE on one GPU of ``capacity`` bytes with ZeRO-Offload as
    DeepSpeed's example runs it (``host`` False: its checkpoints kept on the GPU):
    (Ψ at L_a, the most whose allocated peak fits, and at L, the most at or below L_a whose step
    runs through the allocator there; L_a; L), as Figure 6's search (cached_memory.py)."""
    seen: dict[int, tuple[int, int, bool]] = {}

    def at(L: int) -> tuple[int, int, bool]:
        if L not in seen:
            seen[L] = _offload_step(L, capacity, host)
        return seen[L]
    L_a = L = largest(lambda L: at(L)[1], capacity, probes=(40, 56)).value or 0
    while L > 0 and not at(L)[2]:
        L -= 1
    return Prediction(at(L_a)[0], at(L)[0] if L else 0, "parameters"), L_a, L


def c47_fits() -> dict[str, Prediction]:
    """Figure 6's five configurations: Ψ at L_a and at the allocator's L (cached_memory.py)."""
    from .cached_memory import figure6_replayed
    from .runs import figure6_psi
    return {n: Prediction(figure6_psi(L_a), figure6_psi(L), "parameters")
            for n, (L, L_a, _) in figure6_replayed().items()}


def _gib(b) -> str:
    return f"{round_half_up(Fraction(b) / GiB, 2)} GiB"


def _size(p: int) -> str:
    return f"{round_half_up(Fraction(p, 10**9), 2)}B"


def row(m: pm.Published, p: Prediction, residual: str | None = None) -> list:
    """One table row: the measurement, the prediction, reserved / published to 2 decimals, and
    whether it is within 10% (the residual named where it is not: ``residual``, or the row's
    entry of RESIDUALS)."""
    measured = m.bytes if m.unit == "GiB reserved" else m.value
    ratio = Fraction(p.reserved) / measured
    fmt = _gib if p.unit == "bytes" else _size
    within = abs(ratio - 1) <= WITHIN
    key = next(f for f in RESIDUALS if f in m.key)      # "compile" before "torchtitan"
    return [m.key, m.kind, m.source, m.configuration, m.printed, fmt(p.allocated),
            fmt(p.reserved), str(round_half_up(ratio, 2)), "yes" if within else "no",
            "" if within else residual or RESIDUALS[key]]


COLUMNS = ["row", "kind", "source", "configuration", "published", "zerospec: allocated",
           "zerospec: reserved", "reserved / published", "within 10%", "residual (named)"]


def validation_table() -> Table:
    """torchtitan's rows and ZeRO-Offload's beside zerospec's predictions (spec/validation.md):
    the memory readings' meta steps and the one-GPU search, seconds."""
    t = Table("validation", "zerospec beside published measurements", COLUMNS)
    tt = {8: torchtitan_step(8), 128: torchtitan_step(128)}
    for m in pm.TORCHTITAN:
        t.add(*row(m, tt[128 if "128" in m.key else 8]))
    t.add(*row(pm.ZERO_OFFLOAD[0], zero_offload_fit()[0]))
    return t


def offload_residual_table() -> Table:
    """ZeRO-Offload's row in parts: the fits in layers, Ψ and the checkpoint bytes on the GPU and
    on the host at the allocator's fit, as DeepSpeed's example runs (its checkpoints on the host)
    and with cpu_checkpointing off (what that key moves)."""
    t = Table("validation_offload", "ZeRO-Offload's one-V100 fit, in parts",
              ["activation checkpoints", "layers, allocated fit", "layers, allocator fit",
               "Ψ at the allocator fit", "checkpoints on the GPU there (B)",
               "checkpoints on the host there (B)"])
    for host, name in ((True, "on the host (the example)"), (False, "on the GPU")):
        p, L_a, L = zero_offload_fit(host=host)
        gpu, cpu = offload_checkpoints(L, host)
        t.add(name, L_a, L, f"{p.reserved:,}", f"{gpu:,}", f"{cpu:,}")
    return t


@memoised
def figure6_at_published() -> dict[str, tuple]:
    """Per configuration: its published model as the paper's appendix gives it ([SC] Table 4:
    layers, hidden, heads at 400 GPUs, MP 16, 16 per GPU) and zerospec's step of that very model
    on a 32 GB V100: (the appendix row, Ψ, the step's StepMemory). Five paper-scale traced steps."""
    from .cached_memory import step_memory
    from .configs import CONFIGS
    from ..paper import evaluation as ev
    out = {}
    for m in pm.ZERO_FIGURE6:
        name = m.key.rsplit("-", 1)[1]
        run = next(r for r in ev.FIGURE6 if r.size == m.printed)
        mem = step_memory(CONFIGS[name], run.layers, DGX2.memory_bytes, gpus=run.gpus, n_m=run.mp,
                          micro_batch=run.batch_per_gpu, d=run.hd, heads=run.heads)
        out[name] = (run, gpt(run.layers, run.hd, run.heads).psi, mem)
    return out


def next_listed(size: int) -> int:
    """The smallest model size the paper's appendix lists (any of its tables, in parameters)
    above ``size``: the next model it could have tried."""
    from ..paper import evaluation as ev
    listed = {int(Fraction(r.size[:-1]) * 10**9) for r in ev.APPENDIX}
    return min(b for b in listed if b > size)


def figure6_residual_table() -> Table:
    """Figure 6's residual measured two ways. In bytes: zerospec's step of each configuration's
    own published model on a 32 GB V100 — its peaks, and the bytes of the 32 GB that no mechanism
    here claims at that model. In sizes: whether zerospec's fit (through the allocator) is below
    the next size the paper lists, so that the paper's grid alone explains the ratio."""
    t = Table("validation_figure6_residual", "Figure 6 at the paper's own models",
              ["row", "the paper's model (layers × hidden, heads)", "allocated", "reserved",
               "32 GB − reserved (unclaimed)", "next size the paper lists",
               "zerospec's fit below it"])
    fits = c47_fits()
    for name, (run, psi, mem) in figure6_at_published().items():
        if mem.oom is not None:
            raise AssertionError(f"zero-fig6-{name}: the paper's {run.size} does not run here")
        nxt = next_listed(int(Fraction(run.size[:-1]) * 10**9))
        t.add(f"zero-fig6-{name}", f"{run.size}: {run.layers} × {run.hd}, {run.heads}",
              _gb(mem.allocated), _gb(mem.reserved), _gb(DGX2.memory_bytes - mem.reserved),
              _size(nxt), "yes" if fits[name].reserved < nxt else "no")
    return t


def _gb(b) -> str:
    return f"{round_half_up(Fraction(b, 10**9), 2)} GB"


def figure6_table() -> Table:
    """Figure 6's five sizes beside the planner's fits (cached_memory.py's search, minutes)."""
    t = Table("validation_figure6", "ZeRO's Figure 6 beside the planner's fits", COLUMNS)
    c47 = c47_fits()
    for m in pm.ZERO_FIGURE6:
        p = c47[m.key.rsplit("-", 1)[1]]
        nxt = next_listed(int(m.value))
        grid = (f"measured: the paper's grid — the fit is below {_size(nxt)}, the next size the "
                f"paper lists" if p.reserved < nxt else None)
        t.add(*row(m, p, grid))
    return t
