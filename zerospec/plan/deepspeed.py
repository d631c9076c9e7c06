"""``zerospec plan --deepspeed-config DS.JSON --preset NAME``: what a DeepSpeed config will hold and
move, measured by the stage code on meta tensors before anyone launches it.

The config (read once, by zerospec/plan/ds_config.py) maps onto zerospec's own switches
(:func:`config_kwargs`), and one meta step (:func:`zerospec.training.scale.measure`) books memory per
GPU and traffic per step in the same ledgers every test reads:

* ``stage``; the batch keys → the micro-batch per GPU (DeepSpeed's rule for N_d GPUs); fp16/bf16 →
  the precision; ``reduce_bucket_size`` → C_B buckets (``bucket_elements``) for stages 1–3;
  ``contiguous_gradients`` → M_D for gradients at stages 2–3; ``partition_activations`` (P_a),
  ``cpu_checkpointing`` (P_a+cpu, or with P_a off the whole checkpoint on the host) and
  ``contiguous_memory_optimization`` where the step has checkpoints, at every N_m as DeepSpeed
  reads them (at N_m = 1 a partition over a group of one: the whole checkpoint);
  ``contiguous_memory_optimization`` without ``partition_activations`` is DeepSpeed's assertion;
* stage 1 with ``use_multi_rank_bucket_allreduce`` (DeepSpeed's default) → ZeRO-1's all-reduce
  variant (3Ψ); stage 2's all-reduce variant is not modelled: its reduce-scatter path is measured;
* stage 3: ``stage3_param_persistence_threshold`` and ``stage3_max_reuse_distance`` →
  zerospec/zero/stage3_deepspeed.py (per unit, where DeepSpeed decides per tensor); ZeRO++'s
  ``zero_hpz_partition_size`` → hpZ (needs the GPUs per node), ``zero_quantized_weights`` → qwZ,
  ``zero_quantized_gradients`` → qgZ; ``mics_shard_size`` → MiCS's partition groups, modelled
  though DeepSpeed 0.19 refuses the key (MiCS removed; FSDP2's HSDP is its peer, spec/mics.md);
* ``offload_optimizer`` (device cpu or nvme) → ZeRO-Offload in DeepSpeed's mode (its fp32
  gradients cross PCIe, spec/offload.md), ``offload_param`` → ZeRO-Infinity's parameter offload;
  with device nvme, DeepSpeed's pinned swap buffers (``buffer_count`` × ``buffer_size``) count as
  host memory (zerospec/plan/offload.py); every stage-3 setting passes with them;
* everything else (prefetch, live-parameter bound, overlap, allgather buckets, gradient
  accumulation, and every key ds_config does not read) is listed under "Not modelled", with why.
"""
from __future__ import annotations

from fractions import Fraction

from ..model.presets import preset
from ..render.format import Table, fmt_bytes, fmt_count, fmt_psi
from .ds_config import DeepSpeedConfig
from .ds_offload import offload_kwargs as _offload_kwargs, offload_rows as _offload_rows
from .ds_zeropp import MICS_NOTE, hpz_check  # noqa: F401  (MICS_NOTE: read from here by tests)
from .ds_zeropp import zeropp_kwargs as _zeropp_kwargs, zeropp_rows as _zeropp_rows




def config_kwargs(ds: DeepSpeedConfig, n_d: int, checkpoint_activations: int = 0,
                  gpus_per_node: int | None = None) -> tuple[dict, list[str]]:
    """scale.measure's keyword arguments for a DeepSpeed config on N_d data-parallel ranks (of N_m
    GPUs each: nothing here depends on N_m; nodes of ``gpus_per_node``; None: one node), whether
    the step has activation checkpoints, and one line per setting that does not reach the meta step
    (with why), then every key of the file zerospec does not read
    (:attr:`DeepSpeedConfig.not_modelled`)."""
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
    if ds.stage == 3 and ds.zero_hpz_partition_size > 1 and gpus_per_node is None:
        hpz_check(ds, n_d, None)
    kw.update(_zeropp_kwargs(ds, gpus_per_node, left))
    kw.update(_offload_kwargs(ds, kw, left))
    _activation_kwargs(ds, checkpoint_activations, kw, left)
    left += [f"{k} ({why})" for k, why in ds.not_modelled]
    return kw, left


