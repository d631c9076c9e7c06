"""One training run of a ZeRO stage on a virtual cluster: ``train(TrainConfig(...)) -> Result``.

The per-rank step reads like the paper's description — forward, backward, gradient sync, optimizer
step, parameter sync — with a phase marker around each part so both ledgers can say *when* bytes
were held or moved. Everything tests, spec/ and the report need is in the one :class:`Result`.
"""
from __future__ import annotations

import dataclasses
import time

import torch

from . import checkpoint
from . import model as gpt
from .cluster import VirtualCluster
from .comm.ledger import CommLedger
from .data import BigramData
from .loss_scale import LossScale
from .memory import MemoryLedger
from .optim import AdamConfig
from .partition import Unit, psi, psi_padded
from .precision import POLICIES, Precision, policy
from .resume import check as resume_check
from .step import RankOutput, rank_main
from .update import check_config
from .zero import STAGES, ZERO1_COMM

DEVICES = ("cpu", "meta")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    stage: int = 0
    n_d: int = 4
    model: gpt.GPTConfig = gpt.SMALL
    global_batch: int | None = None    # default: 2 sequences per rank per micro-step
    steps: int = 5
    seed: int = 0
    zero1_comm: str = "reduce_scatter"
    adam: AdamConfig = AdamConfig()
    count_flops: bool = False
    device: str = "cpu"
    precision: str = "fp16"
    timeout: float = 120.0
    # surviving real conditions (spec/loss_scaling.md … checkpoints.md); defaults: the plain step
    loss_scale: LossScale | None = None       # dynamic fp16 loss scaling
    clip_grad_norm: float | None = None       # global-norm clipping threshold
    grad_accum_steps: int = 1                 # micro-batches per optimizer step (G)
    exact_grads: bool = False                 # exact fp64 gradient sums also when G = 1
    inject_overflow: tuple = ()               # test hook: (step, rank) pairs whose gradient gets an inf

    def __post_init__(self):
        if self.stage not in STAGES:
            raise ValueError(f"stage must be one of {sorted(STAGES)}, got {self.stage!r}")
        if not isinstance(self.n_d, int) or self.n_d < 1:
            raise ValueError(f"n_d (number of ranks) must be an integer >= 1, got {self.n_d!r}")
        g = self.grad_accum_steps
        if not isinstance(g, int) or isinstance(g, bool) or g < 1:
            raise ValueError(f"grad_accum_steps must be an integer >= 1, got {g!r}")
        if self.global_batch is not None and (self.global_batch < 1
                                              or self.global_batch % (self.n_d * g)):
            times = f" × grad_accum_steps={g}" if g > 1 else ""
            raise ValueError(f"global_batch={self.global_batch} must be a positive multiple of "
                             f"n_d={self.n_d}{times} (each rank takes equal micro-batches)")
        if not isinstance(self.steps, int) or self.steps < 1:
            raise ValueError(f"steps must be an integer >= 1, got {self.steps!r}")
        if self.zero1_comm not in ZERO1_COMM:
            raise ValueError(f"unknown ZeRO-1 variant {self.zero1_comm!r}; accepted: "
                             f"{', '.join(ZERO1_COMM)}")
        if self.device not in DEVICES:
            raise ValueError(f"device must be one of {DEVICES}, got {self.device!r}")
        policy(self.precision)
        check_config(self)

    @property
    def exact(self) -> bool:
        """Gradients are summed exactly in fp64 (zerospec/zero/accumulate.py)."""
        return self.exact_grads or self.grad_accum_steps > 1

    @property
    def policy(self) -> Precision:
        return POLICIES[self.precision]

    @property
    def compute_dtype(self) -> torch.dtype:
        """CPU kernels compute in fp32 from the stored copies; elsewhere in the storage dtype."""
        return torch.float32 if self.device == "cpu" else self.policy.dtype

    @property
    def batch(self) -> int:
        return self.global_batch if self.global_batch is not None else 2 * self.n_d * self.grad_accum_steps

    @property
    def label(self) -> str:
        return STAGES[self.stage].label

    def units(self) -> tuple[Unit, ...]:
        return self.model.units(self.n_d, pad=STAGES[self.stage].pad)


