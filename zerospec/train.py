"""One training run of a ZeRO stage on a virtual cluster: ``train(TrainConfig(...)) -> Result``.

The per-rank step reads like the paper's description — forward, backward, gradient sync, optimizer
step, parameter sync — with a phase marker around each part so both ledgers can say *when* bytes
were held or moved. Everything tests, spec/ and the report need is in the one :class:`Result`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import time

import torch
from torch.utils.flop_counter import FlopCounterMode

from . import model as gpt
from .cluster import VirtualCluster
from .comm.ledger import CommLedger
from .data import BigramData
from .memory import MemoryLedger
from .optim import AdamConfig
from .partition import Unit, psi, psi_padded
from .precision import POLICIES, Precision, policy
from .zero import STAGES, ZERO1_COMM
from .zero.fetch import ParamFetcher

PHASES = ("forward", "backward", "grad_sync", "step", "param_sync")
DEVICES = ("cpu", "meta")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    stage: int = 0
    n_d: int = 4
    model: gpt.GPTConfig = gpt.SMALL
    global_batch: int | None = None    # default: 2 sequences per rank
    steps: int = 5
    seed: int = 0
    zero1_comm: str = "reduce_scatter"
    adam: AdamConfig = AdamConfig()
    count_flops: bool = False
    device: str = "cpu"
    precision: str = "fp16"
    timeout: float = 120.0

    def __post_init__(self):
        if self.stage not in STAGES:
            raise ValueError(f"stage must be one of {sorted(STAGES)}, got {self.stage!r}")
        if not isinstance(self.n_d, int) or self.n_d < 1:
            raise ValueError(f"n_d (number of ranks) must be an integer >= 1, got {self.n_d!r}")
        if self.global_batch is not None and (self.global_batch < 1 or self.global_batch % self.n_d):
            raise ValueError(f"global_batch={self.global_batch} must be a positive multiple of "
                             f"n_d={self.n_d} (each rank takes an equal micro-batch)")
        if not isinstance(self.steps, int) or self.steps < 1:
            raise ValueError(f"steps must be an integer >= 1, got {self.steps!r}")
        if self.zero1_comm not in ZERO1_COMM:
            raise ValueError(f"unknown ZeRO-1 variant {self.zero1_comm!r}; accepted: "
                             f"{', '.join(ZERO1_COMM)}")
        if self.device not in DEVICES:
            raise ValueError(f"device must be one of {DEVICES}, got {self.device!r}")
        policy(self.precision)

    @property
    def policy(self) -> Precision:
        return POLICIES[self.precision]

    @property
    def compute_dtype(self) -> torch.dtype:
        """CPU kernels compute in fp32 from the stored copies; elsewhere in the storage dtype."""
        return torch.float32 if self.device == "cpu" else self.policy.dtype

    @property
    def batch(self) -> int:
        return self.global_batch if self.global_batch is not None else 2 * self.n_d

    @property
    def label(self) -> str:
        return STAGES[self.stage].label

    def units(self) -> tuple[Unit, ...]:
        return self.model.units(self.n_d, pad=STAGES[self.stage].pad)


@dataclasses.dataclass
class RankOutput:
    losses: list[torch.Tensor]
    master: list[tuple[slice, torch.Tensor]]
    model_states: int                       # bytes right after setup
    flops: list[dict[str, int]]             # per step: forward, backward
    optim_elements: list[int]               # per step
    seconds: dict[str, float]               # per phase, summed over steps (own compute + collectives)
    step_end: list[float] = dataclasses.field(default_factory=list)  # perf_counter: setup, step 1, …


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

    def model_states(self, rank: int = 0) -> int:
        return self.ranks[rank].model_states

    @property
    def step_seconds(self) -> list[float]:
        """Wall time of each step on this machine: ranks run one at a time, so a step ends when
        the last rank ends it. Ranks that run ahead start the next step early, so a single
        step's figure is skewed by up to one rank's share; average several (see
        ``mean_step_seconds``). zerospec.timeline replays the ranks as if side by side."""
        ends = [max(o.step_end[s] for o in self.ranks) for s in range(self.config.steps + 1)]
        return [b - a for a, b in zip(ends, ends[1:])]

    def mean_step_seconds(self, skip: int = 1) -> float:
        """Mean wall time per step after the first ``skip`` steps (which warm caches)."""
        ends = [max(o.step_end[s] for o in self.ranks) for s in range(self.config.steps + 1)]
        return (ends[-1] - ends[skip]) / (self.config.steps - skip)


def _flops(enabled: bool):
    return FlopCounterMode(display=False) if enabled else contextlib.nullcontext()


def _rank_main(ctx, cfg: TrainConfig, units, init, batches, on_step=None) -> RankOutput:
    """One rank's run. ``on_step(step, stage)``, if given, is called after each step (the
    engine tests snapshot weights there to compare them with torch's own implementations)."""
    cls = STAGES[cfg.stage]
    kwargs = {"zero1_comm": cfg.zero1_comm} if cfg.stage == 1 else {}
    with ctx.phase("setup"):
        stage = cls(ctx, units, init, cfg.adam, cfg.policy, **kwargs)
    out = RankOutput([], stage.owned_master(), ctx.memory.model_states(), [], [],
                     {p: 0.0 for p in PHASES})
    fetcher = ParamFetcher(stage, cfg.compute_dtype)
    out.step_end.append(time.perf_counter())
    for step in range(1, cfg.steps + 1):
        ctx.step = step
        idx, tgt = (b.to(ctx.device) for b in batches[step - 1])
        fetcher.begin_step()
        flops = {}
        t0 = time.perf_counter()
        with ctx.phase("forward"), _flops(cfg.count_flops) as fc:
            with fetcher.hooks():
                loss = gpt.forward(cfg.model, BigramData.shard(idx, ctx.rank, cfg.n_d),
                                   BigramData.shard(tgt, ctx.rank, cfg.n_d), fetcher.fetch)
            fetcher.end_forward()
        flops["forward"] = fc.get_total_flops() if fc else 0
        t1 = time.perf_counter()
        with ctx.phase("backward"), _flops(cfg.count_flops) as fc:
            loss.backward()
            fetcher.check_complete()
        flops["backward"] = fc.get_total_flops() if fc else 0
        t2 = time.perf_counter()
        with ctx.phase("grad_sync"):
            stage.reduce_gradients()
        t3 = time.perf_counter()
        with ctx.phase("step"):
            stage.optimizer_step(step)
        t4 = time.perf_counter()
        with ctx.phase("param_sync"):
            stage.sync_params()
        t5 = time.perf_counter()
        for p, dt in zip(PHASES, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4)):
            out.seconds[p] += dt
        out.losses.append(loss.detach())
        out.flops.append(flops)
        out.optim_elements.append(stage.optim_elements)
        out.step_end.append(time.perf_counter())
        if on_step is not None:
            on_step(step, stage)
    return out


