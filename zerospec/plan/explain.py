"""The OOM explainer: why does (or doesn't) a step fit? One meta step of the real stage code, read
phase by phase, beside the closed forms that count model states only.

:func:`explain` runs :func:`zerospec.training.scale.measure` once with its traces on, takes the
rank class with the highest peak, and replays that rank's ledger trace (alloc/free/phase events,
:class:`~zerospec.runtime.memory.TraceEvent`) to find, per phase, the moment the ledger's total is
highest and the bytes each category holds then: :func:`phase_peaks`. The rank's storage trace
goes through the caching allocator model (zerospec/runtime/replay.py) for the reserved peak, which
is what a GPU runs out on. :func:`tables` renders the phases, the buffers at each phase's peak and
the estimators of zerospec/paper/estimators.py, each with the bytes it leaves out.
"""
from __future__ import annotations

import dataclasses

from ..paper import theory
from ..paper.estimators import estimators
from ..runtime.memory import CATEGORIES, MODEL_STATES, TraceEvent
from ..runtime.trace import replay
from ..training.config import TrainConfig
from ..training.scale import ScaleResult, measure

LABELS = {"param16": "parameters (fp16)", "grad16": "gradients (fp16)",
          "master32": "optimizer: fp32 master", "exp_avg": "optimizer: momentum",
          "exp_avg_sq": "optimizer: variance", "gathered": "gathered units (ZeRO-3)",
          "activations": "activations", "checkpoints": "checkpoints",
          "recomputed": "recomputed activations", "buffer": "buffers", "bucket": "buckets",
          "secondary16": "hpZ secondary shards (fp16)",
          "grad32": "gradients cast to fp32 (DeepSpeed's ZeRO-Offload)",
          "param32": "parameters, fp32 shards Adam updates (FSDP2)",
          "shard_grad32": "gradients, fp32 shards (FSDP2)",
          "ag_buffer": "all-gather buffers (FSDP2)", "rs_buffer": "reduce-scatter input, fp32 (FSDP2)"}


@dataclasses.dataclass(frozen=True)
class PhasePeak:
    """The highest ledger total inside phase ``phase`` and the bytes per category at that moment."""

    phase: str
    peak: int
    buffers: dict[str, int]
    reserved: int | None = None       # the allocator model's reserved peak in the phase


def phase_peaks(trace: list[TraceEvent]) -> list[PhasePeak]:
    """Per phase marker of a ledger trace, in order: the phase's peak (its start counts: what is
    held when it begins) and the category breakdown then; their sum is the peak exactly."""
    current = dict.fromkeys(CATEGORIES, 0)
    total = 0
    best, at = 0, dict(current)
    out = []
    for e in trace:
        if e.op == "phase":
            out.append(PhasePeak(e.label.partition("@")[0], best, at))
            best, at = total, dict(current)
            continue
        n = e.nbytes if e.op == "alloc" else -e.nbytes
        current[e.category] += n
        total += n
        if total > best:
            best, at = total, dict(current)
    return out


@dataclasses.dataclass
class Explanation:
    name: str
    stage: int
    n_d: int
    n_m: int
    seq: int
    micro_batch: int
    checkpoint_activations: int
    capacity: int
    where: str                       # the capacity's source: "dgx-h100 (H100 80 GB)", "--gpu-mem"
    result: ScaleResult
    rank: int                        # the reported rank class's first rank (the highest peak)
    phases: list[PhasePeak]
    reserved: int                    # the allocator model's reserved peak over the step
    precision: str = "fp16"
    notes: tuple[str, ...] = ()      # where the settings came from, what is not modelled
    model: object = None             # the GPTConfig stepped (its block_size: the model's context)
    settings: dict = dataclasses.field(default_factory=dict)   # scale.measure's other keywords
    seq_given: bool = True           # False: seq is the model's context, no --seq given
    not_modelled: dict = dataclasses.field(default_factory=dict)   # file → ["key: why", ...]
    allocated: int = 0               # the allocator model's allocated peak (512-B-rounded blocks)

    @property
    def attention(self) -> str:
        return self.model.attention

    @property
    def highest(self) -> PhasePeak:
        return max(self.phases, key=lambda p: p.peak)   # the first of equal peaks, in step order

    @property
    def peak(self) -> int:
        return self.highest.peak

    @property
    def fits(self) -> bool:
        return self.peak <= self.capacity

    @property
    def psi(self) -> int:
        """Ψ each DP group shards: the model's, or one MP slice's with N_m > 1."""
        return sum(u.numel for u in self.result.units)


