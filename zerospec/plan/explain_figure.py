"""``plan --explain --out DIR``: the explained rank's memory over the step, one SVG.

:func:`memory_over_step` replays the ledger trace (the same events :func:`~zerospec.plan.explain.
phase_peaks` reads) into the bytes each category holds after every event; :func:`save` stacks them,
marks the phases and draws the GPU's capacity. Deterministic: the same step draws the same bytes.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from ..runtime.memory import CATEGORIES, TraceEvent

NAME = "explain_memory"


@dataclasses.dataclass(frozen=True)
class Curve:
    """Bytes per category after each alloc/free event (x = the event's index), and the phases:
    (name, first index, last index)."""

    held: dict[str, list[int]]
    phases: list[tuple[str, int, int]]

    @property
    def totals(self) -> list[int]:
        return [sum(col) for col in zip(*self.held.values())]


def memory_over_step(trace: list[TraceEvent]) -> Curve:
    current = dict.fromkeys(CATEGORIES, 0)
    held = {c: [] for c in CATEGORIES}
    phases, start = [], 0
    for e in trace:
        if e.op == "phase":        # the marker closes the phase it names
            n = len(held[CATEGORIES[0]])   # a phase without events sits at the last event
            first = min(start, max(n - 1, 0))
            phases.append((e.label.partition("@")[0], first, max(n - 1, first)))
            start = n
            continue
        current[e.category] += e.nbytes if e.op == "alloc" else -e.nbytes
        for c in CATEGORIES:
            held[c].append(current[c])
    return Curve({c: v for c, v in held.items() if any(v)}, phases)


def turning_points(curve: Curve) -> list[int]:
    """The event indices a drawing needs: the ends, each phase's bounds and every local maximum
    or minimum of the total (so the drawn peak is the step's peak); between them the total is
    monotone and the stack changes steadily. Keeps an SVG of a 100-layer step small."""
    tot = curve.totals
    keep = {0, len(tot) - 1} | {i for _, a, b in curve.phases for i in (a, b)}
    for i in range(1, len(tot) - 1):
        if (tot[i] - tot[i - 1]) * (tot[i + 1] - tot[i]) <= 0 and tot[i] != tot[i - 1]:
            keep.add(i)
    return sorted(i for i in keep if 0 <= i < len(tot))


def save(ex, out: str | Path) -> Path:
    """DIR/explain_memory.svg (and .png) of ``ex`` (an Explanation); the SVG's path."""
    from ..render.savefig import pyplot, save_svg
    from .explain import LABELS, _setting
    cls = max(ex.result.classes, key=lambda c: c.memory.peak_total)
    curve = memory_over_step(cls.memory.trace)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 4.5))
    xs = turning_points(curve)
    gb = 1e9
    ax.stackplot(xs, *[[v[i] / gb for i in xs] for v in curve.held.values()],
                 labels=[LABELS[c] for c in curve.held], linewidth=0)
    ax.axhline(ex.capacity / gb, color="black", linestyle="--", linewidth=1)
    last = max(len(curve.totals) - 1, 1)
    ax.text(last / 2, ex.capacity / gb, f"GPU memory ({ex.where}): {ex.capacity / gb:.0f} GB",
            ha="center", va="bottom", fontsize=8)
    top = max(ex.capacity, ex.peak) / gb * 1.15
    groups: list[tuple[int, list[str]]] = []      # phases a few events long share one label
    for name, a, _ in curve.phases:
        ax.axvline(a, color="grey", linewidth=0.5)
        if groups and a - groups[-1][0] < 0.02 * last:
            groups[-1][1].append(name)
        else:
            groups.append((a, [name]))
    for a, names in groups:
        end = a > 0.9 * last          # vertical, beside its line: short phases stay legible
        ax.text(a, top * 0.98, " " + ", ".join(names) + " ", ha="right" if end else "left",
                va="top", fontsize=8, rotation=90)
    ax.set_ylim(0, top)
    ax.set_xlim(0, last)
    ax.set_xlabel("ledger events of the step, in order")
    ax.set_ylabel("bytes held (GB = 10⁹ B)")
    ax.set_title(f"Memory over one step, rank {ex.rank}: {_setting(ex)}", fontsize=9)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8, frameon=False)
    return save_svg(fig, out, NAME)
