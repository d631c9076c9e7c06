"""The paper's evaluation runs (§10, the appendix's rows), measured on meta and timed on a machine.

Each appendix row (zerospec/paper/evaluation.py, C52) is run as one meta step at its exact shape,
GPU count, MP degree and batch (:func:`zerospec.training.scale.measure`, FLOPs counted in rank
0's class, the one timed; every class stepped, for the highest peak), and timed by
:mod:`zerospec.evaluation.timing` on a spec-sheet :class:`~zerospec.paper.hardware.Machine`.
Two ways to run a row:

* **ZeRO** (the paper's ZeRO-100B): Table 3's C4, P_os+g with C_B, M_D and P_a; C3 at MP 1,
  which is C4 there: P_a over a group of one keeps the whole checkpoint (zerospec/zero_r/partition.py).
* **The Megatron-LM baseline** (C38, C40): model parallelism over the row's MP degree and plain
  data parallelism over the rest, i.e. ZeRO stage 0 with N_m = MP: every DP rank holds 16Ψ/N_m
  of model states and all-reduces its fp16 gradients. Activations are checkpointed per block,
  as Megatron-LM's GPT-2 runs did (``--checkpoint-activations``), and not partitioned (P_a is
  ZeRO-R's). On 128 GPUs without MP (Figure 4) this is PyTorch DDP's data parallelism.

Results are cached per (row, how): the claim tests, the CLI and the benchmarks share them.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect

from ..model.presets import gpt
from ..paper import evaluation as ev
from ..paper.hardware import DGX2, Machine
from ..training.fit import largest, max_micro_batch
from ..training.config import TrainConfig
from ..training.scale import ScaleResult, measure
from .configs import CONFIGS, FIG6, FIG6_PROBES, ZeroConfig, max_layers
from .timing import StepTime, step_time

BASELINE_KW = dict(checkpoint_activations=1)      # Megatron-LM: checkpoints, no ZeRO-R


def memoised(fn):
    """``functools.lru_cache`` keyed on the arguments as bound, defaults filled in: lru_cache alone
    keys ``step(r, "zero")`` and ``step(r, "zero", None)`` apart, and so measured the same
    paper-scale step once per way of calling it (36 s of the slow tests' CPU). ``cache_clear`` as
    lru_cache's. The report's cached paper-scale runs all go through it (here and cached.py)."""
    signature = inspect.signature(fn)
    memo = functools.lru_cache(maxsize=None)(fn)

    @functools.wraps(fn)
    def call(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return memo(*bound.args, **bound.kwargs)
    call.cache_clear, call.cache_info = memo.cache_clear, memo.cache_info
    return call


def zero_config(run: ev.Run) -> ZeroConfig:
    """The configuration ZeRO's rows run as: C4, or C3 at MP 1 (C4's P_a there keeps C3's bytes)."""
    return CONFIGS["C4" if run.mp > 1 else "C3"]


def step(run: ev.Run, how: str = "zero", config: str | None = None) -> ScaleResult:
    """One meta step of ``run`` with FLOPs, rank 0's class alone (the one timed; :func:`peak`
    steps the others): :func:`measured`. Memoised on what the step is, not on the table that
    prints the row: Figure 8's 170B row and Figure 2's are one step."""
    return _step(dataclasses.replace(run, source=""), how, config)


def measured(run: ev.Run, how: str = "zero", config: str | None = None,
             count_in: int | None = 0, only: int | None = None) -> ScaleResult:
    """One meta step of ``run``, measured afresh: ``how`` "zero" (``config``, else
    :func:`zero_config`) or "baseline" (stage 0 over the row's N_d × MP grid, module doc); FLOPs
    counted in the rank class ``count_in`` (None: every class); ``only``: that class alone
    (:func:`zerospec.training.scale.measure`'s)."""
    model = gpt(run.layers, run.hd, run.heads)
    how_ = dict(micro_batch=run.batch_per_gpu, count_in=count_in, only=only)
    if how == "baseline":
        return measure(TrainConfig.of(model=model, stage=0, n_d=run.n_d, n_m=run.mp,
                                      count_flops=True, **BASELINE_KW), **how_)
    if how != "zero":
        raise ValueError(f"how must be 'zero' or 'baseline', got {how!r}")
    c = CONFIGS[config] if config else zero_config(run)
    return measure(TrainConfig.of(model=model, stage=c.stage, n_d=run.n_d, count_flops=True,
                                  **c.kwargs(run.mp)), **how_)


@memoised
def _step(run: ev.Run, how: str = "zero", config: str | None = None) -> ScaleResult:
    return measured(run, how, config, only=0)


step.cache_clear, step.cache_info = _step.cache_clear, _step.cache_info


def highest_peak(r: ScaleResult) -> int:
    """The highest measured peak of any rank class (bytes)."""
    return max(c.memory.peak_total for c in r.classes)


def peak(run: ev.Run, how: str = "zero", config: str | None = None) -> int:
    """The highest measured peak of any rank class of ``run``'s step (bytes): rank 0's class
    from :func:`step`, each other stepped alone when first asked for, without the op counter
    (which changes no byte: tests/unit/evaluation/test_timing.py). Figure 2 reads no peak, so
    its ZeRO rows step rank 0's class only."""
    return _peak(dataclasses.replace(run, source=""), how, config)


@memoised
def _peak(run: ev.Run, how: str = "zero", config: str | None = None) -> int:
    r = step(run, how, config)
    return max([highest_peak(r)] + [highest_peak(measured(run, how, config, only=i))
                                    for i in range(1, r.class_count)])


@dataclasses.dataclass(frozen=True)
class Timed:
    """One row, measured and timed: its step without overlap, with backward overlap, and with a
    ring leaving the node paced by one InfiniBand link (timing.py); its peak when asked for."""

    run: ev.Run
    how: str
    config: str | None
    none: StepTime
    overlap: StepTime
    link: StepTime

    @property
    def peak(self) -> int:
        return peak(self.run, self.how, self.config)

    @property
    def fits(self) -> bool:
        return self.peak <= DGX2.memory_bytes


@memoised
def timed(run: ev.Run, how: str = "zero", config: str | None = None,
          machine: Machine = DGX2) -> Timed:
    r = step(run, how, config)
    return Timed(run, how, config, step_time(r, machine), step_time(r, machine, "backward"),
                 step_time(r, machine, inter="link"))


# -- Figure 2 (C38, C41, C42, C53): ZeRO against the Megatron-LM baseline --------------------------------
FIGURE2_CONFIG = {"170B": "C5"}    # C49: only P_a+cpu runs 170B at its batch (C4 peaks at 33 GB)


def figure2(sizes=None) -> list[tuple[Timed, Timed]]:
    """(ZeRO, baseline) per model size of Figure 2, in the paper's order."""
    sizes = sizes or [r.size for r in ev.FIGURE2 if r.who == "ZeRO"]
    row = {(r.size, r.who): r for r in ev.FIGURE2}
    return [(timed(row[s, "ZeRO"], config=FIGURE2_CONFIG.get(s)),
             timed(row[s, "Baseline"], "baseline")) for s in sizes]


# -- Figure 3 (C43): 60B on 64 to 400 GPUs -----------------------------------------------------------------
def figure3() -> list[Timed]:
    return [timed(run, config="C4") for run in ev.FIGURE3]


# -- Figure 4 (C44, C5, C55): data parallelism alone on 128 GPUs --------------------------------------------
@dataclasses.dataclass(frozen=True)
class DPLimit:
    """The largest layer count of one shape family that fits 32 GB at a batch, by fit.largest."""

    how: str
    hd: int
    heads: int
    batch: int
    layers: int

    @property
    def psi(self) -> int:
        return gpt(self.layers, self.hd, self.heads).psi if self.layers else 0


def figure4_rows() -> list[Timed]:
    """Figure 4's rows: ZeRO's as C3 (P_os+g, C_B, M_D: the paper's ZeRO-100B without MP), the
    baselines' as stage 0, each at its appendix batch on 128 GPUs."""
    return [timed(r) if r.who == "ZeRO" else timed(r, "baseline") for r in ev.FIGURE4]


@memoised
def baseline_batch(run: ev.Run, capacity: int = DGX2.memory_bytes) -> int:
    """The most sequences per GPU the baseline (stage 0) fits for ``run``'s model and grid
    (fit.max_micro_batch); 0: not even one."""
    return max_micro_batch(gpt(run.layers, run.hd, run.heads), 0, run.n_d, capacity, n_m=run.mp,
                           **BASELINE_KW)


@memoised
def dp_limit(how: str, hd: int, heads: int, batch: int, gpus: int = 128,
             capacity: int = DGX2.memory_bytes) -> DPLimit:
    """The most layers (hidden ``hd``) whose step, without MP, peaks within ``capacity`` on
    every rank: ``how`` "zero" (C3) or "baseline" (stage 0)."""
    stage, kw = (CONFIGS["C3"].stage, CONFIGS["C3"].kwargs(1)) if how == "zero" else (0, BASELINE_KW)

    def step(L: int) -> int:
        r = measure(TrainConfig.of(model=gpt(L, hd, heads), stage=stage, n_d=gpus, **kw),
                    micro_batch=batch)
        return highest_peak(r)
    return DPLimit(how, hd, heads, batch, largest(step, capacity).value or 0)


def figure4_limits() -> list[DPLimit]:
    """ZeRO in the 13B row's family at its batch of 2; the baseline in its two rows' families
    at their batches (1.16B: 1920 wide, 8 sequences; 1.38B: 1536 wide, 1)."""
    rows = {r.size: r for r in ev.FIGURE4}
    return [dp_limit("zero", rows["13B"].hd, rows["13B"].heads, rows["13B"].batch_per_gpu)] + [
        dp_limit("baseline", rows[s].hd, rows[s].heads, rows[s].batch_per_gpu)
        for s in ("1.16B", "1.38B")]


# -- Figure 6 (C47) and Figure 8 (C49) ---------------------------------------------------------------------
@memoised
def figure6() -> dict[str, tuple[int, int, int]]:
    """Per configuration: (the most layers at hidden 8192 that fit 32 GB at 400 GPUs, MP 16,
    16 sequences per GPU; the measured peak at L; at L + 1)."""
    out = {}
    for name, c in CONFIGS.items():
        seen: dict[int, int] = {}
        L, _ = max_layers(c, DGX2.memory_bytes, probes=FIG6_PROBES, seen=seen)
        out[name] = (L, seen[L], seen[L + 1])
    return out


def figure6_psi(layers: int) -> int:
    return gpt(layers, FIG6["d"], FIG6["heads"]).psi


def figure8() -> dict[str, Timed]:
    """Figure 8's 60B rows (128 GPUs, MP 16) at the appendix batches for C1–C5."""
    return {name: timed(run, config=name) for run, name in zip(ev.FIGURE8[:5], CONFIGS)}