def explain(name: str, stage: int, gpus: int, capacity: int, where: str, *, seq: int | None = None,
            micro_batch: int = 1, checkpoint_activations: int = 0, n_m: int = 1,
            model=None, settings: dict | None = None, notes: tuple[str, ...] = (),
            attention: str | None = None, expandable_segments: bool = False) -> Explanation:
    """One meta step of preset ``name`` (or of ``model``, a config named ``name``) at ``stage`` on
    ``gpus`` GPUs (N_d = gpus / n_m) with sequences of ``seq`` tokens (default: the model's
    context), explained against ``capacity``. ``settings``: more of scale.measure's keywords (a
    DeepSpeed config's, zerospec/plan/deepspeed.py); ``notes`` say where they came from.
    ``attention``: the kernel (zerospec/model/flash.py; default the model's own).
    ``expandable_segments``: the allocator setting the reserved peak is replayed under."""
    from .limits import check_meta_step
    if model is None:
        from ..model.presets import preset
        model = preset(name).model
    if attention is not None:
        model = dataclasses.replace(model, attention=attention)
    settings, full, seq_given = dict(settings or {}), model, seq is not None
    context = model.block_size
    seq = context if seq is None else seq
    if not 1 <= seq <= context:
        raise ValueError(f"--seq {seq} is outside 1..{context}, {name}'s context")
    if gpus % n_m:
        raise ValueError(f"--gpus {gpus} must be a multiple of --mp {n_m} (N = N_d × N_m)")
    model = dataclasses.replace(model, block_size=seq)
    check_meta_step(model, micro_batch, n_m)
    r = measure(TrainConfig.of(model=model, stage=stage, n_d=gpus // n_m, n_m=n_m,
                               checkpoint_activations=checkpoint_activations, **settings),
                micro_batch=micro_batch, trace=True)
    cls = max(r.classes, key=lambda c: c.memory.peak_total)
    phases = phase_peaks(cls.memory.trace)
    rep = replay(cls.allocations, expandable_segments=expandable_segments)
    reserved = {}
    for pm in rep.phases:
        reserved[pm.label.partition("@")[0]] = max(reserved.get(pm.label.partition("@")[0], 0),
                                                   pm.peak_reserved)
    phases = [dataclasses.replace(ph, reserved=reserved.get(ph.phase)) for ph in phases]
    return Explanation(name, stage, gpus // n_m, n_m, seq, micro_batch, checkpoint_activations,
                       capacity, where, r, cls.rep * n_m, phases, rep.peak_reserved,
                       settings.get("precision", "fp16"), tuple(notes), full, settings, seq_given,
                       allocated=rep.peak_allocated)


# -- tables -----------------------------------------------------------------------------------------
def tables(ex: Explanation, units: str = "GB", largest_layer: int | None = None) -> list:
    return [phase_table(ex, units), buffer_table(ex, units),
            estimate_table(ex, units, largest_layer)]


def _gb(units: str):
    from ..render.format import fmt_bytes
    return lambda v: fmt_bytes(v, units)


def _signed(units: str):
    from ..render.format import fmt_bytes
    return lambda v: ("+" if v >= 0 else "−") + fmt_bytes(abs(v), units)


def _whole(v) -> str:
    """Bytes with thousands separators; a fractional closed form shows its floor with "≈"."""
    from fractions import Fraction
    v = Fraction(v)
    return f"{int(v):,}" if v.denominator == 1 else f"≈{int(v):,}"


