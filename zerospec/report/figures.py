"""The report's figures (matplotlib, Agg backend), each readable on its own: title, units, legend.

* ``memory_per_stage``: stacked per-GPU model states by buffer, activations hatched on top.
* ``comm_per_stage``: elements per GPU per step, split by collective, with the paper's value.
* ``memory_vs_n``: measured model states against N on log axes, with the C6–C9 formulas as lines.
* ``timeline``: one step replayed on N parallel clocks, compute by phase and collectives by op.
* ``fragmentation``: reserved vs allocated over one step of C30's case, without and with M_D.

Every figure is written as PNG and SVG into the output directory.
"""
from __future__ import annotations

from pathlib import Path

from ..paper import theory
from ..render.savefig import pyplot, save_figure
from .measure import Measurements
from .writeup import OPS, mean_by_op
from ..runtime.memory import MODEL_STATES

MB = 1e6
BUFFER_LABELS = {"param16": "fp16 parameters", "grad16": "fp16 gradients", "master32": "fp32 master",
                 "exp_avg": "fp32 momentum", "exp_avg_sq": "fp32 variance"}
BUFFER_COLORS = {"param16": "#4c72b0", "grad16": "#55a868", "master32": "#c44e52",
                 "exp_avg": "#dd8452", "exp_avg_sq": "#937860"}
OP_COLORS = {"all_reduce": "#8172b3", "reduce_scatter": "#da8bc3", "all_gather": "#64b5cd",
             "broadcast": "#ccb974", "barrier": "#8c8c8c"}
PHASE_COLORS = {"forward": "#a1c9f4", "backward": "#8de5a1", "grad_sync": "#ffb482",
                "step": "#ff9f9b", "param_sync": "#d0bbff", "setup": "#e0e0e0"}
PHASE_LABELS = {"setup": "between phases"}   # the step's bookkeeping outside the five phases
STAGE_COLORS = {0: "#4c72b0", 1: "#dd8452", 2: "#55a868", 3: "#c44e52"}


def _short(label: str) -> str:
    return label.replace(" (", "\n(")


def _paper_mark(ax, x: int, value: float, label: str) -> None:
    """The paper's value for bar ``x``: a dashed line across it, in the legend once."""
    ax.plot([x - 0.35, x + 0.35], [value, value], color="black", lw=1.5, ls="--",
            label=label if x == 0 else None)


def _label_stages(ax, m: Measurements, ylabel: str, title: str, legend_loc: str) -> None:
    """One bar per run, named by its stage label; the y axis, title, legend and grid."""
    ax.set_xticks(range(len(m.runs)), [_short(r.label) for r in m.runs], fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8, loc=legend_loc)
    ax.grid(axis="y", alpha=0.3)


def memory_per_stage(m: Measurements, out: Path) -> list[Path]:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 5))
    xs = range(len(m.runs))
    for x, run in zip(xs, m.runs):
        setup = run.result.memory[0].snapshots_by_label()["setup@0"][0].current
        bottom = 0.0
        for cat in MODEL_STATES:
            if cat not in BUFFER_COLORS:   # the FSDP2 flavour's states: not a stage the report runs
                continue
            h = setup[cat] / MB
            # no edge lines: at large N a partitioned buffer is thinner than an edge would be
            ax.bar(x, h, bottom=bottom, color=BUFFER_COLORS[cat], linewidth=0, width=0.6,
                   label=BUFFER_LABELS[cat] if x == 0 else None)
            bottom += h
        acts = max(mem.peak["activations"] for mem in run.result.memory) / MB
        ax.bar(x, acts, bottom=bottom, color="none", edgecolor="#555555", hatch="///", width=0.6,
               label="activations (peak)" if x == 0 else None)
        paper = float(theory.model_state_bytes(run.stage, run.result.psi, m.config.ranks)) / MB
        _paper_mark(ax, x, paper, "paper formula (C6–C9)")
    _label_stages(ax, m, "memory per GPU (MB, 10^6 bytes)",
                  f"Per-GPU memory at N = {m.config.ranks}: model states by buffer (measured), "
                  f"activations hatched", "upper right")
    return save_figure(fig, out, "memory_per_stage")


