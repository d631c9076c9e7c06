"""Draw spec/'s figures as deterministic SVG under spec/figures/, each from data its snapshots pin.

Every figure names the snapshot files its data are (``FIGURES``). Before it is drawn, the data it
is about to draw are rendered as those snapshots render them and compared with the files: a figure
is drawn only from data equal to the current snapshots, and its SVG records each file's sha256 in
its metadata (``Description``). ``tests/claims/test_tables_spec.py`` recomputes the hashes, so a
committed figure drawn from other data than the current snapshots fails the default run.

Usage: ``python tools/specfigures.py`` redraws the figures whose snapshots changed (``--all``:
every figure; names: those); ``--check`` lists the stale ones (exit 1). ``python tools/specsync.py
--refresh`` (``tox -e spec``) runs it after updating the snapshots.

Not here: ``zerospec report``'s timeline, one step replayed from measured wall time — different
on every machine and every run, where snapshots hold what is the same on every machine
(spec/determinism.md); it stays in the report's output.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import pathlib
import re
import shutil
import sys
import tempfile
from typing import Callable

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "spec" / "figures"
SNAP = "tests/claims/__snapshots__"
DESCRIPTION = re.compile(r"<dc:description>(.*?)</dc:description>", re.S)


@dataclasses.dataclass(frozen=True)
class Figure:
    """spec/figures/``name``.svg, embedded by ``page``; its data are the ``snapshots`` (repository
    paths). ``pinned()`` renders, from the data ``draw(out)`` will draw, each snapshot's text."""

    name: str
    page: str
    snapshots: tuple[str, ...]
    pinned: Callable[[], dict[str, str]]
    draw: Callable[[pathlib.Path], list[pathlib.Path]]

    @property
    def path(self) -> pathlib.Path:
        return OUT / f"{self.name}.svg"


# -- the data each figure draws, rendered as its snapshot pins them ----------------------------------------
def sha(samples) -> str:
    """A digest of a figure's curve (its (allocated, reserved) samples): 16 hex digits of sha256."""
    return hashlib.sha256(repr([tuple(s) for s in samples]).encode()).hexdigest()[:16]


@functools.lru_cache(maxsize=None)
def report():
    """``zerospec report``'s measurement at its defaults (N = 32, every stage variant, 3 steps)."""
    from zerospec.report.measure import ReportConfig, measure
    return measure(ReportConfig(), quiet=True)


def _exact(x) -> str:
    """An exact count as the tables print it: an integer with thousands separators, a Fraction
    that is not one as p/q."""
    from fractions import Fraction
    x = Fraction(x)
    return f"{x.numerator:,}" if x.denominator == 1 else str(x)


def report_figures_data(m) -> str:
    """What memory_per_stage, comm_per_stage and memory_vs_n draw from a report measurement: set-up
    bytes per buffer and the activation peak, elements per collective (mean over ranks, last step),
    and model states per GPU over N. Integers (and exact means), the same on every machine."""
    from zerospec.paper import theory
    from zerospec.report.writeup import OPS, mean_by_op
    from zerospec.report.figures import BUFFER_COLORS
    from zerospec.runtime.memory import MODEL_STATES
    # the buffers the figure draws: the paper's stages' (the FSDP2 flavour's are not a stage the
    # report runs)
    MODEL_STATES = tuple(c for c in MODEL_STATES if c in BUFFER_COLORS)
    n, step = m.config.ranks, m.config.steps
    lines = [f"memory_per_stage: bytes per GPU at set-up (rank 0), N = {n}; activations: the "
             "highest rank's peak", "",
             "| stage | " + " | ".join(MODEL_STATES) + " | activations peak | paper formula |",
             "|---|" + "---|" * (len(MODEL_STATES) + 2)]
    for run in m.runs:
        setup = run.result.memory[0].snapshots_by_label()["setup@0"][0].current
        acts = max(mem.peak["activations"] for mem in run.result.memory)
        paper = theory.model_state_bytes(run.stage, run.result.psi, n)
        lines.append(f"| {run.label} | " + " | ".join(f"{setup[c]:,}" for c in MODEL_STATES)
                     + f" | {acts:,} | {_exact(paper)} |")
    lines += ["", f"comm_per_stage: elements per GPU at step {step} (mean over ranks) by collective",
              "", "| stage | " + " | ".join(OPS) + " | collectives (rank 0) | paper |",
              "|---|" + "---|" * (len(OPS) + 2)]
    for run in m.runs:
        res, ops = run.result, mean_by_op(run, step)
        paper = theory.comm_elements(run.stage, res.psi, res.config.n_d, res.config.zero1_comm)
        lines.append(f"| {run.label} | " + " | ".join(_exact(ops[op]) for op in OPS)
                     + f" | {res.comm.count(0, step=step)} | {_exact(paper)} |")
    stages = sorted(m.sweep)
    lines += ["", f"memory_vs_n: model states per GPU at set-up (the highest rank), Ψ = "
              f"{m.runs[0].result.psi:,}", "",
              "| N | " + " | ".join(theory.stage(s).label for s in stages) + " |",
              "|---|" + "---|" * len(stages)]
    for k in sorted(m.sweep[stages[0]]):
        lines.append(f"| {k} | " + " | ".join(f"{m.sweep[s][k]:,}" for s in stages) + " |")
    return "\n".join(lines)


