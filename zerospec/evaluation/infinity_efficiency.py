"""ZeRO-Infinity's efficiency model (C-I5, C-I6) and capacity per tier (C-I7), from measured runs.

**Efficiency.** C-I5 says a GPU computing F FLOPs at ``peak_tp`` while B bytes cross a link of
bandwidth bw, with no overlap, runs at F/peak / (F/peak + B/bw) = ait·bw / (ait·bw + peak),
ait = F/B. :func:`measured_ait` takes F from the run's op counter (``count_flops``) and B per data
type from its ledgers, per GPU and step: parameters and gradients — every byte of a unit's fp16
parameters that arrives on the GPU (an all-gather's whole output: its own 1/N over PCIe, the rest
over the GPUs' links) and of its fp16 gradient that leaves it (the reduce-scatter's input);
optimizer states — the bytes its NVMe link carries in the optimizer step (read and
written once); activation
checkpoints — twice the checkpoint bytes the device holds (written once, read once).
:func:`efficiency_table` times those on spec-sheet bandwidths (zerospec/paper/hardware.py).

**Capacity.** :func:`bytes_per_param_per_tier` reads the model-state bytes each tier holds per
parameter off a run's three ledgers (device, host, NVMe); :func:`largest_model` divides each
tier's capacity (spec sheets: hardware.Tiers) by it and takes the tightest. Working memory (MSWM,
AWM, C-I3/C-I4) is left out of the GPU tier, as the paper's headline numbers leave it out.
"""
from __future__ import annotations

from fractions import Fraction

from ..paper import infinity as zi
from ..runtime.memory import MODEL_STATES

DATA = ("params", "optimizer", "checkpoints")


def step_flops(result, rank: int = 0, step: int = 2) -> int:
    """Forward + backward (recompute included) FLOPs of ``rank`` at ``step``, as counted."""
    f = result.ranks[rank].flops[step - 1]
    return f["forward"] + f["backward"]


def moved_bytes(result, rank: int = 0, step: int = 2) -> dict[str, int]:
    """Bytes per data type moved to or from one GPU in one step (module doc)."""
    recs = result.comm.records(rank, step=step)
    pg = sum(x.numel * x.dtype.itemsize for x in recs
             if x.op in ("all_gather", "reduce_scatter") and x.phase != "param_sync")
    return {"params": pg,
            "optimizer": result.comm.link_bytes(rank, step=step, link="nvme", phase="step"),
            "checkpoints": 2 * result.memory[rank].peak["checkpoints"]}


def measured_ait(result, rank: int = 0, step: int = 2) -> dict[str, Fraction]:
    """ait = FLOPs / bytes moved, per data type, for one GPU and step (0 bytes: left out)."""
    f = step_flops(result, rank, step)
    return {k: Fraction(f, b) for k, b in moved_bytes(result, rank, step).items() if b}


def efficiency_table(aits: dict[str, Fraction], bandwidths, peak_tp=zi.PEAK_TP) -> dict:
    """(data, bandwidth) -> C-I5's efficiency at that ait."""
    return {(d, bw): zi.efficiency(a, bw, peak_tp) for d, a in aits.items() for bw in bandwidths}


def bytes_per_param_per_tier(result, rank: int = 0) -> dict[str, Fraction]:
    """Model-state bytes per parameter each tier holds, all ranks together over Ψ (padded)."""
    psi = result.psi_padded
    n = len(result.ranks)
    out = {}
    for tier, ledgers in (("gpu", result.memory), ("cpu", result.host), ("nvme", result.nvme)):
        held = sum(sum(led.current[c] for c in MODEL_STATES) for led in ledgers[:n]) if ledgers else 0
        out[tier] = Fraction(held, psi)
    return out


def largest_model(per_param: dict[str, Fraction], tiers, nodes: int) -> int:
    """The largest Ψ whose model states fit every tier of ``nodes`` nodes (hardware.Tiers)."""
    cap = {"gpu": tiers.gpu_bytes, "cpu": tiers.host_bytes, "nvme": tiers.nvme_bytes}
    fits = [Fraction(nodes * cap[t], b) for t, b in per_param.items() if b]
    return int(min(fits))
