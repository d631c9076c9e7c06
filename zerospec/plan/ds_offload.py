"""DeepSpeed's offload sections for ``plan --deepspeed-config`` (read by zerospec/plan/ds_config.py):
what they pass to the meta step (:func:`offload_kwargs`) and what they imply in closed form
(:func:`offload_rows`); the measured bytes per tier and link are zerospec/plan/offload.py's."""
from __future__ import annotations

from ..render.format import fmt_bytes
from .ds_config import DeepSpeedConfig


def offload_kwargs(ds: DeepSpeedConfig, kw: dict, left: list[str]) -> dict:
    """offload_optimizer / offload_param → measure()'s offload_optimizer (DeepSpeed's mode: its
    fp32 gradients cross PCIe) and offload_params; a section without the stage it needs is
    refused; the other settings pass as they are (ZeRO-Offload and ZeRO-Infinity combine with
    them: spec/combine.md), the stage-3 knobs with offload_param too (a persistent unit stays on
    the device, as DeepSpeed keeps it: zerospec/offload/params.py)."""
    o, p = ds.offload_optimizer, ds.offload_param
    if p is not None and ds.stage != 3:
        raise ValueError(f"{ds.path!r}: zero_optimization.offload_param (device {p.device}) "
                         f"offloads ZeRO-3's parameter partitions: it needs stage 3, got stage "
                         f"{ds.stage}")
    if o is None:
        if p is not None:
            raise ValueError(f"{ds.path!r}: zero_optimization.offload_param without "
                             f"offload_optimizer: zerospec offloads parameters with the optimizer "
                             f"only; accepted: offload_optimizer.device cpu or nvme too")
        return {}
    if ds.stage not in (2, 3):
        raise ValueError(f"{ds.path!r}: zero_optimization.offload_optimizer (device {o.device}) "
                         f"is built on ZeRO-2 and ZeRO-3 here; accepted: stage 2 or 3, got stage "
                         f"{ds.stage}")
    out = {"offload_optimizer": o.device, "offload_mode": "deepspeed"}
    if p is not None:
        out["offload_params"] = p.device
    return out


def offload_rows(ds: DeepSpeedConfig, psi: int, n_d: int, t) -> None:
    """What the offload sections move, in closed form (zerospec/plan/offload.py, B5, B6, C-I8)."""
    o, p = ds.offload_optimizer, ds.offload_param
    if o is None or ds.stage not in (2, 3) or (p is not None and ds.stage != 3):
        if o is not None or p is not None:
            t.add("offload", "—", f"none at stage {ds.stage}: ZeRO-Offload partitions what it "
                                  f"offloads as stage 2 or 3 does, offload_param as stage 3 "
                                  f"(measuring it is refused)")
        return
    from .offload import closed_form
    from ..paper import theory
    c = closed_form(ds.stage, psi, n_d, "deepspeed", p is not None, ds.precision)
    # without offload, this stage's own model states (ZeRO-2 keeps its fp16 parameters whole)
    plain = theory.model_state_bytes(ds.stage, psi, n_d, *((8, 4) if ds.precision == "fp32" else ()))
    t.add("offload_optimizer", o.device,
          f"ZeRO-Offload (DeepSpeed's mode): fp32 states and Adam on the host, {fmt_bytes(c['host'])} "
          f"per GPU between steps with its fp32 gradient buffer" + (" (in NVMe files between steps)"
                                                      if o.device == "nvme" else "")
          + f"; model states on the GPU {fmt_bytes(c['device'])} instead of "
            f"{fmt_bytes(plain)} (ZeRO-{ds.stage} without offload); PCIe per step {fmt_bytes(c['to_host'])} down (fp32 "
            f"gradients), {fmt_bytes(c['from_host'])} up (B5, B6)")
    if p is not None:
        t.add("offload_param", p.device, "ZeRO-Infinity: fp16 parameter partitions on the "
              + ("host" if p.device == "cpu" else "NVMe") + ", fetched over PCIe for each use, "
              "then all-gathered (C-I8): no model state on the GPU between steps")
    if "nvme" in (o.device, p.device if p else None):
        t.add("pinned swap buffers", "—", "buffer_count × the largest partition (optimizer) or "
              "× buffer_size (parameters), host memory: measured with --preset")
    t.notes.append("The estimators below count no offload; the offload rows above and the "
                   "measured step (--preset) do.")