def _activation_kwargs(ds: DeepSpeedConfig, checkpoint_activations: int, kw: dict,
                       left: list) -> None:
    """activation_checkpointing's three keys as DeepSpeed 0.19.8 reads them
    (deepspeed/runtime/activation_checkpointing/checkpointing.py), at every N_m: configure()
    asserts contiguous_memory_optimization needs partition_activations (an error here too);
    partition_activations splits each checkpoint over mp_size ranks (get_partition_size), 1
    without an mpu: the whole checkpoint, kept in a copy of its own; cpu_checkpointing puts the
    part on the host (partition_activations()), or without partitioning the whole checkpoint
    (CheckpointFunction.forward's elif CPU_CHECKPOINT). They act only on checkpoints: without
    them each key is listed."""
    if ds.contiguous_memory_optimization and not ds.partition_activations and \
            checkpoint_activations:
        raise ValueError(f"{ds.path!r}: activation_checkpointing.contiguous_memory_optimization "
                         f"= true needs activation_checkpointing.partition_activations = true: "
                         f"DeepSpeed's checkpointing.configure() asserts it (\"Contiguous "
                         f"Checkpointing is only available with partitioned activations\")")
    for key, ours in (("partition_activations", "partition_activations"),
                      ("cpu_checkpointing", "cpu_checkpointing"),
                      ("contiguous_memory_optimization", "contiguous_checkpoints")):
        if not getattr(ds, key):
            continue
        if checkpoint_activations:
            kw[ours] = True
        else:
            left.append(f"{key}: acts on activation checkpoints; the step has none "
                        f"(--checkpoint-activations K)")


def deepspeed_measured_table(ds: DeepSpeedConfig, name: str, n_d: int,
                             gpus_per_node: int | None = None, extra: dict | None = None) -> Table:
    """One meta step of preset ``name`` on ``n_d`` GPUs (nodes of ``gpus_per_node``) under the
    config's settings and ``extra`` (the command line's hpz, qwz, ...: must agree with the file)."""
    from ..training.config import TrainConfig  # torch: only when a step is measured
    from ..training.scale import measure
    model = preset(name).model
    kw, left = config_kwargs(ds, n_d, gpus_per_node=gpus_per_node)
    kw = merge(ds, kw, extra or {})
    pinned = None
    if kw.get("offload_optimizer"):
        from .offload import config_pinned
        pinned = config_pinned(ds, model, ds.stage, n_d)
    micro = kw.pop("micro_batch", 1)
    r = measure(TrainConfig.of(model=model, stage=ds.stage, n_d=n_d, **kw), micro_batch=micro)
    kw["micro_batch"] = micro
    led = r.comm_ledger([0])
    elements = led.elements(0)
    t = Table("deepspeed_measured", f"DeepSpeed ZeRO-{ds.stage} config on {name} "
              f"(Ψ = {fmt_count(r.psi)}), N_d = {n_d}: one step measured on meta tensors",
              ["Quantity (rank 0)", "Measured"])
    t.add("model states per GPU", fmt_bytes(r.model_states(0)))
    t.add(f"peak per GPU ({kw['micro_batch']} × {model.block_size} tokens, {ds.precision}, "
          f"{model.attention} attention)",
          fmt_bytes(r.memory(0).peak_total))
    t.add("gathered parameters at the peak", fmt_bytes(r.memory(0).peak["gathered"]))
    t.add("elements sent per step", f"{elements:,} = {fmt_psi(Fraction(elements, r.psi))}")
    t.add("collectives per step", str(led.count(0)))
    for phase, n in sorted(led.by_phase(0).items()):
        t.add(f"  of which in {phase}", f"{n:,} elements")
    if r.config.gpus_per_node:
        from .nodes import node_bytes
        nb = node_bytes(r)
        t.add("bytes leaving node 0 per step", f"{nb.across():,} B "
              f"= {nb.across() / (2 * nb.psi_padded):.4f}M (M = Ψ padded, in fp16 elements)")
        for c in nb.sent:
            t.add(f"  of which {c}", f"{nb.node_total(c, 'inter'):,} B")
    if pinned is not None:   # ZeRO-Offload / Infinity: the host and NVMe tiers, each link
        from .offload import LABELS, offload_bytes
        ob = offload_bytes(r)
        t.add("host memory per GPU (peak of the step)", fmt_bytes(ob.host_peak))
        for sec, n in pinned.items():
            t.add(f"  + DeepSpeed's pinned swap buffers ({sec})", fmt_bytes(n))
        if pinned:
            t.add("host memory per GPU with pinned buffers",
                  fmt_bytes(ob.host_peak + sum(pinned.values())))
        t.add("NVMe per GPU (swap files)", fmt_bytes(ob.nvme))
        for op in list(LABELS)[1:]:
            t.add(f"{LABELS[op]} per step", f"{ob.moved[op]:,} B")
    t.notes.append("Settings mapped: " + (", ".join(f"{k}={v:,}" if type(v) is int else f"{k}={v}"
                                                     for k, v in kw.items()) or "none")
                   + ".")
    t.notes.append("Not modelled: " + ("; ".join(left) if left else "nothing") + ".")
    return t


