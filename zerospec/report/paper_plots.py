"""Figures 2, 3, 4, 6 and 8 drawn from the reproduced runs (matplotlib, Agg), the paper's printed
values marked on them as dashed lines or hollow markers. Style as zerospec/report/figures.py:
title, units, legend; PNG and SVG each.
"""
from __future__ import annotations

from pathlib import Path

from ..paper import evaluation as ev
from . import paper_runs as pr
from .configs import CONFIGS
from .figures import pyplot, save_figure

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
    from .paper_figures import PAPER_SIZE
    plt = pyplot()
    got = pr.figure6()
    names = list(CONFIGS)
    fig, ax = plt.subplots(figsize=(6, 4))
    _bars(ax, names, [("measured (memory fit, 32 GB)", [pr.figure6_psi(got[n][0]) / 1e9 for n in names],
                       ZERO_COLOR, 1.0),
                      ("paper", [float(PAPER_SIZE[n][:-1]) for n in names], "#8c8c8c", 1.0)],
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
