"""``zerospec plan --deepspeed-config DS.JSON --preset NAME``: what a DeepSpeed config will hold and
move, measured by the stage code on meta tensors before anyone launches it.

The config (read once, by zerospec/plan/ds_config.py) maps onto zerospec's own switches
(:func:`config_kwargs`), and one meta step (:func:`zerospec.training.scale.measure`) books memory per
GPU and traffic per step in the same ledgers every test reads:

* ``stage``; the batch keys → the micro-batch per GPU (DeepSpeed's rule for N_d GPUs); fp16/bf16 →
  the precision; ``reduce_bucket_size`` → C_B buckets (``bucket_elements``) for stages 1–3;
  ``contiguous_gradients`` → M_D for gradients at stages 2–3; P_a, P_a+cpu and
  ``contiguous_memory_optimization`` where the step has checkpoints (and N_m >= 2 for P_a);
* stage 1 with ``use_multi_rank_bucket_allreduce`` (DeepSpeed's default) → ZeRO-1's all-reduce
  variant (3Ψ); stage 2's all-reduce variant is not modelled: its reduce-scatter path is measured;
* stage 3: ``stage3_param_persistence_threshold`` and ``stage3_max_reuse_distance`` →
  zerospec/zero/ds3.py (per unit, where DeepSpeed decides per tensor);
* everything else (prefetch, live-parameter bound, overlap, allgather buckets, gradient
  accumulation, and every key ds_config does not read) is listed under "Not modelled", with why.
"""
from __future__ import annotations

from fractions import Fraction

from ..model.presets import preset
from ..render.format import Table, fmt_bytes, fmt_count, fmt_psi
from .ds_config import DeepSpeedConfig


def config_kwargs(ds: DeepSpeedConfig, n_d: int, n_m: int = 1,
                  checkpoint_activations: int = 0) -> tuple[dict, list[str]]:
    """scale.measure's keyword arguments for a DeepSpeed config on N_d × N_m GPUs, and one line per
    setting that does not reach the meta step (with why), then every key of the file zerospec does
    not read (:attr:`DeepSpeedConfig.not_modelled`)."""
    s, b = ds.stage, ds.batch(n_d)
    kw, left = {"precision": ds.precision, "micro_batch": b.micro}, []
    if b.gas > 1:
        left.append(f"gradient_accumulation_steps {b.gas}: one micro-step is measured, not "
                    f"what accumulating across micro-steps holds")
    if s >= 1 and ds.reduce_bucket_size:
        kw["bucket_elements"] = ds.reduce_bucket_size
    if s == 1 and ds.use_multi_rank_bucket_allreduce:
        kw["zero1_comm"] = "all_reduce"
    if s == 2 and ds.use_multi_rank_bucket_allreduce:
        left.append("use_multi_rank_bucket_allreduce at stage 2 (all-reduced buckets, 3Ψ): the "
                    "reduce-scatter path is measured; the closed-form table gives its volume")
    if s >= 2 and ds.contiguous_gradients:
        kw["contiguous_gradients"] = True
    if s in (1, 2):
        left.append("allgather_bucket_size: the updated partitions are gathered per unit")
    if ds.overlap_comm and s in (1, 2):
        left.append("overlap_comm: DeepSpeed then keeps a second reduce bucket in flight; one is "
                    "measured")
    if s == 3:
        kw["stage3_persistence_threshold"] = ds.stage3_param_persistence_threshold
        kw["stage3_max_reuse_distance"] = ds.stage3_max_reuse_distance
        left.append("persistence per tensor: measured per unit (a layer); DeepSpeed also keeps "
                    "each block's biases and norms whole")
        left.append("stage3_prefetch_bucket_size, stage3_max_live_parameters, overlap_comm: when "
                    "parameters arrive, bounded by the units a step gathers at once")
    if ds.partition_activations:
        if n_m >= 2 and checkpoint_activations:
            kw["partition_activations"] = True
            kw["cpu_checkpointing"] = ds.cpu_checkpointing
        else:
            left.append(f"partition_activations: splits checkpoints over the model-parallel group; "
                        f"no effect with N_m = {n_m}" + ("" if checkpoint_activations else
                                                        " and no checkpointing"))
    if ds.contiguous_memory_optimization:
        if checkpoint_activations:
            kw["contiguous_checkpoints"] = True
        else:
            left.append("contiguous_memory_optimization: no checkpoints to make contiguous")
    left += [f"{k} ({why})" for k, why in ds.not_modelled]
    return kw, left


