"""Figures 2, 3, 4, 6, 7 and 8 drawn from the reproduced runs (matplotlib, Agg), the paper's printed
values marked on them as dashed lines or hollow markers; title, units, legend; PNG and SVG each.

Figure 7 (``fragmentation_by_config``) replays five paper-scale meta steps' storage traces through
the allocator model; :func:`draw` is what ``zerospec paper --figure N`` calls.
"""
from __future__ import annotations

from pathlib import Path

from ..paper import evaluation as ev, theory
from . import runs as pr
from .configs import CONFIGS
from .cached_memory import figure7
from ..render.savefig import pyplot, save_figure

ZERO_COLOR, BASE_COLOR, LINK_ALPHA = "#55a868", "#4c72b0", 0.45


def _bars(ax, labels, series, ylabel, title) -> None:
    """Grouped bars: ``series`` is [(label, values, color, alpha)]."""
    w = 0.8 / len(series)
    for k, (label, values, color, alpha) in enumerate(series):
        ax.bar([i + (k - (len(series) - 1) / 2) * w for i in range(len(labels))], values, w,
               label=label, color=color, alpha=alpha)
    ax.set_xticks(range(len(labels)), labels, fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(axis="y", alpha=0.3)


def figure2(out: Path) -> list[Path]:
    plt = pyplot()
    rows = pr.figure2()
    fig, ax = plt.subplots(figsize=(9, 4))
    _bars(ax, [z.run.size for z, _ in rows], [
        ("ZeRO", [z.none.tflops_per_gpu for z, _ in rows], ZERO_COLOR, 1.0),
        ("ZeRO, one IB link", [z.link.tflops_per_gpu for z, _ in rows], ZERO_COLOR, LINK_ALPHA),
        ("Megatron-LM baseline", [b.none.tflops_per_gpu for _, b in rows], BASE_COLOR, 1.0),
        ("baseline, one IB link", [b.link.tflops_per_gpu for _, b in rows], BASE_COLOR, LINK_ALPHA)],
        "TFLOPS per GPU (model)", "Figure 2: ZeRO vs Megatron-LM, 400 V100s (DGX-2 model)")
    sizes = [z.run.size for z, _ in rows]
    ax.plot([sizes.index("100B")], [ev.TFLOPS_PER_GPU_100B], "k_", ms=18, mew=2,
            label="paper: ZeRO 100B > 38")
    ax.plot([sizes.index("40B")], [5], "kx", ms=8, label="paper: baseline 40B ≈ 5")
    ax.legend(fontsize=7, ncol=2)
    return save_figure(fig, out, "paper_figure2")


def figure3(out: Path) -> list[Path]:
    plt = pyplot()
    rows = pr.figure3()
    gpus = [x.run.gpus for x in rows]
    agg = [x.none.tflops_per_gpu * x.run.gpus / 1000 for x in rows]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(gpus, agg, "o-", color=ZERO_COLOR, label="ZeRO, 60B (model)")
    ax.plot(gpus, [agg[0] * g / gpus[0] for g in gpus], "k--", lw=1,
            label="linear from 64 GPUs")
    for x, a in zip(rows, agg):
        ax.annotate(f"{x.run.batch_per_gpu}/GPU", (x.run.gpus, a), fontsize=7,
                    textcoords="offset points", xytext=(4, -10))
    ax.set_xlabel("GPUs")
    ax.set_ylabel("aggregate PFLOPS")
    ax.set_title("Figure 3: super-linear scaling, 60B, MP 16 (DGX-2 model)", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return save_figure(fig, out, "paper_figure3")


def figure4(out: Path) -> list[Path]:
    plt = pyplot()
    rows = pr.figure4_rows()
    fig, ax = plt.subplots(figsize=(9, 4))
    _bars(ax, [x.run.size for x in rows], [
        ("TFLOPS/GPU", [x.none.tflops_per_gpu for x in rows], ZERO_COLOR, 1.0),
        ("one IB link", [x.link.tflops_per_gpu for x in rows], ZERO_COLOR, LINK_ALPHA)],
        "TFLOPS per GPU (model)", "Figure 4: data parallelism alone, 128 GPUs "
        "(last two: the DDP baseline)")
    for i, x in enumerate(rows):
        if x.how == "baseline":
            ax.patches[i].set_color(BASE_COLOR)                # both series' bars
            ax.patches[len(rows) + i].set_color(BASE_COLOR)
    ax.axhline(40, color="black", ls="--", lw=1, label="paper: ZeRO over 40 on average")
    ax.axhline(20, color="gray", ls=":", lw=1, label="paper: baseline under 20")
    ax.legend(fontsize=7, loc="lower left")
    return save_figure(fig, out, "paper_figure4")


def figure6(out: Path) -> list[Path]:
    plt = pyplot()
    got = pr.figure6()
    names = list(CONFIGS)
    fig, ax = plt.subplots(figsize=(6, 4))
    _bars(ax, names, [("measured (memory fit, 32 GB)", [pr.figure6_psi(got[n][0]) / 1e9 for n in names],
                       ZERO_COLOR, 1.0),
                      ("paper", [float(ev.params(ev.MAX_SIZE_BY_CONFIG[n]) / ev.B) for n in names], "#8c8c8c", 1.0)],
          "model size (B parameters)", "Figure 6: largest model per configuration, 400 GPUs, MP 16")
    ax.legend(fontsize=8)
    return save_figure(fig, out, "paper_figure6")


def figure8(out: Path) -> list[Path]:
    plt = pyplot()
    got = pr.figure8()
    names = list(got)
    fig, ax = plt.subplots(figsize=(6, 4))
    _bars(ax, [f"{n}\n{got[n].run.batch_per_gpu}/GPU" + ("" if got[n].fits else "\n> 32 GB")
               for n in names], [
        ("no overlap", [got[n].none.tflops_per_gpu for n in names], ZERO_COLOR, 1.0),
        ("backward overlap", [got[n].overlap.tflops_per_gpu for n in names], ZERO_COLOR, LINK_ALPHA)],
        "TFLOPS per GPU (model)", "Figure 8: 60B on 128 GPUs, MP 16, per configuration")
    ax.legend(fontsize=8)
    return save_figure(fig, out, "paper_figure8")


def fragmentation_by_config(out, size: str = "100B") -> list[Path]:
    """Reserved vs allocated over one step of Figure 7's ``size`` run (400 GPUs, MP 16, its
    appendix batch) per configuration C1–C5, rank 0's storage trace replayed through the
    allocator model without a limit: the reserved peak is Figure 7's "max cached memory" (C48)."""
    plt = pyplot()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    runs = figure7(size)
    # y axes of their own: C1 and C3 reach 100 GB at 100B, and C4/C5's cache would be a sliver
    fig, axes = plt.subplots(1, len(runs), figsize=(3.2 * len(runs), 4))
    for ax, (name, mem) in zip(axes, runs.items()):
        allocated, reserved = ([x[k] / theory.GB for x in mem.samples] for k in (0, 1))
        xs = range(len(reserved))
        # tens of thousands of samples: drawn as pixels in the SVG too (vector, they made it MBs)
        ax.fill_between(xs, allocated, reserved, color="#dd8452", alpha=0.5, step="post",
                        label="reserved − allocated (cached, free)", rasterized=True)
        ax.step(xs, allocated, where="post", color="#4c72b0", lw=1, label="allocated",
                rasterized=True)
        ax.axhline(theory.V100_BYTES / theory.GB, color="black", ls="--", lw=1, label="32 GB")
        c = CONFIGS[name]
        ax.set_title(f"{name}: {'P_os' if c.stage == 1 else 'P_os+g'} + {c.zero_r}\n"
                     f"max cached {mem.reserved / theory.GB:.1f} GB", fontsize=8)
        ax.set_xlabel("allocations and frees", fontsize=8)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("GB on one GPU (rank 0)")
    axes[0].legend(fontsize=7, loc="upper left")
    fig.suptitle(f"Cached vs allocated memory per configuration (C48, Figure 7): {size}, 400 GPUs, "
                 f"MP 16, the allocator model without a limit", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    return save_figure(fig, out, f"fragmentation_by_config_{size}")


DRAW = {2: figure2, 3: figure3, 4: figure4, 6: figure6, 7: fragmentation_by_config, 8: figure8}


def draw(n: int, out) -> list[Path]:
    """Figure ``n`` as PNG and SVG in ``out``; the data are the cached runs its tables used."""
    return DRAW[n](Path(out))
