"""Bytes per tier and per link: where an offloaded step (ZeRO-Offload, ZeRO-Infinity; spec/offload.md)
keeps its bytes and what it moves over each link, for ``plan --explain``, ``scale --out`` and
spec/offload.md's figure.

Read from the step's ledgers — the device's, the host's, the NVMe tier's, and the one
communication ledger where every copy is booked on its link like a collective — never from the
settings: :func:`offload_bytes`. DeepSpeed's pinned swap buffers (:func:`pinned_buffers`) are
host memory the config reserves beside what the step holds; they count against the host.
"""
from __future__ import annotations

import dataclasses

# a rank's links and their directions, in the ledger's op names (comm/interconnect.py)
DIRECTIONS = (("gpus", "sent"), ("to_host", "PCIe device → host"),
              ("from_host", "PCIe host → device"), ("to_nvme", "NVMe host → NVMe"),
              ("from_nvme", "NVMe NVMe → host"))
LABELS = {"gpus": "GPU ↔ GPU collectives (sent)", "to_host": "PCIe down (device → host)",
          "from_host": "PCIe up (host → device)", "to_nvme": "NVMe write (host → NVMe)",
          "from_nvme": "NVMe read (NVMe → host)"}
# Adam's tensors DeepSpeed swaps per partition (fp32 master, momentum, variance, gradient)
ADAM_SWAPPED = 4


@dataclasses.dataclass(frozen=True)
class OffloadBytes:
    """One rank's tiers and links in a measured step: bytes held (model states after setup and
    the peak, per tier) and bytes moved per link direction (``moved[op]``, the step's)."""

    rank: int
    device_states: int
    device_peak: int
    host_states: int                 # held after the step: what stays between steps
    host_peak: int
    nvme: int
    moved: dict[str, int]
    share: int                       # M: the rank's padded share of Ψ, Ψ_p / N_d (elements)