def deepspeed_measured_table(ds: DeepSpeedConfig, name: str, n_d: int) -> Table:
    """One meta step of preset ``name`` on ``n_d`` GPUs under the config's settings."""
    from ..training.scale import measure       # torch: only when a step is measured
    model = preset(name).model
    kw, left = config_kwargs(ds, n_d)
    r = measure(model, ds.stage, n_d, **kw)
    led = r.comm_ledger([0])
    elements = led.elements(0)
    t = Table("deepspeed_measured", f"DeepSpeed ZeRO-{ds.stage} config on {name} "
              f"(Ψ = {fmt_count(r.psi)}), N_d = {n_d}: one step measured on meta tensors",
              ["Quantity (rank 0)", "Measured"])
    t.add("model states per GPU", fmt_bytes(r.model_states(0)))
    t.add(f"peak per GPU ({kw['micro_batch']} × {model.block_size} tokens, {ds.precision})",
          fmt_bytes(r.memory(0).peak_total))
    t.add("gathered parameters at the peak", fmt_bytes(r.memory(0).peak["gathered"]))
    t.add("elements sent per step", f"{elements:,} = {fmt_psi(Fraction(elements, r.psi))}")
    t.add("collectives per step", str(led.count(0)))
    for phase, n in sorted(led.by_phase(0).items()):
        t.add(f"  of which in {phase}", f"{n:,} elements")
    t.notes.append("Settings mapped: " + (", ".join(f"{k}={v:,}" if type(v) is int else f"{k}={v}"
                                                     for k, v in kw.items()) or "none")
                   + ".")
    t.notes.append("Not modelled: " + ("; ".join(left) if left else "nothing") + ".")
    return t


def deepspeed_table(ds, psi: int, n_d: int):
    """What a DeepSpeed config's ZeRO settings imply for Ψ on N_d GPUs, from the closed forms
    (spec/deepspeed.md measures each on a real DeepSpeed). Per-tensor effects (which tensors stay
    whole) need the model's tensor sizes: a meta-tensor prediction is a follow-up."""
    from ..paper import theory
    s = ds.stage
    t = Table("deepspeed_config", f"DeepSpeed ZeRO-{s} config for Ψ = {fmt_count(psi)} on N_d = {n_d} "
              f"GPUs (closed form)", ["Setting", "Value", "What it implies (closed form)"])

    def row(key: str, effect: str) -> None:
        given = "" if key in ds.given else " (default)"
        v = getattr(ds, key)
        t.add(key, f"{v:,}{given}" if not isinstance(v, bool) else f"{v}{given}", effect)

    buckets = lambda size: theory.bucket_collectives(psi, size) if size else None   # noqa: E731
    row("stage", f"{theory.stage(s).name}: partitions {theory.stage(s).partitioned}")
    if s in (1, 2):
        multi = ds.use_multi_rank_bucket_allreduce
        row("use_multi_rank_bucket_allreduce", "each gradient bucket all-reduced (2Ψ), then the "
            "updated partitions all-gathered (Ψ): 3Ψ" if multi else
            "each bucket's partition reduced to its owner (Ψ), then all-gathered (Ψ): the paper's 2Ψ")
        row("reduce_bucket_size", f"{buckets(ds.reduce_bucket_size) or '—'} gradient buckets per step")
        row("allgather_bucket_size", f"{buckets(ds.allgather_bucket_size) or '—'} all-gathers per step")
        k, elems = (3, theory.comm_elements(1, psi, n_d, "all_reduce")) if multi else \
            (2, theory.comm_elements(s, psi, n_d))
    elif s == 3:
        T_, R = ds.stage3_param_persistence_threshold, ds.stage3_max_reuse_distance
        row("stage3_param_persistence_threshold", "nothing kept whole" if T_ == 0 else
            f"tensors of <= {T_:,} elements are not partitioned: whole on every GPU, all-gathered "
            f"again after each step")
        row("stage3_max_reuse_distance", "parameters released after each use: gathered again in "
            "backward" if R == 0 else f"parameters reused within {R:,} elements stay gathered from "
            f"forward to backward" + (" (all of them: R >= 2Ψ)" if R >= 2 * psi else ""))
        row("stage3_prefetch_bucket_size", "elements gathered ahead of use: when, not how much")
        # between a tensor's forward and backward use every other one is fetched at most twice
        if R >= 2 * psi:
            k, elems = 2, theory.comm_elements(2, psi, n_d)      # RS + one gather of each tensor
        elif T_ == 0 and R == 0:
            k, elems = 3, theory.comm_elements(3, psi, n_d)      # the paper's P_os+g+p
        else:
            k, elems = None, None
    else:
        k, elems = 2, theory.comm_elements(0, psi, n_d)          # plain DP: one all-reduce
    volume = (f"{k}Ψ(N−1)/N = {fmt_psi(elems / Fraction(psi))} = {fmt_count(elems)} elements per GPU"
              if k else "between 2Ψ and 3Ψ: depends on tensor sizes and order (a meta-tensor "
                        "prediction is a follow-up)")
    paper = theory.comm_in_psi(s)
    t.add("traffic per step (closed form)", "—", volume + (f"; the paper's stage moves {paper}Ψ"
                                                           if k != paper else "; the paper's volume"))
    t.notes.append("Closed form from the settings and Ψ only (paper.theory); measured against a "
                   "real DeepSpeed in spec/deepspeed.md. Memory per GPU below, by estimator.")
    if ds.not_modelled:    # every key the closed forms do not read, said
        t.notes.append("Not modelled: " + "; ".join(f"{k} ({why})" for k, why in ds.not_modelled)
                       + ".")
    return t
