"""``zerospec report``: run every ZeRO stage on N virtual GPUs and measure what the seed write-up shows.

:func:`measure` trains each stage variant with :func:`zerospec.training.run.train` (real tensors),
counts its FLOPs in one step of the same configuration on meta tensors, and sweeps N for the
memory-vs-N figure; :mod:`zerospec.report.writeup` turns the
measurements into tables, :mod:`zerospec.report.figures` into figures. Every number printed is read
from this run's ledgers; paper values appear only as the expected side, labelled with their claim id.
"""
from __future__ import annotations

import dataclasses
import sys
import time

import torch

from ..model.gpt import SMALL, GPTConfig
from ..paper import theory
from .choices import VARIANTS
from ..cluster.helper import Beside
from .replay import StepReplay, parallel_time
from ..training.result import Result
from ..training.step import RankOutput
from ..training.config import TrainConfig
from ..training.sections import BatchOptions, VariantOptions
from ..training.run import train
from ..training.scale import measure as measure_meta


SWEEP_N = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


@dataclasses.dataclass(frozen=True)
class ReportConfig:
    ranks: int = 32
    variants: tuple[str, ...] = tuple(VARIANTS)
    steps: int = 3
    model: GPTConfig = SMALL
    micro_batch: int = 2                 # sequences per rank per step
    scale_params: int = 7_500_000_000    # the seed's projection (Figure 1's model, C14)
    gpu_bytes: int = theory.V100_BYTES
    bandwidth: int = 50 * theory.GB      # bytes per second
    sweep: tuple[int, ...] = SWEEP_N
    unit: str = "GB"

    def __post_init__(self):
        if not isinstance(self.ranks, int) or self.ranks < 1:
            raise ValueError(f"--ranks must be an integer >= 1, got {self.ranks!r}")
        if not isinstance(self.steps, int) or self.steps < 1:
            raise ValueError(f"--steps must be an integer >= 1, got {self.steps!r}")
        if not isinstance(self.micro_batch, int) or self.micro_batch < 1:
            raise ValueError(f"--micro-batch must be an integer >= 1, got {self.micro_batch!r}")
        bad = [v for v in self.variants if v not in VARIANTS]
        if bad or not self.variants:
            raise ValueError(f"unknown stage {', '.join(map(repr, bad)) or '(none given)'}; accepted: "
                             f"{', '.join(VARIANTS)} (1ar = ZeRO-1 that all-reduces gradients)")

    def train_config(self, key: str) -> TrainConfig:
        """The timed run of variant ``key``: every step, real tensors."""
        stage, zero1, _ = VARIANTS[key]
        return TrainConfig(stage=stage, n_d=self.ranks, model=self.model, steps=self.steps,
                           batching=BatchOptions(global_batch=self.micro_batch * self.ranks),
                           variants=VariantOptions(zero1_comm=zero1))

    def count_flops(self, key: str) -> list[RankOutput]:
        """Variant ``key``'s FLOP-counting step: one step of the same configuration on meta tensors
        with its FLOPs counted (:func:`zerospec.training.scale.measure`), one rank per class of
        identical ranks, its output repeated for each rank of the class → one output per rank.

        FLOPs are a function of the ops' shapes alone, so a meta step counts what a real one does
        (tests/claims/test_compute.py checks it rank by rank in every stage) in a fraction of the
        time: on real tensors the mode's Python hooks on every op made the counting step of 32
        ranks take 1.7–4.3 s, half of the report's measuring, against 0.1 s on meta (once warm:
        the first meta step in a process pays about 2 s of imports). A meta step computes in
        fp16, as a GPU would, where the CPU run computes in fp32: its ops' bytes differ, their
        FLOPs do not."""
        stage, zero1, _ = VARIANTS[key]
        r = measure_meta(TrainConfig.of(model=self.model, stage=stage, n_d=self.ranks,
                                        zero1_comm=zero1, count_flops=True),
                         micro_batch=self.micro_batch)
        return [c.output for c in r.classes for _ in c.ranks]


@dataclasses.dataclass
class Run:
    key: str
    label: str
    result: Result          # the timed run: memory, comm, losses, weights, timelines
    replay: StepReplay      # its last step replayed on N parallel clocks
    flops: list[RankOutput]  # per rank: one step of the same configuration on meta tensors
    #                          with FLOPs counted (its losses and masters are meta tensors)

    @property
    def stage(self) -> int:
        return self.result.config.stage


@dataclasses.dataclass
class Measurements:
    config: ReportConfig
    runs: list[Run]
    sweep: dict[int, dict[int, int]]      # stage -> N -> measured per-GPU model-state bytes (max rank)
    seconds: float                        # the whole measurement, wall clock
    zero_r: dict = dataclasses.field(default_factory=dict)   # ZeRO-R option -> its meta step
    c30: dict = dataclasses.field(default_factory=dict)      # M_D on? -> C30's storage trace

    def run(self, key: str) -> Run | None:
        return next((r for r in self.runs if r.key == key), None)