def offload_bytes(result, rank: int = 0, step: int | None = None) -> OffloadBytes:
    """:class:`OffloadBytes` of ``rank`` in a measured step (a ScaleResult; a TrainResult with
    ``step``, the step read). Collectives count what the rank sent; each copy counts once, on its
    link, in its direction (the op names it: ``to_host`` is device → host); setup's copies (the
    NVMe tier's first write) are not the step's."""
    where = {} if step is None else {"step": step}
    if hasattr(result, "rank_class"):         # a meta step (training/scale.py)
        led = result.comm_ledger([rank])
        mem, host, nvme = result.memory(rank), result.host(rank), result.nvme(rank)
    else:                                     # threads or gloo (training/run.py)
        led = result.comm
        mem, host, nvme = result.memory[rank], result.host[rank], result.nvme[rank]
    moved = dict.fromkeys(LABELS, 0)
    for rec in led.records(rank, **where):
        if rec.phase == "setup":              # the NVMe tier's first write: once per run
            continue
        if rec.group in ("host", "nvme"):
            moved[rec.op] += rec.bytes_sent + rec.bytes_recv
        else:
            moved["gpus"] += rec.bytes_sent
    return OffloadBytes(rank, result.model_states(rank), mem.peak_total, host.total,
                        host.peak_total, nvme.total, moved,
                        result.psi_padded // result.config.n_d)


def pinned_buffers(ds, units, precision: str) -> dict[str, int]:
    """Bytes of DeepSpeed's pinned swap buffers per GPU for a config (ds_config.DeepSpeedConfig),
    by section: they exist with device nvme only. Parameters: buffer_count × buffer_size elements
    of the parameters' dtype, one buffer per swapped partition, so buffer_size below the largest
    partition is refused (DeepSpeed asserts it mid-run). The optimizer: buffer_count buffers of
    the largest fp32 partition, at least one per tensor Adam swaps. I/O alignment is left out."""
    largest = max(u.chunk for u in units)
    out = {}
    p, o = ds.offload_param, ds.offload_optimizer
    if p is not None and p.device == "nvme":
        if p.buffer_size < largest:
            name = next(u.name for u in units if u.chunk == largest)
            raise ValueError(f"{ds.path!r}: zero_optimization.offload_param.buffer_size = "
                             f"{p.buffer_size:,} elements is smaller than the largest unit's "
                             f"partition ({name}: {largest:,} elements per GPU); accepted: "
                             f">= {largest:,}")
        out["offload_param"] = p.buffer_count * p.buffer_size * (4 if precision == "fp32" else 2)
    if o is not None and o.device == "nvme":
        if o.buffer_count < ADAM_SWAPPED:
            raise ValueError(f"{ds.path!r}: zero_optimization.offload_optimizer.buffer_count = "
                             f"{o.buffer_count} is fewer than the {ADAM_SWAPPED} tensors Adam swaps "
                             f"per partition (fp32 master, momentum, variance, gradient); "
                             f"accepted: >= {ADAM_SWAPPED}")
        out["offload_optimizer"] = o.buffer_count * largest * 4
    return out


def closed_form(stage: int, psi: int, n_d: int, mode: str = "deepspeed",
                params: bool = False, precision: str = "fp16") -> dict[str, int]:
    """Bytes per GPU of an offloaded step from Ψ and N_d (ignoring padding), per tier and PCIe
    direction: B6, the host holds 12Ψ/N of fp32 states (and the gradient buffer: 2Ψ/N fp16 in the
    paper's mode, 4Ψ/N fp32 in DeepSpeed's); the device keeps the fp16 parameters (2Ψ at stage 2,
    2Ψ/N at stage 3, none with ``params``, C-I8). B5: 2Ψ/N (paper) or 4Ψ/N (DeepSpeed) down per
    step; up 2Ψ/N (stage 2 and 3's update), or with ``params`` a fetch per use instead: forward
    and backward, 2 × 2Ψ/N. In fp32 a parameter is 4 bytes where it is 2 above; what stays
    between steps, not the step's peak."""
    share, b = psi // n_d, 4 if precision == "fp32" else 2
    down = (4 if mode == "deepspeed" else b) * share
    return {"device": 0 if params else b * (psi if stage == 2 else share),
            "host": 12 * share + down + (b * share if params else 0),
            "to_host": down, "from_host": (2 if params else 1) * b * share}


def config_pinned(ds, model, stage: int, n_d: int, n_m: int = 1) -> dict[str, int]:
    """:func:`pinned_buffers` for a DeepSpeed config's step of ``model`` on N_d × N_m GPUs,
    checked before the step runs (the units come from the model, not from a run)."""
    from ..zero import STAGES
    return pinned_buffers(ds, model.units(n_d, pad=STAGES[stage].pad, n_m=n_m), ds.precision)


def offload_table(ob: OffloadBytes, title: str, pinned: dict[str, int] | None = None,
                  units: str = "GB"):
    """Per tier the bytes held, per link direction the bytes moved in the step; DeepSpeed's
    pinned swap buffers as host memory, added to the host's peak."""
    from ..render.format import Table, fmt_bytes
    g = lambda v: fmt_bytes(v, units)        # noqa: E731
    t = Table("offload_bytes", title, ["Tier or link (rank 0)", "Bytes", units, "in M"],
              fmt={2: g})
    m = lambda v: f"{v / ob.share:g}M"   # noqa: E731 — bytes per element of the share
    t.add("device: model states after setup", f"{ob.device_states:,}", ob.device_states,
          m(ob.device_states))
    t.add("device: peak", f"{ob.device_peak:,}", ob.device_peak, m(ob.device_peak))
    t.add("host: held between steps", f"{ob.host_states:,}", ob.host_states,
          m(ob.host_states))
    t.add("host: peak the step holds", f"{ob.host_peak:,}", ob.host_peak, m(ob.host_peak))
    pinned = pinned or {}
    for sec, n in pinned.items():
        t.add(f"host: DeepSpeed's pinned swap buffers ({sec})", f"{n:,}", n, m(n))
    if pinned:
        total = ob.host_peak + sum(pinned.values())
        t.add("host: peak + pinned buffers", f"{total:,}", total, m(total))
    t.add("NVMe: swap files", f"{ob.nvme:,}", ob.nvme, m(ob.nvme))
    for op, label in LABELS.items():
        t.add(f"per step: {label}", f"{ob.moved[op]:,}", ob.moved[op], m(ob.moved[op]))
    t.notes.append(f"Rank {ob.rank}, one step, from its ledgers: device, host, NVMe, and each "
                   f"copy booked on its link (spec/offload.md). M = the rank's padded share "
                   f"Ψ_p / N_d = {ob.share:,} elements; in M = bytes / M (B5: 4M of PCIe per "
                   f"step in the paper's mode, 6M in DeepSpeed's).")
    return t


def markdown(runs: dict[str, OffloadBytes]) -> str:
    """The figure's data as integers: per run, rank 0's bytes per link direction in the step."""
    rows = ["| run | " + " | ".join(f"{LABELS[op]} (B)" for op in LABELS) + " |",
            "|---" * (len(LABELS) + 1) + "|"]
    for name, ob in runs.items():
        rows.append(f"| {name} | " + " | ".join(f"{ob.moved[op]:,}" for op in LABELS) + " |")
    return "\n".join(rows)


def figure(runs: dict[str, OffloadBytes], title: str):
    """Two panels, each its own scale: the collectives' bytes sent between GPUs, and PCIe and NVMe
    per direction (grouped bars); per run rank 0's bytes in the step. Each bar's gid is "run:op".
    Returns the matplotlib figure."""
    from ..render.savefig import pyplot
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6), gridspec_kw={"width_ratios": (1, 2.2)})
    names = list(runs)
    colours = dict(zip(LABELS, ("#999999", "#c44e52", "#4c72b0", "#8172b2", "#55a868")))
    for ax, ops, label in ((axes[0], ["gpus"], "GPU ↔ GPU"),
                           (axes[1], list(LABELS)[1:], "PCIe and NVMe")):
        top = max(runs[n].moved[op] for n in names for op in ops) or 1
        scale, unit = next((10 ** e, u) for e, u in ((9, "GB"), (6, "MB"), (3, "kB"), (0, "B"))
                           if top >= 10 ** e or e == 0)
        width = 0.8 / len(ops)
        for k, op in enumerate(ops):
            for i, n in enumerate(names):
                ax.bar(i + (k - (len(ops) - 1) / 2) * width, runs[n].moved[op] / scale, width,
                       color=colours[op], label=LABELS[op] if i == 0 else None, gid=f"{n}:{op}")
        ax.set_xticks(range(len(names)), names, fontsize=7, rotation=20, ha="right")
        ax.set_ylabel(f"{unit} per step, rank 0")
        ax.set_ylim(0, top / scale * 1.12)
        ax.set_title(label, fontsize=10)
        ax.grid(axis="y", linewidth=0.3)
        ax.legend(fontsize=7, loc="upper left")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def save(runs: dict[str, OffloadBytes], out, title: str, name: str = "link_bytes"):
    """DIR/``name``.svg (and .png) of :func:`figure`; the SVG's path."""
    from ..render.savefig import save_svg
    return save_svg(figure(runs, title), out, name)


