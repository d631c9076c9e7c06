"""The memory observer's runs and what it may see beyond the ledger, by name: shared by the
observed-memory claims (tests/claims/test_memory_observed.py) and the buckets' check
(tests/unit/zero_r/test_buffers.py)."""
from __future__ import annotations

import functools

import torch

from tests.support.runs import MODELS
from zerospec.cluster.threads import VirtualCluster
from zerospec.training.config import TrainConfig
from zerospec.training.run import train

N = 4


@functools.lru_cache(maxsize=None)
def observed(stage: int, model: str = "odd", steps: int = 2, **kw):
    """One observed run: (Result, per-rank Observation)."""
    cluster = VirtualCluster(N, observe=True, gpus_per_node=kw.get("gpus_per_node"))
    r = train(TrainConfig.of(stage=stage, n_d=N, model=MODELS[model], steps=steps, **kw), cluster=cluster)
    return r, cluster.observed


def phase_step(label: str) -> tuple[str, int]:
    phase, step = label.split("@")
    return phase, int(step)


def is_loss(s) -> bool:
    """A loss the run returns: RankOutput keeps each micro-batch's fp32 loss (and with G > 1
    their stack and mean) as its result, so they outlive their step by design."""
    return s.dtype == torch.float32 and s.op.split(".")[1] in ("nll_loss_forward", "stack", "mean") \
        and len(s.shape) <= 1


def is_cast(s, r) -> bool:
    """The CPU compute copy of a unit: fetch casts its fp16 vector up to fp32 for the kernels
    (a GPU computes from the fp16 storage; the ledger counts only that)."""
    return s.op == "aten._to_copy.default" and s.dtype == torch.float32 \
        and s.shape in {(u.numel,) for u in r.units}


def persistent_extras(r, label: str) -> int:
    """What a phase entry may hold beyond the ledger, in closed form.

    * the losses the run returns (RankOutput): 4 B per micro-batch, and with G > 1 the step's
      mean (4 B) made after param_sync. Between phases (label ``setup@s``) the first op is the
      zeroing of the exact fp64 sums at the step's start (exact accumulation), else micro-batch
      0's loss being detached after its backward;
    * stages 0–2, entering backward: the compute copy of every unit (4Ψ; the embedding's lookup
      copy is dropped at once, its LM-head copy is kept) — they hold the fp16 units anyway, so
      backward reuses the forward's cast instead of casting again; stage 3 drops each copy when
      its use ends and casts again in backward."""
    phase, step = phase_step(label)
    g = r.config.grad_accum_steps
    before = (4 * g + (4 if g > 1 else 0)) * (step - 1)      # returned by the earlier steps
    setup = before if r.config.exact else before + 4
    losses = {"forward": before, "backward": before + 4, "setup": setup}.get(phase, before + 4 * g)
    casts = 4 * r.psi if phase == "backward" and r.config.stage < 3 else 0
    return (losses if step else 0) + casts


def named_extras(r, label: str, peak) -> dict[str, list]:
    """Every storage live at a phase peak that the ledger does not count, by name; what matches
    no name lands in "UNNAMED", which must stay empty."""
    phase, step = phase_step(label)
    out = {name: [] for name in ("loss", "cast", "adam", "tokens", "in flight", "UNNAMED")}
    chunks = {(u.chunk if r.config.stage else u.padded,) for u in r.units}
    for s in peak.extras():
        if is_loss(s):
            name = "loss"
        elif phase == "step" and s.born == label and s.dtype == torch.float32 and s.shape in chunks:
            name = "adam"    # adam_update's fp32 scratch (fp16 gradients: g and tmp) for its chunk
        elif is_cast(s, r):
            name = "cast"
        elif s.dtype == torch.int64 and s.op == "aten.clone.default":
            name = "tokens"  # the micro-batch's token ids and targets, copied out of the global batch
        elif s.dtype == torch.float32 and (s.born == label or (phase == "backward"
                                                              and s.born == f"forward@{step}")):
            # made by this phase's kernels and not (yet) saved, gradients between backward nodes,
            # or a saved activation backward has unpacked (the ledger let it go) and still uses
            name = "in flight"
        else:
            name = "UNNAMED"
        out[name].append(s)
    return out
