"""``zerospec plan --deepspeed-config DS.JSON --preset NAME``: what a DeepSpeed config will hold and
move, measured by the stage code on meta tensors before anyone launches it.

The config's ZeRO settings map onto zerospec's own switches, and one meta step
(:func:`zerospec.training.scale.measure`) books memory per GPU and traffic per step in the same
ledgers every test reads:

* ``stage`` → the ZeRO stage; ``reduce_bucket_size`` → C_B buckets (``bucket_elements``) for
  stages 1–3's gradient reductions;
* stage 1 with ``use_multi_rank_bucket_allreduce`` (DeepSpeed's default) → ZeRO-1's all-reduce
  variant (3Ψ); stage 2's all-reduce variant is not modelled: its reduce-scatter path is measured
  and the row says so;
* stage 3: ``stage3_param_persistence_threshold`` and ``stage3_max_reuse_distance`` →
  zerospec/zero/ds3.py (per unit, where DeepSpeed decides per tensor: a block's biases and
  LayerNorms, which DeepSpeed also keeps whole, are under 1% of Ψ at GPT sizes);
  ``stage3_prefetch_bucket_size`` changes when, not what: not modelled.
"""
from __future__ import annotations

from fractions import Fraction

from ..model.presets import preset
from ..render.format import Table, fmt_bytes, fmt_count, fmt_psi
from ..training.scale import measure


def config_kwargs(ds: dict) -> tuple[dict, list[str]]:
    """scale.measure's keyword arguments for a parsed DeepSpeed config, and what is not modelled."""
    s, kw, left = ds["stage"], {}, []
    if s >= 1 and ds["reduce_bucket_size"]:
        kw["bucket_elements"] = ds["reduce_bucket_size"]
    if s == 1 and ds["use_multi_rank_bucket_allreduce"]:
        kw["zero1_comm"] = "all_reduce"
    if s == 2 and ds["use_multi_rank_bucket_allreduce"]:
        left.append("use_multi_rank_bucket_allreduce at stage 2 (all-reduced buckets, 3Ψ): the "
                    "reduce-scatter path is measured; the closed form above gives its volume")
    if s == 3:
        kw["stage3_persistence_threshold"] = ds["stage3_param_persistence_threshold"]
        kw["stage3_max_reuse_distance"] = ds["stage3_max_reuse_distance"]
        left.append("persistence per tensor: measured per unit (a layer); DeepSpeed also keeps "
                    "each block's biases and LayerNorms whole")
        left.append("stage3_prefetch_bucket_size: when parameters arrive, not how many")
    return kw, left


def deepspeed_measured_table(ds: dict, name: str, n_d: int) -> Table:
    """One meta step of preset ``name`` on ``n_d`` GPUs under the config's settings."""
    model = preset(name).model
    kw, left = config_kwargs(ds)
    r = measure(model, ds["stage"], n_d, **kw)
    led = r.comm_ledger([0])
    elements = led.elements(0)
    t = Table("deepspeed_measured", f"DeepSpeed ZeRO-{ds['stage']} config on {name} "
              f"(Ψ = {fmt_count(r.psi)}), N_d = {n_d}: one step measured on meta tensors",
              ["Quantity (rank 0)", "Measured"])
    t.add("model states per GPU", fmt_bytes(r.model_states(0)))
    t.add("peak per GPU (1 sequence)", fmt_bytes(r.memory(0).peak_total))
    t.add("gathered parameters at the peak", fmt_bytes(r.memory(0).peak["gathered"]))
    t.add("elements sent per step", f"{elements:,} = {fmt_psi(Fraction(elements, r.psi))}")
    t.add("collectives per step", str(led.count(0)))
    for phase, n in sorted(led.by_phase(0).items()):
        t.add(f"  of which in {phase}", f"{n:,} elements")
    t.notes.append("Settings mapped: " + (", ".join(f"{k}={v:,}" if isinstance(v, int) else f"{k}={v}"
                                                     for k, v in kw.items()) or "none")
                   + ". Not modelled: " + ("; ".join(left) if left else "nothing") + ".")
    return t
