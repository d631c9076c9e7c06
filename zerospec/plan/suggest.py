"""What to change when a step does not fit (``plan --explain``): each change a user can make on
the command line, with the peak of a meta step of the changed run, fitting ones first.

The changes, each measured (one or a few meta steps of the real stage code, the explained run's
settings otherwise):

- **checkpointing**: a checkpoint every block (``--checkpoint-activations 1``), when the run
  checkpoints less often;
- **stage**: the first higher ZeRO stage that fits (else stage 3);
- **offload**: at stage 2 or 3, the optimizer states to the host (``--offload-optimizer cpu``),
  then at stage 3 the parameters too (``--offload-params cpu``);
- **GPUs**: the fewest doublings of the GPU count that fit. Two steps, at N and 2N, split the peak
  into a part that shrinks as 1/N (the partitioned states) and one that does not; the first
  doubling that this line says fits is measured, and the next one too if it does not fit;
  where the part that does not shrink exceeds the GPU alone, no GPU count fits;
- **micro-batch**, **sequence**: the largest smaller value that fits (zerospec/plan/explain_fit.py's
  search).

With a DeepSpeed config the stage, offload and micro-batch are the file's, so only
checkpointing, GPUs and sequence are suggested. When a checkpoint every block is not enough on
its own, each other change is tried again with checkpointing added (a longer sequence, say, than
without it).

Order ("best first"): the changes that fit before those that do not; then the changes that keep
the run's math and batch (checkpointing: recompute; a higher stage or offload: more traffic),
then more GPUs, then a smaller micro-batch or a shorter sequence (which change what a step
trains), the larger micro-batch or sequence first; then the lower peak.
"""
from __future__ import annotations

import dataclasses

from ..paper.theory import stage as stage_info

KINDS = ("checkpointing", "stage", "offload", "gpus", "micro-batch", "sequence")
MAX_DOUBLINGS = 20          # GPUs: at most N·2^20, and never past MAX_GPUS


@dataclasses.dataclass(frozen=True)
class Suggestion:
    """One change: what it is, the flags that make it, the measured peak, whether it fits."""

    kind: str
    change: str
    flags: tuple[str, ...]
    peak: int
    fits: bool
    kept: int = 0     # micro-batch / sequence: the value kept (more is better); else 0

    def to_json(self) -> dict:
        return {"kind": self.kind, "change": self.change, "flags": list(self.flags),
                "peak_bytes": self.peak, "fits": self.fits}


def step_peak(ex, *, checkpoint_activations=None, micro_batch=None, seq=None, n_d=None,
              stage=None, settings=None) -> int:
    """The ledger peak (the highest rank class's) of one meta step of ``ex``'s run with the
    given changes (each changed run stepped once per explanation: the peaks are kept on it)."""
    key = (checkpoint_activations, micro_batch, seq, n_d, stage,
           tuple(sorted((settings or {}).items())))
    memo = ex.__dict__.setdefault("_changed_peaks", {})
    if key not in memo:
        from .explain_fit import step_peak as measured
        memo[key] = measured(ex, micro_batch, seq, checkpoint_activations, n_d=n_d, stage=stage,
                             settings=settings)
    return memo[key]


def _buildable(ex, **changes) -> int | None:
    """:func:`step_peak`, or None where the changed run is one the stages refuse (hpZ beside
    MiCS, say): a change the user could not make is not suggested."""
    try:
        return step_peak(ex, **changes)
    except ValueError:
        return None


def suggestions(ex, config_given: bool = False) -> list[Suggestion]:
    """The changes that would make ``ex``'s step fit, best first (none when it fits)."""
    if ex.fits:
        return []
    out = _singles(ex, {}, config_given)
    if not any(s.fits for s in out if s.kind == "checkpointing") and not _every_block(ex):
        out += [s for s in _singles(ex, {"checkpoint_activations": 1}, config_given)
                if s.kind != "checkpointing"]
    return sorted(out, key=lambda s: (not s.fits, KINDS.index(s.kind), -s.kept, s.peak))


def _every_block(ex) -> bool:
    """The step checkpoints every block already: Megatron's k = 1 or torchtitan's full."""
    return ex.checkpoint_activations == 1 or ex.settings.get("activation_checkpointing") == "full"


def _ckpt_flag(ex) -> tuple[str, ...]:
    """A checkpoint every block, in the rule the step was given (torchtitan's mode or Megatron's k:
    the two are not given together)."""
    if ex.settings.get("activation_checkpointing", "none") != "none":
        return ("--activation-checkpointing", "full")
    return ("--checkpoint-activations", "1")


def _ckpt_flags(ex, base: dict) -> tuple[str, ...]:
    return _ckpt_flag(ex) if base else ()