def merge(ds: DeepSpeedConfig, kw: dict, extra: dict) -> dict:
    """The config's measure() settings with the command line's ``extra``; a flag that contradicts
    the file is refused, naming both."""
    out = dict(kw)
    for k, v in extra.items():
        if k in out and out[k] != v:
            raise ValueError(f"--{k.replace('_', '-')} {v} contradicts {ds.path}'s {k}={out[k]} "
                             f"(from its zero_optimization); drop one")
        out[k] = v
    return out


def deepspeed_table(ds, psi: int, n_d: int, gpus_per_node: int | None = None):
    """What a DeepSpeed config's ZeRO settings imply for Ψ on N_d GPUs, from the closed forms
    (spec/deepspeed.md measures each on a real DeepSpeed). Per-tensor effects (which tensors stay
    whole) need the model's tensor sizes: a meta-tensor prediction is a follow-up."""
    from ..paper import theory
    s = ds.stage
    hpz_check(ds, n_d, gpus_per_node)
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
    _zeropp_rows(ds, psi, n_d, row)
    _offload_rows(ds, psi, n_d, t)
    _other_rows(ds, n_d, row, t)
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


def _other_rows(ds: DeepSpeedConfig, n_d: int, row, t) -> None:
    """The settings the closed forms above do not move, each said, and the batch keys by
    DeepSpeed's rule (an inconsistent batch is refused here as in the measured step)."""
    s = ds.stage
    if s == 3:
        row("reduce_bucket_size", "gradient buckets: when gradients are reduced; the volume above")
        row("stage3_max_live_parameters", "bounds the parameters gathered at once: the closed "
            "form gathers one layer at a time (the measured step, --preset, one unit)")
    if s >= 2:
        row("contiguous_gradients", "gradients copied into one contiguous buffer (M_D): the same "
            "model-state bytes; the measured step (--preset) books it")
    row("overlap_comm", "reductions overlapped with backward: when, not how much (DeepSpeed also "
        "keeps a second reduce bucket in flight at stages 1–2, measured with --preset)")
    for key in ("partition_activations", "cpu_checkpointing", "contiguous_memory_optimization"):
        if key in ds.given:
            row(key, "activations: not model states; measured by `plan --explain "
                "--checkpoint-activations K`")
    if ds.train_batch_size is None and ds.train_micro_batch_size_per_gpu is None and \
            "train_micro_batch_size_per_gpu" not in ds.auto:
        t.add("batch", "not set", "neither train_batch_size nor train_micro_batch_size_per_gpu: "
              "DeepSpeed will not start without one (a measured step refuses it); model states "
              "do not depend on it")
    elif "train_micro_batch_size_per_gpu" in ds.auto:
        t.add("batch", "auto", "train_micro_batch_size_per_gpu \"auto\": transformers fills it "
              "from per_device_train_batch_size (`plan --explain --micro-batch N`); model states "
              "do not depend on it")
    else:
        b = ds.batch(n_d)
        t.add("batch", f"{b.micro} × {b.gas} × {n_d}", f"train_batch_size {b.train:,} = "
              f"micro-batch × gradient_accumulation_steps × N_d (DeepSpeed's rule); model states "
              f"do not depend on it, activations do (`plan --explain`)")
    for key, how in ds.resolved:
        t.notes.append(f"{key}: {how}.")