def comm_per_stage(m: Measurements, out: Path) -> list[Path]:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 5))
    step = m.config.steps
    for x, run in enumerate(m.runs):
        res = run.result
        ops = mean_by_op(run, step)
        bottom = 0.0
        for op in OPS:
            h = float(ops[op] / res.psi)
            ax.bar(x, h, bottom=bottom, color=OP_COLORS[op], width=0.6, edgecolor="white",
                   label=op.replace("_", "-") if x == 0 else None)
            bottom += h
        paper = float(theory.comm_elements(run.stage, res.psi, res.config.n_d, res.config.zero1_comm)
                      / res.psi)
        _paper_mark(ax, x, paper, "paper, ring model (C21–C24)")
        ax.annotate(f"{res.comm.count(0, step=step)} collectives", (x, bottom), ha="center",
                    va="bottom", fontsize=8, xytext=(0, 3), textcoords="offset points")
    ax.set_ylim(0, 3.6)
    _label_stages(ax, m, "elements sent per GPU per step (units of Ψ)",
                  f"Communication per step per GPU at N = {m.config.ranks}, split by collective (measured)",
                  "upper left")
    return save_figure(fig, out, "comm_per_stage")


def memory_vs_n(m: Measurements, out: Path) -> list[Path]:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    psi = m.runs[0].result.psi
    for s, points in sorted(m.sweep.items()):
        ns = sorted(points)
        # Integer N between the measured points (theory takes N_d as an integer): smooth on log axes.
        dense = sorted({round(2 ** (k / 8)) for k in range(8 * (max(ns).bit_length() - 1) + 1)})
        ax.plot(dense, [float(theory.model_state_bytes(s, psi, n)) / MB for n in dense],
                color=STAGE_COLORS[s], lw=1.2, label=f"{theory.stage(s).label} formula")
        ax.plot(ns, [points[n] / MB for n in ns], "o", color=STAGE_COLORS[s], ms=5,
                label=f"{theory.stage(s).label} measured")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.axvline(m.config.ranks, color="grey", ls=":", lw=1)
    # x in data units, y in axes fraction: the label sits at the bottom whatever the y range
    ax.text(m.config.ranks, 0.03, f" report run, N = {m.config.ranks}", rotation=90, va="bottom",
            ha="right", fontsize=8, color="grey", transform=ax.get_xaxis_transform())
    ax.set_xlabel("N (data-parallel GPUs)")
    ax.set_ylabel("model states per GPU (MB, 10^6 bytes)")
    ax.set_title(f"Model states per GPU vs N (Ψ = {psi:,}): measured set-up vs C6–C9")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3, which="both")
    return save_figure(fig, out, "memory_vs_n")