def _init_flat(cfg: TrainConfig, units) -> list[torch.Tensor]:
    if cfg.device == "meta":
        return [torch.empty(u.padded, device="meta") for u in units]
    params = gpt.init_params(cfg.model, cfg.seed)
    return [u.flatten(params[u.name]) for u in units]


def _batches(cfg: TrainConfig):
    T = cfg.model.block_size
    if cfg.device == "meta":
        # inputs and targets are two tensors, as on a real device: the loss saves the targets
        # for backward, so one shared storage would hide 8 bytes per token of activations
        return [tuple(torch.empty(cfg.batch, T, dtype=torch.long, device="meta") for _ in range(2))
                ] * cfg.steps
    data = BigramData(cfg.model.vocab_size, T, cfg.seed)
    return [data.batch(s, cfg.batch) for s in range(cfg.steps)]


def train(cfg: TrainConfig, *, cluster: VirtualCluster | None = None, on_step=None) -> Result:
    """Run ``cfg.steps`` steps of ZeRO stage ``cfg.stage`` on ``cfg.n_d`` virtual GPUs.

    ``on_step(step, stage)`` is called on every rank after each step (``stage.ctx.rank`` says
    which): progress bars, weight snapshots."""
    units = cfg.units()
    cluster = cluster or VirtualCluster(cfg.n_d, device=cfg.device, timeout=cfg.timeout)
    if cluster.n_ranks != cfg.n_d:
        raise ValueError(f"cluster has {cluster.n_ranks} ranks but config says n_d={cfg.n_d}")
    init, batches = _init_flat(cfg, units), _batches(cfg)
    t0 = time.perf_counter()
    outs = cluster.run(_rank_main, cfg, units, init, batches, on_step)
    wall = time.perf_counter() - t0
    losses = []
    for s in range(cfg.steps):
        if cfg.device == "meta":
            losses.append(float("nan"))
            continue
        total = torch.zeros((), dtype=torch.float64)
        for o in outs:                      # rank order: deterministic
            total += o.losses[s].to(torch.float64)
        losses.append(float(total / cfg.n_d))
    return Result(cfg, units, losses, [o.losses for o in outs], _gather_master(units, outs, cfg),
                  cluster.memory, cluster.comm_ledger, outs, wall,
                  [ctx.timeline.events for ctx in cluster.contexts])


def _gather_master(units, outs: list[RankOutput], cfg: TrainConfig) -> dict[str, torch.Tensor]:
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