def c30_figure_data() -> str:
    """What the fragmentation figure draws: C30's step (GPT-2 1.5B, P_os+g+p, N_d = 400, k = 2,
    C30_BATCH sequences) replayed on 32 GB without and with M_D, sample by sample until it runs
    out."""
    from zerospec.evaluation.cached_memory import C30_BATCH, c30_trace
    from zerospec.paper import theory
    from zerospec.runtime.trace import replay
    rows = ["| M_D | samples | allocated peak (B) | reserved peak (B) | out of memory: free (B) "
            "| samples sha256 |", "|---|---|---|---|---|---|"]
    for md in (False, True):
        r = replay(c30_trace(C30_BATCH, md), theory.V100_BYTES, samples=True)
        oom = f"{r.oom.free:,}" if r.oom else "runs"
        rows.append(f"| {'with' if md else 'without'} | {len(r.samples):,} "
                    f"| {max(a for a, _ in r.samples):,} | {max(b for _, b in r.samples):,} "
                    f"| {oom} | {sha(r.samples)} |")
    return "\n".join(rows)


def figure7_curves_data(size: str = "100B") -> str:
    """What fragmentation_by_config draws: per configuration, rank 0's allocated and reserved
    samples over Figure 7's ``size`` step, replayed without a limit."""
    from zerospec.evaluation.cached_memory import figure7
    rows = ["| config | samples | allocated peak (B) | max cached (B) | samples sha256 |",
            "|---|---|---|---|---|"]
    for name, mem in figure7(size).items():
        rows.append(f"| {name} | {len(mem.samples):,} | {max(a for a, _ in mem.samples):,} "
                    f"| {mem.reserved:,} | {sha(mem.samples)} |")
    return "\n".join(rows)


@functools.lru_cache(maxsize=None)
def explain_example():
    """spec/models.md's worked example: `zerospec plan --preset llama-3-70b --gpus 64 --machine
    dgx-h100 --stage 3 --seq 8192 --micro-batch 1 --checkpoint-activations 1 --explain`."""
    from zerospec.paper.hardware import MACHINES
    from zerospec.plan.explain import explain
    return explain("llama-3-70b", 3, 64, MACHINES["dgx-h100"].memory_bytes, "dgx-h100", seq=8192,
                   micro_batch=1, checkpoint_activations=1)


def explain_figure_data() -> str:
    """What explain_memory draws: the explained rank's bytes per category after every ledger
    event of the worked example's step, the points drawn, the peak and the GPU's memory."""
    from zerospec.plan.explain_figure import memory_over_step, turning_points
    ex = explain_example()
    cls = max(ex.result.classes, key=lambda c: c.memory.peak_total)
    curve = memory_over_step(cls.memory.trace)
    kept = turning_points(curve)
    drawn = [tuple(v[i] for v in curve.held.values()) for i in kept]
    return "\n".join([
        "| step | events | points drawn | categories | peak (B) | GPU memory (B) | phases "
        "| points sha256 |", "|---|---|---|---|---|---|---|---|",
        f"| llama-3-70b, ZeRO-3, N_d = 64 | {len(curve.totals):,} | {len(kept):,} "
        f"| {', '.join(curve.held)} | {max(curve.totals):,} | {ex.capacity:,} "
        f"| {', '.join(p[0] for p in curve.phases)} | {sha(drawn)} |"])


def _draw_explain(out):
    from zerospec.plan.explain_figure import save
    return [save(explain_example(), out)]