# -- the memory-vs-N sweep: the stages' own set-up code on meta tensors ----------------------------
def setup_model_states(stage: int, n_d: int, model: GPTConfig = SMALL, zero1_comm: str = "reduce_scatter",
                       ranks=None) -> dict[int, int]:
    """Per-rank model-state bytes right after set-up, measured on ``meta`` tensors by
    :func:`zerospec.training.scale.measure` (the unchanged per-rank step, one rank per padding class).
    Default ranks: rank 0 and the last rank."""
    r = measure_meta(TrainConfig.of(model=model, stage=stage, n_d=n_d, zero1_comm=zero1_comm),
                     setup_only=True)
    return {k: r.model_states(k) for k in (ranks if ranks is not None else sorted({0, n_d - 1}))}


# -- ZeRO-R's activation options: one meta step each ------------------------------------------------
def zero_r_options(cfg: ReportConfig) -> dict:
    """ZeRO-R option -> one step of ZeRO-3 on meta tensors with it (zerospec.training.scale), the
    report's model and micro-batch: no checkpointing; a checkpoint per block; P_a and P_a+cpu at
    N_m = 2 on N_d = ⌊N/2⌋ (only when the heads split in two)."""
    def step(n_d: int, **options):
        return measure_meta(TrainConfig.of(model=cfg.model, stage=3, n_d=n_d, **options),
                            micro_batch=cfg.micro_batch)
    out = {"none": step(cfg.ranks), "checkpoints": step(cfg.ranks, checkpoint_activations=1)}
    if cfg.model.n_head % 2 == 0:
        n_d = max(1, cfg.ranks // 2)
        for name, cpu in (("P_a", False), ("P_a+cpu", True)):
            out[name] = step(n_d, n_m=2, checkpoint_activations=1, partition_activations=True,
                             cpu_checkpointing=cpu)
    return out


# -- measuring ------------------------------------------------------------------------------------
def meta_measurements(cfg: ReportConfig, c30: bool = False) -> tuple[dict, dict, dict, dict]:
    """The report's meta steps: each variant's FLOP-counting step, the memory-vs-N sweep per
    stage, ZeRO-R's options and, with ``c30``, C30's storage traces without and with M_D (the
    fragmentation figure's). Integers and metadata only: the same in any process."""
    from ..evaluation.cached_memory import C30_BATCH, c30_trace
    flops = {key: cfg.count_flops(key) for key in cfg.variants}
    sweep_ns = sorted(set(cfg.sweep) | {cfg.ranks})
    sweep = {s: {n: max(setup_model_states(s, n, cfg.model).values()) for n in sweep_ns}
             for s in sorted({VARIANTS[k][0] for k in cfg.variants})}
    traces = {md: c30_trace(C30_BATCH, md) for md in (False, True)} if c30 else {}
    return flops, sweep, zero_r_options(cfg), traces


def measure(cfg: ReportConfig, *, quiet: bool = False, c30: bool = False) -> Measurements:
    """Train every requested variant for ``cfg.steps`` steps on ``cfg.ranks`` virtual GPUs, count
    its FLOPs in a separate one-step run (:meth:`ReportConfig.count_flops`), and measure set-up
    memory across N for the sweep; ``c30``: also trace C30's case for the fragmentation figure.

    FLOPs are counted apart because their counter intercepts every op (slower steps),
    which would distort the timed run's wall-clock and timeline. Everything runs with one intra-op
    thread: the baton runs one rank at a time, the matmuls are tiny, and on a shared 2-core machine
    a second OpenMP thread made steps 2–3× slower, not faster. The meta steps
    (:func:`meta_measurements`) run meanwhile in a helper process where a second CPU is free
    (:mod:`.helper`).
    """
    from tqdm import tqdm
    t0 = time.perf_counter()
    stages = {VARIANTS[k][0] for k in cfg.variants}
    total = len(cfg.variants) * (cfg.steps + 1) + len(stages) + 1
    # disable=None: tqdm stays quiet when stderr is not a terminal (CI, pipes, tests).
    bar = tqdm(total=total, disable=True if quiet else None, file=sys.stderr, unit="step",
               desc="report", leave=False)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)   # the cluster pins 1 too; this covers the meta steps
    runs = []
    try:
        # the meta steps in a helper process on another CPU while the trainings run here
        with Beside(meta_measurements, cfg, c30) as side:
            results, last = [], cfg.ranks - 1
            for key in cfg.variants:
                bar.set_description(f"{VARIANTS[key][2]} ×{cfg.ranks}")
                # the last rank finishes each step last (ranks take turns): advance the bar there
                results.append(train(cfg.train_config(key), on_step=lambda step, stage:
                                     bar.update(1) if stage.ctx.rank == last else None))
            bar.set_description("meta steps: FLOPs, memory vs N, ZeRO-R"
                                + (" (helper process)" if side.in_helper else ""))
            flops, sweep, zero_r, traces = side.result()
            bar.update(len(cfg.variants) + len(stages) + 1)
        for key, result in zip(cfg.variants, results):
            runs.append(Run(key, VARIANTS[key][2], result,
                            parallel_time(result.timelines, cfg.steps), flops[key]))
    finally:
        torch.set_num_threads(threads)
        bar.close()
    return Measurements(cfg, runs, sweep, time.perf_counter() - t0, zero_r, traces)
