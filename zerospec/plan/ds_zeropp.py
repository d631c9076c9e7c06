"""ZeRO++'s and MiCS's keys of a DeepSpeed config (``zero_hpz_partition_size``,
``zero_quantized_weights``, ``zero_quantized_gradients``, ``mics_shard_size``): what they pass to
the meta step and what they move in closed form (spec/zeropp.md, spec/mics.md), with the one hpZ
check both paths apply (zerospec/plan/deepspeed.py reads them through here)."""
from __future__ import annotations

from ..render.format import fmt_bytes, fmt_count
from .ds_config import DeepSpeedConfig

MICS_NOTE = ("mics_shard_size: modelled by zerospec (spec/mics.md), but DeepSpeed 0.19 removed MiCS "
             "and refuses the key; FSDP2's HSDP is the running peer")


def hpz_check(ds: DeepSpeedConfig, n_d: int, gpus_per_node: int | None) -> None:
    """zero_hpz_partition_size h on N_d GPUs in nodes of ``gpus_per_node``: the one check the
    measured step (zerospec/zero/hpz.py: check) and the closed form both apply, so they refuse
    the same configs with the same reason."""
    h = ds.zero_hpz_partition_size
    if h <= 1 or ds.stage != 3:
        return
    if gpus_per_node is None:
        raise ValueError(f"{ds.path!r}: zero_hpz_partition_size = {h} keeps each secondary "
                         f"partition inside a node, so it needs the GPUs per node; accepted: "
                         f"--gpus-per-node G or --machine NAME (h must divide G)")
    from types import SimpleNamespace
    from ..zero import hpz, mics
    cfg = SimpleNamespace(n_ranks=n_d, n_d=n_d, gpus_per_node=gpus_per_node, hpz=h, stage=3, n_m=1,
                          offload_params=ds.offload_param and ds.offload_param.device,
                          shard_group=ds.mics_shard_size, qgz=False)
    hpz.check(cfg)
    if ds.mics_shard_size > 0 and n_d % ds.mics_shard_size == 0:   # h | p (zero/mics.py)
        mics.check(cfg)


def zeropp_kwargs(ds: DeepSpeedConfig, gpus_per_node: int | None, left: list[str],
                   n_d: int | None = None) -> dict:
    """ZeRO++'s and MiCS's keys → measure()'s hpz, qwz, qgz, shard_group (stage 3, as DeepSpeed)."""
    kw = {} if gpus_per_node is None else {"gpus_per_node": gpus_per_node}
    h, p = ds.zero_hpz_partition_size, ds.mics_shard_size
    on = {"zero_hpz_partition_size": h > 1, "zero_quantized_weights": ds.zero_quantized_weights,
          "zero_quantized_gradients": ds.zero_quantized_gradients, "mics_shard_size": p > 0}
    if ds.stage != 3:
        left += [f"{k}: a ZeRO-3 setting (spec/zeropp.md, spec/mics.md); no effect at stage "
                 f"{ds.stage}" for k, v in on.items() if v]
        return kw
    if h > 1:
        kw["hpz"] = h
    if ds.zero_quantized_weights:
        kw["qwz"] = True
    if ds.zero_quantized_gradients:
        kw["qgz"] = True
    if p > 0:
        kw["shard_group"] = p
        left.append(MICS_NOTE)
    return kw


def zeropp_rows(ds: DeepSpeedConfig, psi: int, n_d: int, row) -> None:
    """What each ZeRO++ / MiCS key the file sets moves, in closed form (D2, D6, M1, M2)."""
    from ..paper import theory
    h, p = ds.zero_hpz_partition_size, ds.mics_shard_size
    # backward's all-gather without hpZ: over every rank, or over MiCS's partition group of p
    m = (f"{fmt_count(psi * theory.ring_factor(p))} fp16 elements (M(p−1)/p, MiCS's group)"
         if 0 < p and n_d % p == 0 else f"{fmt_count(psi * theory.ring_factor(n_d))} fp16 "
         f"elements (M(N−1)/N)")
    effect = {
        "zero_hpz_partition_size": h > 1 and
        f"hpZ: backward's all-gather inside {h} ranks of a node: 0 across nodes instead of {m} "
        f"(D2); costs 2Ψ/h = {fmt_bytes(theory.hpz_secondary_bytes(psi, h))} per GPU of "
        f"secondary shards (D6)",
        "zero_quantized_weights": ds.zero_quantized_weights and
        "qwZ: the weight all-gathers as int8 + fp32 scales: half of their fp16 bytes across "
        "nodes (D2: M → 0.5M)",
        "zero_quantized_gradients": ds.zero_quantized_gradients and
        "qgZ: the gradient reduce-scatter as an int4 all-to-all, inside the node then across: a "
        "quarter of its fp16 bytes, (n−1)/n of it leaving a node (D2: M → 0.25M, D3)",
        "mics_shard_size": p > 0 and
        (f"MiCS: shards over {p} GPUs, replicates over the N_d/p = {n_d // p} groups: model "
         f"states of N_d = p (M1), and one all-reduce of each GPU's Ψ/p gradient shard across "
         f"groups, {fmt_count(theory.mics_replica_all_reduce(psi, n_d, p))} elements per GPU (M2)"
         if n_d % p == 0 else f"MiCS: p = {p} must divide N_d = {n_d}")
        + "; DeepSpeed 0.19 refuses this key (MiCS removed; FSDP2's HSDP is the peer)"}
    for key, text in effect.items():
        if key in ds.given:
            row(key, "off" if not text else text if ds.stage == 3 else
                f"a ZeRO-3 setting: moves nothing at stage {ds.stage}")


ZEROPP_KEYS = ("zero_hpz_partition_size", "zero_quantized_weights", "zero_quantized_gradients",
               "mics_shard_size")