def _singles(ex, base: dict, config_given: bool) -> list[Suggestion]:
    """Each change on top of ``base`` (nothing, or checkpointing), measured."""
    cap, out = ex.capacity, []
    pre, also = _ckpt_flags(ex, base), (" with a checkpoint every block" if base else "")

    def add(kind, change, flags, peak, kept=0):
        out.append(Suggestion(kind, change + also, pre + tuple(flags), peak, peak <= cap, kept))

    if not base and not _every_block(ex):
        add("checkpointing", "a checkpoint every block", _ckpt_flag(ex),
            step_peak(ex, checkpoint_activations=1))
    if not config_given:
        for s in range(ex.stage + 1, 4):
            p = _buildable(ex, stage=s, **base)
            if p is not None and (p <= cap or s == 3):
                add("stage", stage_info(s).name, ("--stage", str(s)), p)
                break
        if ex.stage >= 2 and not ex.settings.get("offload_optimizer"):
            p = _buildable(ex, settings={"offload_optimizer": "cpu"}, **base)
            if p is not None and (p <= cap or ex.stage < 3):
                add("offload", "the optimizer states on the host (ZeRO-Offload)",
                    ("--offload-optimizer", "cpu"), p)
            elif p is not None:
                p = _buildable(ex, settings={"offload_optimizer": "cpu", "offload_params": "cpu"},
                               **base)
                if p is not None:
                    add("offload", "the optimizer states and the parameters on the host "
                        "(ZeRO-Infinity)", ("--offload-optimizer", "cpu", "--offload-params",
                                            "cpu"), p)
    g = _gpus(ex, base)
    if g is not None:
        n_d, p = g
        add("gpus", f"{n_d * ex.n_m:,} GPUs (N_d = {n_d:,})", ("--gpus", str(n_d * ex.n_m)), p)
    if ex.micro_batch > 1 and not config_given:
        from ..training.fit import largest
        e = largest(lambda m: step_peak(ex, micro_batch=m, **base), cap, lo=1,
                    hi=ex.micro_batch - 1)
        v = e.value or 1
        add("micro-batch", f"micro-batch {v}", ("--micro-batch", str(v)), e.peaks[v], v)
    if ex.seq > 1:
        from ..training.fit import largest
        e = largest(lambda t: step_peak(ex, seq=t, **base), cap, lo=1, hi=ex.seq - 1)
        v = e.value or 1
        add("sequence", f"sequence length {v:,}", ("--seq", str(v)), e.peaks[v], v)
    return out


def _gpus(ex, base: dict) -> tuple[int, int] | None:
    """(N_d, its measured peak) for the fewest doublings of N_d that fit, or the last measured
    doubling where none is predicted to; None where N_d cannot grow."""
    from .limits import MAX_GPUS
    n = ex.n_d
    if 2 * n * ex.n_m > MAX_GPUS:
        return None
    p1 = step_peak(ex, **base) if base else ex.peak
    p2 = step_peak(ex, n_d=2 * n, **base)
    if p2 <= ex.capacity:
        return 2 * n, p2
    shrinks = 2 * n * (p1 - p2)          # S in peak(N) = A + S/N, from the two steps
    fixed = p1 - shrinks // n            # A: what more GPUs do not divide
    if shrinks <= 0 or fixed >= ex.capacity:
        return 2 * n, p2
    k = 1
    while (2 ** k * n) * (ex.capacity - fixed) < shrinks and k < MAX_DOUBLINGS:
        k += 1
    last = (2 * n, p2)
    for j in (k, k + 1):
        m = 2 ** j * n
        if j <= 1 or m * ex.n_m > MAX_GPUS:
            continue
        last = (m, step_peak(ex, n_d=m, **base))
        if last[1] <= ex.capacity:
            break
    return last


def suggestion_table(items: list[Suggestion], ex, units: str = "GB"):
    """The suggestions as a table: the change, its flags, the measured peak, fits or not."""
    from ..render.format import Table, fmt_bytes
    t = Table("explain_suggestions", f"What would make it fit {ex.where} "
              f"({fmt_bytes(ex.capacity, units)} per GPU), best first (each measured on meta)",
              ["Change", "Flags", "Peak (bytes)", f"Peak ({units})", "Fits"],
              fmt={3: lambda v: fmt_bytes(v, units)})
    for s in items:
        t.add(s.change, " ".join(s.flags), s.peak, s.peak, s.fits)
    if not any(s.fits for s in items):
        t.notes.append("No change tried fits, on its own or with checkpointing.")
    t.notes.append("Order: fitting first; then changes that keep the run's math and batch "
                   "(checkpointing, a higher stage, offload), more GPUs, then a smaller "
                   "micro-batch or shorter sequence (the larger first); then the lower peak.")
    return t


def summary(ex, items: list[Suggestion]) -> dict:
    """``plan --explain --format json``'s summary: what a script needs to act on the answer."""
    return {"model": ex.name, "psi": ex.model.psi, "attention": ex.attention,
            "attention_modelled": ex.attention == "sdpa", "stage": ex.stage,
            "flavour": ex.result.config.flavour, "precision": ex.precision,
            "gpus": ex.n_d * ex.n_m, "seq": ex.seq,
            "seq_from": "--seq" if ex.seq_given else "the model's context",
            "micro_batch": ex.micro_batch, "checkpoint_activations": ex.checkpoint_activations,
            "capacity_bytes": ex.capacity, "peak_bytes": ex.peak, "fits": ex.fits,
            "reserved_bytes": ex.reserved,
            # the step's storage trace through the caching allocator model: what
            # torch.cuda.max_memory_allocated() and max_memory_reserved() would read
            "peak_allocated_bytes": ex.allocated, "peak_reserved_bytes": ex.reserved,
            "not_modelled": {f: list(keys) for f, keys in ex.not_modelled.items()},
            "suggestions": [s.to_json() for s in items]}