def timeline(m: Measurements, out: Path) -> list[Path]:
    plt = pyplot()
    from matplotlib.collections import PolyCollection
    from matplotlib.patches import Patch
    runs = m.runs
    n = m.config.ranks
    fig, axes = plt.subplots(len(runs), 1, figsize=(11, 1.2 + 1.6 * len(runs)), sharex=True,
                             squeeze=False)
    phases_seen, ops_seen = set(), set()
    for ax, run in zip(axes[:, 0], runs):
        bars: dict[str, list] = {}
        for seg in run.replay.segments:
            if seg.kind == "wait" or seg.seconds <= 0:
                continue
            key = f"compute:{seg.phase}" if seg.kind == "compute" else f"op:{seg.kind}"
            x0, x1 = seg.start * 1e3, (seg.start + seg.seconds) * 1e3
            y0, y1 = seg.rank - 0.4, seg.rank + 0.4
            bars.setdefault(key, []).append(((x0, y0), (x0, y1), (x1, y1), (x1, y0)))
        # one collection per kind of bar, every rank's bars in it: a collection per rank and kind
        # (a thousand artists at N = 32) took 8 of the report's 40 s to lay out and save
        for key, rects in bars.items():
            kind, name = key.split(":")
            color = PHASE_COLORS.get(name, "#cccccc") if kind == "compute" else OP_COLORS.get(name, "k")
            (phases_seen if kind == "compute" else ops_seen).add(name)
            ax.add_collection(PolyCollection(rects, facecolors=color, edgecolors="none"))
        ax.autoscale_view()
        ax.set_ylim(n - 0.5, -0.5)
        ax.set_ylabel("rank")
        ax.set_title(f"{run.label}: step {run.replay.step} = {run.replay.seconds * 1e3:.1f} ms on "
                     f"{n} parallel clocks, {run.replay.n_collectives} collectives", fontsize=9)
    axes[-1, 0].set_xlabel("time within the step (ms), replayed from measured events")
    handles = ([Patch(color=PHASE_COLORS[p], label=f"compute: {PHASE_LABELS.get(p, p)}")
                for p in PHASE_COLORS if p in phases_seen]
               + [Patch(color=OP_COLORS[o], label=f"collective: {o.replace('_', '-')}")
                  for o in OP_COLORS if o in ops_seen])
    fig.legend(handles=handles, loc="upper center", ncol=4, fontsize=8, bbox_to_anchor=(0.5, 1.0))
    fig.suptitle("One training step per stage: compute (by phase) vs collectives (by op), per rank; "
                 "gaps are waits", y=1.03, fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    return save_figure(fig, out, "timeline")


def fragmentation(m: Measurements, out: Path) -> list[Path]:
    """Reserved vs allocated over one step of C30's case (GPT-2 1.5B, P_os+g+p, N_d = 400, a
    checkpoint every 2 blocks, C30_BATCH sequences per GPU) on a 32 GB GPU, without and with M_D: the
    caching allocator model replaying the step's storage trace (spec/allocator.md): the traces
    ``m`` holds (``measure(..., c30=True)``), else one meta step each here."""
    from ..runtime.trace import replay
    from ..evaluation.cached_memory import C30_BATCH, c30_trace
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharex=True, sharey=True)
    for ax, md in zip(axes, (False, True)):
        trace = m.c30[md] if md in m.c30 else c30_trace(C30_BATCH, md)
        r = replay(trace, theory.V100_BYTES, samples=True)
        allocated, reserved = ([x[k] / theory.GB for x in r.samples] for k in (0, 1))
        # thousands of samples: drawn as pixels in the SVG too (as vectors they made it over 1 MB)
        ax.fill_between(range(len(reserved)), allocated, reserved, color="#dd8452", alpha=0.5,
                        step="post", label="reserved − allocated (cached, free)", rasterized=True)
        ax.step(range(len(allocated)), allocated, where="post", color="#4c72b0", lw=1,
                label="allocated", rasterized=True)
        ax.axhline(theory.V100_BYTES / theory.GB, color="black", ls="--", lw=1, label="32 GB")
        n = 0
        for ev in trace[:r.oom.event if r.oom else len(trace)]:
            n += ev.op != "phase"
            if ev.op == "phase" and ev.label.split("@")[0] in ("forward", "backward"):
                ax.axvline(n, color="#8c8c8c", lw=0.8, ls=":")
                ax.text(n, 1, f"end of {ev.label.split('@')[0]}", rotation=90, fontsize=7,
                        va="bottom", ha="right")
        if r.oom:
            ax.plot([len(allocated)], [allocated[-1]], "rx", ms=10,
                    label=f"out of memory: {r.oom.free / theory.GB:.1f} GB "
                          f"({r.oom.free_fraction:.0%}) free")
        ax.set_title(f"{'with' if md else 'without'} M_D", fontsize=10)
        ax.set_xlabel("allocations and frees, in program order")
        ax.legend(fontsize=7, loc="upper left")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("GB on one GPU")
    fig.suptitle("Fragmentation (C30) and M_D (C37): GPT-2 1.5B, P_os+g+p, N_d = 400, "
                 f"k = 2, {C30_BATCH} sequences per GPU", fontsize=10)
    return save_figure(fig, out, "fragmentation")


FIGURES = {"memory_per_stage": memory_per_stage, "comm_per_stage": comm_per_stage,
           "memory_vs_n": memory_vs_n, "timeline": timeline, "fragmentation": fragmentation}


def write_figures(m: Measurements, out_dir) -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    for fn in FIGURES.values():
        paths += fn(m, out)
    return paths