@functools.lru_cache(maxsize=None)
def zeropp_runs():
    """spec/zeropp.md's figure: node 0's bytes per collective at 384 meta GPUs (48 × 8), the 100B
    shape, for ZeRO-3, hpZ, qwZ, qgZ, all three and MiCS (zerospec/plan/nodes.py)."""
    from zerospec.plan.nodes import figure_runs
    return figure_runs()


def _zeropp_data() -> str:
    from zerospec.plan.nodes import markdown
    return markdown(zeropp_runs())


def _draw_zeropp(out):
    from zerospec.plan import nodes
    return [nodes.save(zeropp_runs(), out, nodes.FIGURE_TITLE, "zeropp_node_bytes")]


@functools.lru_cache(maxsize=None)
def offload_runs():
    """spec/offload.md's figure: rank 0's bytes per link and direction, 7.5B on 16 meta GPUs, for
    stage 2, ZeRO-Offload (both modes, the NVMe tier) and ZeRO-Infinity (zerospec/plan/offload.py)."""
    from zerospec.plan.offload import figure_runs
    return figure_runs()


def _offload_data() -> str:
    from zerospec.plan.offload import markdown
    return markdown(offload_runs())


def _draw_offload(out):
    from zerospec.plan import offload
    return [offload.save(offload_runs(), out, offload.FIGURE_TITLE, "offload_link_bytes")]


def _paper(*tables: tuple[str, Callable[[], str]]) -> Callable[[], dict[str, str]]:
    return lambda: {f"{SNAP}/test_evaluation/{name}.md": text() for name, text in tables}


def _pf():
    from zerospec.evaluation import tables as pf
    return pf


def _draw_report(fn_name: str):
    def draw(out):
        from zerospec.report import figures
        return getattr(figures, fn_name)(report(), out)
    return draw


def _draw_paper(n: int):
    def draw(out):
        from zerospec.evaluation import plots
        return plots.draw(n, out)
    return draw


def _draw_c30(out):
    from types import SimpleNamespace
    from zerospec.report import figures
    return figures.fragmentation(SimpleNamespace(c30={}), out)


REPORT_DATA = f"{SNAP}/test_memory_report/test_report_figures_data_at_32_gpus.md"
C30_DATA = f"{SNAP}/test_allocator/test_fragmentation_figure_data.md"
FIG7_DATA = f"{SNAP}/test_evaluation/test_figure7_cached_memory_curves_at_100b.md"
ZEROPP_DATA = (f"{SNAP}/test_zeropp/"
               "test_bytes_inside_and_across_nodes_per_collective_at_384_gpus.md")
OFFLOAD_DATA = (f"{SNAP}/test_offload_links/"
                "test_bytes_per_link_per_step_for_stage_2_offload_and_infinity.md")
EXPLAIN_DATA = "tests/unit/plan/__snapshots__/test_models_page/test_explain_figure_data.md"

FIGURES = {f.name: f for f in [
    Figure("memory_per_stage", "memory.md", (REPORT_DATA,),
           lambda: {REPORT_DATA: report_figures_data(report())}, _draw_report("memory_per_stage")),
    Figure("memory_vs_n", "memory.md", (REPORT_DATA,),
           lambda: {REPORT_DATA: report_figures_data(report())}, _draw_report("memory_vs_n")),
    Figure("comm_per_stage", "communication.md", (REPORT_DATA,),
           lambda: {REPORT_DATA: report_figures_data(report())}, _draw_report("comm_per_stage")),
    Figure("fragmentation", "allocator.md", (C30_DATA,),
           lambda: {C30_DATA: c30_figure_data()}, _draw_c30),
    Figure("paper_figure2", "evaluation.md", (f"{SNAP}/test_evaluation/test_figure2_baseline_table.md",),
           _paper(("test_figure2_baseline_table", lambda: _pf().bare(_pf().figure2()[0]))),
           _draw_paper(2)),
    Figure("paper_figure3", "evaluation.md", (f"{SNAP}/test_evaluation/test_figure3_table.md",),
           _paper(("test_figure3_table", lambda: _pf().bare(_pf().figure3()[0]))), _draw_paper(3)),
    Figure("paper_figure4", "evaluation.md", (f"{SNAP}/test_evaluation/test_figure4_tables.md",),
           _paper(("test_figure4_tables",
                   lambda: "\n\n".join(_pf().bare(t) for t in _pf().figure4()))), _draw_paper(4)),
    Figure("paper_figure6", "evaluation.md", (f"{SNAP}/test_evaluation_allocator/test_figure6_table.md",),
           _paper(("test_figure6_table", lambda: _pf().bare(_pf().figure6()[0]))), _draw_paper(6)),
    Figure("fragmentation_by_config_100B", "evaluation.md", (FIG7_DATA,),
           lambda: {FIG7_DATA: figure7_curves_data("100B")}, _draw_paper(7)),
    Figure("explain_memory", "models.md", (EXPLAIN_DATA,),
           lambda: {EXPLAIN_DATA: explain_figure_data()}, _draw_explain),
    Figure("zeropp_node_bytes", "zeropp.md", (ZEROPP_DATA,),
           lambda: {ZEROPP_DATA: _zeropp_data()}, _draw_zeropp),
    Figure("offload_link_bytes", "offload.md", (OFFLOAD_DATA,),
           lambda: {OFFLOAD_DATA: _offload_data()}, _draw_offload),
    Figure("paper_figure8", "evaluation.md", (f"{SNAP}/test_evaluation/test_figure8_table.md",),
           _paper(("test_figure8_table", lambda: _pf().bare(_pf().figure8()[0]))), _draw_paper(8)),
]}