@dataclasses.dataclass
class Result:
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

    @property
    def psi(self) -> int:
        return psi(self.units)

    @property
    def psi_padded(self) -> int:
        return psi_padded(self.units)

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
        zerospec.timeline replays the ranks as if side by side."""
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
        return checkpoint.assemble(self.config.model.unit_spec(), self.ranks[0].state["meta"],
                                   {f"rank {r}": o.state["pieces"] for r, o in enumerate(self.ranks)},
                                   where="run state")


def initial_weights(cfg: TrainConfig, units) -> list[torch.Tensor]:
    if cfg.device == "meta":
        return [torch.empty(u.padded, device="meta") for u in units]
    params = gpt.init_params(cfg.model, cfg.seed)
    return [u.flatten(params[u.name]) for u in units]


def make_batches(cfg: TrainConfig):
    T = cfg.model.block_size
    if cfg.device == "meta":
        # inputs and targets are two tensors, as on a real device: the loss saves the targets
        # for backward, so one shared storage would hide 8 bytes per token of activations
        return [tuple(torch.empty(cfg.batch, T, dtype=torch.long, device="meta") for _ in range(2))
                ] * cfg.steps
    data = BigramData(cfg.model.vocab_size, T, cfg.seed)
    return [data.batch(s, cfg.batch) for s in range(cfg.steps)]


def train(cfg: TrainConfig, *, cluster: VirtualCluster | None = None, on_step=None,
          resume: checkpoint.TrainState | None = None, save: dict | None = None,
          keep_state: bool = False) -> Result:
    """Run ``cfg.steps`` steps of ZeRO stage ``cfg.stage`` on ``cfg.n_d`` virtual GPUs.

    ``on_step(step, stage)`` is called on every rank after each step (``stage.ctx.rank`` says
    which): progress bars, weight snapshots. ``resume``: continue from a checkpoint (a
    ``checkpoint.load(dir, n_ranks=cfg.n_d)``, or ``Result.state()``) with steps ``step+1 …
    cfg.steps``; ``save={step: dir}`` writes a sharded checkpoint after those steps;
    ``keep_state`` keeps the final state for ``Result.state()``."""
    units = cfg.units()
    cluster = cluster or VirtualCluster(cfg.n_d, device=cfg.device, timeout=cfg.timeout)
    if cluster.n_ranks != cfg.n_d:
        raise ValueError(f"cluster has {cluster.n_ranks} ranks but config says n_d={cfg.n_d}")
    if resume is not None:
        resume_check(cfg, resume)
    init, batches = initial_weights(cfg, units), make_batches(cfg)
    t0 = time.perf_counter()
    outs = cluster.run(rank_main, cfg, units, init, batches, on_step, resume, save, keep_state)
    wall = time.perf_counter() - t0
    losses = global_losses(outs, cfg)
    return Result(cfg, units, losses, [o.losses for o in outs], gather_master(units, outs, cfg),
                  cluster.memory, cluster.comm_ledger, outs, wall,
                  [ctx.timeline.events for ctx in cluster.contexts])


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
            for o in outs:
                total += o.micro_losses[s][k].to(torch.float64)
        losses.append(float(total / (cfg.n_d * cfg.grad_accum_steps)))
    return losses


def gather_master(units, outs: list[RankOutput], cfg: TrainConfig) -> dict[str, torch.Tensor]:
    """Reassemble full fp32 masters from the ranks' shards (host side: no collective, no bytes)."""
    out = {}
    for i, u in enumerate(units):
        flat = torch.zeros(u.padded, device=cfg.device)
        owners = outs[:1] if cfg.stage == 0 else outs
        for o in owners:
            sl, m = o.master[i]
            flat[sl] = m
        for name, t in u.views(flat).items():
            out[f"{u.name}/{name}"] = t.clone()
    return out