def run_label(cfg) -> str:
    """A step's stage and offload settings, short: "ZeRO-2", "ZeRO-3, Offload (DeepSpeed)"."""
    parts = [f"ZeRO-{cfg.stage}" if cfg.stage else "DP"]
    if cfg.offload_optimizer and cfg.flavour == "fsdp2":   # its own policy (zero/fsdp2_offload.py)
        return ", ".join(parts + ["CPUOffloadPolicy"])
    if cfg.offload_optimizer:
        mode = "DeepSpeed" if cfg.offload_mode == "deepspeed" else "paper"
        parts.append(f"Offload {cfg.offload_optimizer} ({mode})")
    if cfg.offload_params:
        parts.append(f"Infinity: params {cfg.offload_params}")
    return ", ".join(parts)


# spec/offload.md's figure: one model on meta GPUs, stage 2 and each offload
FIGURE_MODEL, FIGURE_GPUS = "7.5B", 16
FIGURE_RUNS = {
    "ZeRO-2": (2, {}),
    "ZeRO-2 + Offload (paper)": (2, {"offload_optimizer": "cpu"}),
    "ZeRO-2 + Offload (DeepSpeed)": (2, {"offload_optimizer": "cpu", "offload_mode": "deepspeed"}),
    "ZeRO-3 + Offload (paper)": (3, {"offload_optimizer": "cpu"}),
    "ZeRO-3 + Offload nvme (paper)": (3, {"offload_optimizer": "nvme"}),
    "Infinity: ZeRO-3 + params cpu": (3, {"offload_optimizer": "cpu", "offload_params": "cpu"}),
    "Infinity: ZeRO-3 + params nvme": (3, {"offload_optimizer": "cpu", "offload_params": "nvme"}),
}
FIGURE_TITLE = "7.5B on 16 meta GPUs: bytes rank 0 moves per step, per link and direction"


def figure_runs(step=None) -> dict[str, OffloadBytes]:
    """Rank 0's :class:`OffloadBytes` for each of FIGURE_RUNS; ``step(stage, **settings)`` gives
    the measured step (default: :func:`zerospec.training.scale.measure` of the figure's model)."""
    if step is None:
        from ..model.presets import preset
        from ..training.config import TrainConfig
        from ..training.scale import measure

        def step(stage, **kw):
            return measure(TrainConfig.of(model=preset(FIGURE_MODEL).model, stage=stage,
                                          n_d=FIGURE_GPUS, **kw))
    return {name: offload_bytes(step(s, **kw)) for name, (s, kw) in FIGURE_RUNS.items()}