# -- the hashes a figure records ---------------------------------------------------------------------------
def digest(path: str) -> str:
    return hashlib.sha256((ROOT / path).read_bytes()).hexdigest()


def description(fig: Figure) -> str:
    """What ``fig``'s SVG records: the snapshot files it was drawn from and their sha256."""
    return (f"spec/figures/{fig.name}.svg, drawn by tools/specfigures.py from: "
            + "; ".join(f"{p} sha256:{digest(p)}" for p in fig.snapshots))


def recorded(svg: pathlib.Path) -> dict[str, str]:
    """The snapshot files (path -> sha256) a committed SVG says it was drawn from."""
    m = DESCRIPTION.search(svg.read_text())
    if m is None:
        return {}
    return dict(re.findall(r"(\S+) sha256:([0-9a-f]{64})", m.group(1).split("from:", 1)[-1]))


def stale(fig: Figure) -> str | None:
    """Why ``fig``'s committed SVG is not drawn from the current snapshots (None if it is)."""
    if not fig.path.exists():
        return "not drawn"
    got = recorded(fig.path)
    if set(got) != set(fig.snapshots):
        return f"records {sorted(got)}, its data are {list(fig.snapshots)}"
    changed = [p for p in fig.snapshots if got[p] != digest(p)]
    return f"drawn before {', '.join(changed)} changed" if changed else None


def check_pinned(fig: Figure) -> None:
    """Refuse to draw ``fig`` unless the data it draws are what its snapshots hold."""
    for path, text in fig.pinned().items():
        snap = (ROOT / path).read_text() if (ROOT / path).exists() else None
        if snap is None or snap.rstrip("\n") != text.rstrip("\n"):
            raise SystemExit(f"{fig.name}: its data differ from {path}; update the snapshot "
                             f"(python tools/specsync.py --refresh) before drawing")


def draw(fig: Figure) -> pathlib.Path:
    """``fig`` checked against its snapshots, drawn, and written to spec/figures/ with their hashes."""
    from zerospec.render.savefig import svg_metadata
    check_pinned(fig)
    with tempfile.TemporaryDirectory() as tmp, svg_metadata(Description=description(fig)):
        svg = next(p for p in fig.draw(pathlib.Path(tmp)) if p.suffix == ".svg")
        OUT.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(svg, fig.path)
    return fig.path


def main(argv: list[str]) -> int:
    if "--check" in argv:
        bad = {n: why for n, f in FIGURES.items() if (why := stale(f))}
        for name, why in bad.items():
            print(f"stale: spec/figures/{name}.svg: {why}")
        return 1 if bad else 0
    names = [a for a in argv if not a.startswith("-")]
    unknown = [n for n in names if n not in FIGURES]
    if unknown:
        print(f"unknown figure {', '.join(unknown)}; accepted: {', '.join(FIGURES)}", file=sys.stderr)
        return 2
    todo = names or [n for n, f in FIGURES.items() if "--all" in argv or stale(f)]
    for name in todo:
        path = draw(FIGURES[name])
        print(f"drew {path.relative_to(ROOT)} ({path.stat().st_size:,} B)", flush=True)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main(sys.argv[1:]))
