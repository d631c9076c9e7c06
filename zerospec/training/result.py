"""Result: everything tests, spec/ and the report need from one run — built in one place
(:func:`build_result`) for every engine: threads, processes and the meta-tensor scale mode alike.
"""
from __future__ import annotations

import dataclasses

import torch

from ..comm.ledger import CommLedger
from ..model import megatron
from ..model.units import Sized, Unit
from ..runtime.memory import MemoryLedger
from . import checkpoint
from .config import TrainConfig
from .step import RankOutput


@dataclasses.dataclass
class Result(Sized):
    config: TrainConfig
    units: tuple[Unit, ...]
    losses: list[float]                     # per step, mean over ranks (summed in rank order)
    rank_losses: list[list[torch.Tensor]]   # [rank][step], fp32 scalars
    master: dict[str, torch.Tensor]         # final fp32 master weights, unpadded, "unit/param"
    memory: list[MemoryLedger]
    comm: CommLedger
    ranks: list[RankOutput]
    wall_seconds: float
    timelines: list[list[tuple[int, str, str, float]]]  # per rank: (step, phase, kind, seconds)
    host: list[MemoryLedger] = dataclasses.field(default_factory=list)  # per rank (P_a+cpu, offload)
    nvme: list[MemoryLedger] = dataclasses.field(default_factory=list)  # per rank (offload's swap files)

    @property
    def psi_held(self) -> int:
        """The Ψ the paper's formulas take for this run: Ψ at stage 0 (nothing is partitioned,
        units unpadded), Ψ_p at stages 1–3 (every unit padded to a multiple of N_d)."""
        return self.psi if self.config.stage == 0 else self.psi_padded

    def model_states(self, rank: int = 0) -> int:
        return self.ranks[rank].model_states

    @property
    def step_seconds(self) -> list[float]:
        """Wall time between the ends of consecutive steps on this machine: ranks run one at a
        time, so a step ends when the last rank ends it. Ranks run ahead into the next step until
        its first collective (with stages 0/1 all of forward and backward), so the first figure
        also holds part of step 2 and the last lacks it; every figure in between is exactly one
        cycle of all ranks' work, i.e. one step (benchmarks/test_step_bench.py uses those).
        zerospec.report.replay replays the ranks as if side by side."""
        ends = [max(o.step_end[s] for o in self.ranks) for s in range(len(self.losses) + 1)]
        return [b - a for a, b in zip(ends, ends[1:])]

    # -- robustness (spec/loss_scaling.md, clipping.md): equal on every rank, so rank 0 speaks ---
    @property
    def grad_norms(self) -> list[float | None]:
        """Per step, the pre-clip global norm of the unscaled gradient (None without clipping)."""
        return [r.norm for r in self.ranks[0].reports]

    @property
    def loss_scales(self) -> list[float]:
        """Per step, the loss scale its gradients carried (1.0 without loss scaling)."""
        return [r.scale for r in self.ranks[0].reports]

    @property
    def skipped(self) -> list[bool]:
        """Per step, whether the update was skipped (gradient overflow)."""
        return [r.skipped for r in self.ranks[0].reports]

    def state(self) -> checkpoint.TrainState:
        """The final training state, unsharded (needs ``train(..., keep_state=True)``)."""
        if any(o.state is None for o in self.ranks):
            raise ValueError("this run kept no state: call train(cfg, keep_state=True)")
        return checkpoint.assemble(checkpoint.unit_spec(self.config.model, self.config.n_m,
                                                         self.config.tiles),
                                   self.ranks[0].state["meta"],
                                   {f"rank {r}": o.state["pieces"] for r, o in enumerate(self.ranks)},
                                   where="run state")


def build_result(cfg: TrainConfig, outs: list[RankOutput], memory: list[MemoryLedger],
                 comm: CommLedger, wall_seconds: float, timelines) -> Result:
    """The one :class:`Result` of a run from every rank's output (any engine)."""
    units = cfg.units()
    return Result(cfg, units, global_losses(outs, cfg), [o.losses for o in outs],
                  gather_master(units, outs, cfg), memory, comm, outs, wall_seconds, timelines)


def global_losses(outs: list[RankOutput], cfg: TrainConfig) -> list[float]:
    """Per step, the mean loss over every rank's micro-batches, summed in fp64 in the global
    micro-batch order k·N + r (deterministic); NaN on meta, where there are no values."""
    losses = []
    for s in range(len(outs[0].losses)):
        if cfg.device == "meta":
            losses.append(float("nan"))
            continue
        total = torch.zeros((), dtype=torch.float64)
        for k in range(cfg.grad_accum_steps):
            for o in outs[::cfg.n_m]:        # one rank per replica: its MP ranks agree bit for bit
                total += o.micro_losses[s][k].to(torch.float64)
        losses.append(float(total / (cfg.n_d * cfg.grad_accum_steps)))
    return losses


def gather_master(units, outs: list[RankOutput], cfg: TrainConfig) -> dict[str, torch.Tensor]:
    """Reassemble full fp32 masters from the ranks' shards (host side: no collective, no bytes);
    with N_m > 1, each MP index's slices from its DP group, then Megatron's slices put together
    (zerospec/model/megatron.py), so the keys and shapes are the whole model's at any N_m."""
    parts = []
    for j in range(cfg.n_m):
        dp = outs[j::cfg.n_m]                # the DP group of MP index j, in DP order
        out = {}
        for i, u in enumerate(units):
            flat = torch.zeros(u.padded, device=cfg.device)
            for o in (dp[:1] if cfg.stage == 0 else dp):
                sl, m = o.master[i]
                flat[sl] = m
            for name, t in u.views(flat).items():
                out[f"{u.name}/{name}"] = t.clone()
        parts.append(out)
    return parts[0] if cfg.n_m == 1 else megatron.unshard(cfg.model, parts)
