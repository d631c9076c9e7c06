"""The host and NVMe tiers: ZeRO-Offload (B1–B6) over stages 2 and 3, its one-step delayed
parameter update (DPU, B8), swap files on NVMe (spec/offload.md); ZeRO-Infinity's parameter
offload, its owner baseline and prefetcher (C-I8), and memory-centric tiling (C-I3,
spec/infinity.md).

A TrainConfig asks for it with ``offload_optimizer`` ("cpu" or "nvme"), ``offload_mode``
("paper" or "deepspeed"), ``offload_params`` ("cpu" or "nvme"), ``offload_partition``,
``offload_buffer_elements``, ``offload_prefetch``, ``nvme_path`` and ``dpu``; :func:`check`
refuses a bad value (what does not combine is zerospec/training/combine.py's table).
"""
from .nvme import NvmeError, SwapDir, check_dir
from .optimizer import HostOptimizer, with_offload
from .params import PARTITIONS

TIERS = ("cpu", "nvme")
MODES = ("paper", "deepspeed")


def check(cfg) -> None:
    """A TrainConfig's offload fields: ValueError naming the value and what is accepted."""
    o = cfg.offload_optimizer
    if o is not None and o not in TIERS:
        raise ValueError(f"offload_optimizer must be one of {', '.join(TIERS)} or None, got {o!r}")
    p = cfg.offload_params
    if p is not None and p not in TIERS:
        raise ValueError(f"offload_params={p!r} (ZeRO-Infinity's parameter offload): accepted "
                         f"{', '.join(TIERS)} or None")
    if p is not None and (cfg.stage != 3 or o is None):
        raise ValueError(f"offload_params={p!r} fetches each stage-3 chunk from the host: it needs "
                         f"stage 3 and offload_optimizer 'cpu' or 'nvme', got "
                         f"stage={cfg.stage}, offload_optimizer={o!r}")
    if cfg.offload_partition not in PARTITIONS:
        raise ValueError(f"offload_partition must be one of {', '.join(PARTITIONS)}, got "
                         f"{cfg.offload_partition!r}")
    if cfg.offload_prefetch not in (False, True):
        raise ValueError(f"offload_prefetch must be True or False, got {cfg.offload_prefetch!r}")
    if cfg.offload_prefetch and (p is None or cfg.offload_partition != "bandwidth"):
        raise ValueError(f"offload_prefetch=True prefetches offloaded parameters in the bandwidth "
                         f"layout: it needs offload_params 'cpu' or 'nvme' and offload_partition "
                         f"'bandwidth', got offload_params={p!r}, offload_partition="
                         f"{cfg.offload_partition!r}")
    b = cfg.offload_buffer_elements
    if b is not None:
        if p != "nvme":
            raise ValueError(f"offload_buffer_elements={b!r} sizes the host buffer NVMe parameter "
                             f"reads land in: it needs offload_params='nvme', got {p!r}")
        held = {u.name: u.padded if cfg.offload_partition == "owner" else u.chunk
                for u in cfg.units()}
        big = max(held, key=held.get)     # the largest unit a rank reads from NVMe at once
        if not isinstance(b, int) or isinstance(b, bool) or b < held[big]:
            raise ValueError(f"offload_buffer_elements={b!r} is smaller than the largest unit a "
                             f"rank reads from NVMe ({big!r}: {held[big]} elements): accepted an "
                             f"integer >= {held[big]}")
    if cfg.offload_partition != "bandwidth" and p is None:
        raise ValueError(f"offload_partition={cfg.offload_partition!r} says where offloaded "
                         f"parameters live: it needs offload_params 'cpu' or 'nvme', got None")
    if cfg.offload_mode not in MODES:
        raise ValueError(f"offload_mode must be one of {', '.join(MODES)}, got {cfg.offload_mode!r}")
    if cfg.nvme_path is not None:
        if o != "nvme" and p != "nvme":
            raise ValueError(f"nvme_path={str(cfg.nvme_path)!r} is the NVMe tier's directory: it "
                             f"needs offload_optimizer='nvme' or offload_params='nvme', got "
                             f"offload_optimizer={o!r}, offload_params={p!r}")
        check_dir(cfg.nvme_path)
    d = cfg.dpu
    if not isinstance(d, int) or isinstance(d, bool) or d < 0:
        raise ValueError(f"dpu (warm-up steps before the delayed parameter update) must be an "
                         f"integer >= 0 (0: off), got {d!r}")
    if d > cfg.steps:
        raise ValueError(f"dpu={d} is beyond steps={cfg.steps}: the delayed parameter update "
                         f"starts after step {d}, which the run never reaches; accepted 0..{cfg.steps}")
    if d and o is None:
        raise ValueError(f"dpu={d} delays ZeRO-Offload's host update: it needs offload_optimizer "
                         f"'cpu' or 'nvme', got None")
    if o is None:
        return
    if cfg.stage not in (2, 3):
        raise ValueError(f"offload_optimizer={o!r} (ZeRO-Offload) is built on ZeRO-2: it needs "
                         f"stage 2 or 3, got stage={cfg.stage}")

def check_checkpointable(cfg, save, resume) -> None:
    """ValueError when a checkpoint is asked at or after the step a delayed update is pending
    from (DPU): the pending gradient is in no checkpoint."""
    if save and cfg.dpu and max(save) >= cfg.dpu:
        raise ValueError(f"save={sorted(save)}: a checkpoint at or after step dpu={cfg.dpu} would "
                         f"miss the gradient whose update is still pending (spec/offload.md)")


__all__ = ["TIERS", "MODES", "PARTITIONS", "check_checkpointable", "check", "HostOptimizer", "with_offload", "SwapDir", "NvmeError",
           "check_dir"]