def _setting(ex: Explanation) -> str:
    grid = f"N_d = {ex.n_d}" + (f" × N_m = {ex.n_m}" if ex.n_m > 1 else "")
    k = ex.checkpoint_activations
    ckpt = "" if not k else ", a checkpoint every block" if k == 1 else f", a checkpoint every {k} blocks"
    prec = "" if ex.precision == "fp16" else f", {ex.precision}"
    cfg = ex.result.config
    if cfg.activation_checkpointing != "none":   # torchtitan's modes (zerospec/zero_r/selective.py)
        ckpt += f", {cfg.activation_checkpointing} activation checkpointing"
    if cfg.gpus_per_node:                 # nodes, ZeRO++ and MiCS (zerospec/plan/nodes.py)
        from .nodes import run_label
        extra = run_label(cfg).partition(", ")[2]
        grid += (f" ({cfg.n_ranks // cfg.gpus_per_node} nodes × {cfg.gpus_per_node} GPUs"
                 + (f", {extra}" if extra else "") + ")")
    if cfg.flavour == "fsdp2":            # stage 3 as FSDP2 runs it (zerospec/zero/fsdp2.py)
        prec += ", FSDP2 flavour"
    if cfg.offload_optimizer:             # ZeRO-Offload / Infinity (zerospec/plan/offload.py)
        from .offload import run_label as offload_label
        prec += ", " + offload_label(cfg).partition(", ")[2]
    return (f"{ex.name}, {theory.stage(ex.stage).name}, {grid}, seq {ex.seq}, "
            f"micro-batch {ex.micro_batch}{ckpt}{prec}, {ex.attention} attention")


ATTENTION_NOTES = {
    "eager": "Attention: eager, written out: every layer keeps its B·H·T² scores and "
             "probabilities for backward (--attention sdpa: a memory-efficient kernel).",
    "sdpa": "Attention: sdpa, a memory-efficient kernel keeping q, k, v, the output and an fp32 "
            "log-sum-exp per row, as FlashAttention-2 does (modelled: no such kernel runs here; "
            "--attention eager keeps the B·H·T² scores and probabilities)."}


AC_NOTES = {
    "full": "every block keeps its input (the checkpoints) and is recomputed in backward.",
    "selective-layer": "every K-th block keeps only its input (the checkpoints), the others "
                       "every activation.",
    "selective-op": "every block keeps its input and the outputs of its odd-numbered matmuls "
                    "and of its attention kernel (the checkpoints); the rest is recomputed."}


def _loss_note(ex: Explanation) -> str:
    """The loss's tensors: the logits upcast to fp32 (zerospec/model/gpt.py's ``loss``)."""
    tokens, v = ex.micro_batch * ex.seq, ex.model.padded_vocab(ex.n_m) // ex.n_m   # this rank's
    return (f"Loss: the logits ({tokens:,} tokens × {v:,}) upcast to fp32 before the "
            f"cross-entropy, as torchtitan, Hugging Face and Megatron-LM compute it; log-softmax "
            f"keeps its fp32 output ({tokens * v * 4:,} B, among the activations) for backward, "
            f"which makes fp32 gradients of the same size.")


def assumed(ex: Explanation) -> list[str]:
    """What the explanation assumed and the command line did not say: the attention kernel, and
    the sequence length when no --seq was given."""
    out = [ATTENTION_NOTES[ex.attention], _loss_note(ex)]
    mode = ex.result.config.activation_checkpointing
    if mode != "none":
        out.append(f"Activation checkpointing: torchtitan's {mode} (spec/activations.md): "
                   + AC_NOTES[mode.partition(":")[0]])
    if not ex.seq_given:
        out.append(f"Sequence: {ex.seq:,} tokens, the model's full context (no --seq given).")
    return out


def phase_table(ex: Explanation, units: str = "GB"):
    """Per phase: the rank's ledger peak, the allocator model's reserved peak, and the headroom."""
    from ..render.format import Table
    t = Table("explain_phases", f"Peak per phase, rank {ex.rank}: {_setting(ex)} (measured on meta)",
              ["Phase", "Peak (bytes)", f"Peak ({units})", f"Reserved, allocator model ({units})",
               f"Headroom on {ex.where} ({units})"], fmt={2: _gb(units), 3: _gb(units), 4: _signed(units)})
    hi = ex.highest
    for i, ph in enumerate(ex.phases):
        t.add(ph.phase + (" (highest)" if ph is hi else ""), ph.peak, ph.peak, ph.reserved,
              ex.capacity - ph.peak)
        if ph is hi:
            t.bold |= {(i, c) for c in range(5)}
    g = _gb(units)
    verdict = (f"fits, with {g(ex.capacity - ex.peak)} to spare" if ex.fits else
               f"does NOT fit: over by {g(ex.peak - ex.capacity)}")
    t.notes.append(f"Peak {g(ex.peak)} in {hi.phase} against {g(ex.capacity)} per GPU of "
                   f"{ex.where}: {verdict} (the ledger's peak: every buffer the stage code holds, "
                   f"no fragmentation).")
    t.notes.extend(assumed(ex))
    t.notes.extend(ex.notes)
    frag = ex.reserved - ex.peak
    t.notes.append(f"The caching allocator model reserves {g(ex.reserved)} at most "
                   f"({g(frag)} above the ledger's peak: block rounding and fragmentation); "
                   + ("within" if ex.reserved <= ex.capacity else "beyond") + " the GPU's memory.")
    return t


def buffer_table(ex: Explanation, units: str = "GB"):
    """The bytes of each category at each phase's peak; the last row is the peak (the sum)."""
    from ..render.format import Table
    hi = ex.highest
    cols = ["Buffer"] + [f"{p.phase} ({units})" for p in ex.phases] + [f"at {hi.phase} (bytes)"]
    g = _gb(units)
    t = Table("explain_buffers", f"What makes each phase's peak, rank {ex.rank} (ledger categories)",
              cols, fmt={i: g for i in range(1, len(ex.phases) + 1)})
    for c in CATEGORIES:
        if any(p.buffers[c] for p in ex.phases):
            t.add(LABELS[c], *[p.buffers[c] for p in ex.phases], hi.buffers[c])
    t.add("total (the phase's peak)", *[p.peak for p in ex.phases], hi.peak)
    t.notes.append("Each column is the moment of that phase's peak; its rows sum to the peak exactly.")
    return t


def left_out(ex: Explanation, estimator: str) -> dict[str, int]:
    """Bytes at the highest phase's peak an estimator does not count, by category, plus
    "fragmentation" (the allocator model's reserved peak above the ledger's)."""
    out = {c: b for c, b in ex.highest.buffers.items() if c not in MODEL_STATES and b}
    if estimator == "deepspeed" and ex.stage == 3:
        out.pop("gathered", None)         # its 4L term stands for the gathered units
    out["fragmentation"] = ex.reserved - ex.peak
    return out


def estimate_table(ex: Explanation, units: str = "GB", largest_layer: int | None = None):
    """The closed-form estimates beside the measured peak, each with what it leaves out."""
    from ..render.format import Table
    g = _gb(units)
    L = ex.model.largest_module(ex.n_m) if largest_layer is None else largest_layer
    t = Table("explain_estimates", f"Closed-form estimates vs the measured step, Ψ = {ex.psi:,} "
              f"per DP group, N_d = {ex.n_d}", ["Estimate", "Formula", "Per GPU (bytes)",
                                                f"Per GPU ({units})", f"Fits {ex.where}",
                                                "Leaves out (at the highest phase)"],
              fmt={2: _whole, 3: g})
    for name, est in estimators(L, ex.precision).items():
        b = est.model_state_bytes(ex.stage, ex.psi, ex.n_d)
        miss = ", ".join(f"{LABELS.get(c, c)} {g(v)}" for c, v in left_out(ex, name).items())
        t.add(f"{name} (model states)", est.formula(ex.stage), b, b,
              None if b is None else b <= ex.capacity, "—" if b is None else miss)
    t.add("measured: model states after setup", "ledger", ex.result.model_states(ex.rank),
          ex.result.model_states(ex.rank), ex.result.model_states(ex.rank) <= ex.capacity,
          "activations, buffers, fragmentation")
    t.add("measured: step peak", "ledger", ex.peak, ex.peak, ex.fits, "fragmentation")
    t.add("allocator model: reserved peak", "replay", ex.reserved, ex.reserved,
          ex.reserved <= ex.capacity, "—")
    t.notes.append(f"DeepSpeed's L = {L:,} parameters (the largest single module, as its "
                   f"model_to_params takes it"
                   + (")." if largest_layer is None else "; --largest-layer).")
                   + " An estimate that fits while the step peak does not is the gap a "
                     "model-states-only formula hides.")
    return t

