"""Write the benchmark tables from pytest-benchmark's JSON, never by hand.

    pytest benchmarks --benchmark-json=bench.json     # the figures, with their machine
    python tools/benchtable.py bench.json              # rewrite the tables from them
    python tools/benchtable.py bench.json --check      # exit 1 if a table differs
    python tools/benchtable.py avx512.json avx2.json   # several runs (machines, ISAs): one table
    python tools/benchtable.py bench.json --keep       # add a run, keep other machines' rows

Each benchmark records in ``extra_info`` its figure (``ratio``, or ``seconds`` for the meta
runs), its ``target`` and, through benchmarks/conftest.py, what it ran on (``isa``: the CPU
kernels torch dispatched to, ``cpu``: its model, ``torch``, ``cpus``). The full table sits in
docs/performance.md between ``<!-- benchmarks: begin -->`` and ``<!-- benchmarks: end -->``: one
row per benchmark case, with the machine it came from, so a figure is never shown without its
machine. README.md's ``<!-- benchmarks-summary: … -->`` block is :func:`summary` of it: the latest
run (its first rows), one row per benchmark (tests/test_readme.py holds the two together).
"""
from __future__ import annotations

import json
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGE = ROOT / "docs" / "performance.md"
BLOCK = re.compile(r"(<!-- benchmarks: begin -->\n)(.*?)(<!-- benchmarks: end -->)", re.S)
SUMMARY = re.compile(r"(<!-- benchmarks-summary: begin -->\n)(.*?)(<!-- benchmarks-summary: end -->)",
                     re.S)
FIGURES = (("ratio", "ratio", "{:.2f}"), ("seconds", "seconds", "{:.1f} s"))


def rows(data: dict) -> list[str]:
    out = ["| benchmark | case | figure | measured | target | met | machine |",
           "|---|---|---|---|---|---|---|"]
    date = data.get("datetime", "")[:10]
    for b in data["benchmarks"]:
        info = b.get("extra_info", {})
        name, case = b["name"].split("[")[0], (b.get("param") or "")
        kind = next(((label, fmt) for key, label, fmt in FIGURES if key in info), None)
        if kind is None:
            raise ValueError(f"benchmark {b['name']} records neither 'ratio' nor 'seconds' in "
                             f"extra_info: add one (benchmarks/conftest.py's docstring)")
        label, fmt = kind
        value = info["ratio" if label == "ratio" else "seconds"]
        target = info.get("target")
        extra = f" (step/floor {info['plain_ratio']:.2f}" if "plain_ratio" in info else ""
        if "shared_matched_ratio" in info:   # the step benchmark's other floors (its docstring)
            extra += f"; shared floor {info['shared_matched_ratio']:.2f}"
        if "mixed_matched_ratio" in info:
            extra += f"; mixed-precision floor {info['mixed_matched_ratio']:.2f}"
        extra += ")" if extra else ""
        cpu = f"{info['cpu']}, " if info.get("cpu") else ""   # recorded since 2026-12-04
        machine = (f"{cpu}{info.get('isa', '?')}, {info.get('cpus', '?')} CPUs, torch "
                   f"{info.get('torch', '?')}, {date}")
        at_least = info.get("at_least", False)   # a floor to reach (a throughput share), not a cap
        ok = target is not None and (value >= target if at_least else value <= target)
        met = "—" if target is None else "yes" if ok else "**no**"
        bound = ("≥ " if at_least else "≤ ") + fmt.format(target) if target is not None else "—"
        out.append(f"| `{name}` | {case} | {label} | {fmt.format(value)}{extra} | "
                   f"{bound} | {met} | {machine} |")
    return out


def table(runs: list[dict]) -> str:
    """One table of every run's rows, in the order given (one header; each row names its machine)."""
    lines = rows(runs[0])
    for data in runs[1:]:
        lines += rows(data)[2:]
    return "\n".join(lines) + "\n"


def cells(row: str) -> list[str]:
    return [c.strip() for c in row.strip().strip("|").split("|")]


def summary(table_text: str) -> str:
    """The latest run of the full table (the first row's machine) in a few lines: how many
    benchmarks met their targets, and each that did not, with its cases' figures against the
    target (the full table is docs/performance.md's)."""
    rows = [r for r in table_text.splitlines()[2:] if r.startswith("| ")]
    latest = machine_of(rows[0])
    by_name: dict[str, list[list[str]]] = {}
    for r in rows:
        if machine_of(r) == latest:
            name, case, _, measured, target, met, _ = cells(r)
            by_name.setdefault(name, []).append([case, measured.split(" (")[0], target, met])
    targeted = {n: cs for n, cs in by_name.items() if any(t != "—" for _, _, t, _ in cs)}
    missed = {n: [c for c in cs if c[3] == "**no**"] for n, cs in targeted.items()}
    missed = {n: cs for n, cs in missed.items() if cs}
    out = [f"On {latest}: {len(targeted) - len(missed)} of {len(targeted)} benchmarks with a target "
           f"met it ({len(by_name) - len(targeted)} more only measure)" + ("." if not missed else
                                                                         "; not met:"), ""]
    for name, cases in missed.items():
        figures = ", ".join(f"{c}: {m}" if c else m for c, m, _, _ in cases)
        targets = ", ".join(sorted({t for _, _, t, _ in cases}))
        out.append(f"- {name}: {figures} (target {targets})")
    return "\n".join(out).rstrip() + "\n"


def machine_of(row: str) -> str:
    """The machine cell of one table row (its last)."""
    return row.rstrip().rstrip("|").rsplit("|", 1)[-1].strip()


def _machine(row: str) -> str:
    """The machine cell without its date: a later run of the same machine replaces its rows."""
    return machine_of(row).rsplit(", ", 1)[0]


def kept_rows(old_table: str, new_table: str) -> list[str]:
    """``--keep``: the rows of ``old_table`` from machines none of ``new_table``'s rows come from
    (CPU model, kernels, CPU count and torch version: the cell less its date), so a run on one
    machine adds its rows without dropping another machine's, whose JSON is not at hand, and
    replaces the rows of an earlier run of its own machine."""
    new = {_machine(r) for r in new_table.splitlines()[2:]}
    return [r for r in old_table.splitlines()[2:]
            if r.startswith("| ") and _machine(r) not in new]


USAGE = "usage: python tools/benchtable.py BENCH.json [BENCH.json ...] [--keep] [--check]"
OPTIONS = ("--keep", "--check")


def replace(text: str, block: re.Pattern, body: str, where: str) -> str:
    m = block.search(text)
    if m is None:
        raise LookupError(f"{where} has no {block.pattern.split('(')[1].split(')')[0]!r} block")
    return text[:m.start(2)] + body + text[m.end(2):]


def main(argv: list[str]) -> int:
    paths = [a for a in argv if not a.startswith("--")]
    unknown = [a for a in argv if a.startswith("--") and a not in OPTIONS]
    if unknown or not paths:
        # a mistyped --keep must not rewrite the table without the other machines' rows
        print((f"unknown option {unknown[0]!r}; accepted: {', '.join(OPTIONS)}\n" if unknown
               else "") + USAGE, file=sys.stderr)
        return 2
    runs = [json.loads(pathlib.Path(p).read_text()) for p in paths]
    table_text = table(runs)
    page, readme = PAGE.read_text(), README.read_text()
    m = BLOCK.search(page)
    if m is None:
        print("docs/performance.md has no <!-- benchmarks: begin --> … <!-- benchmarks: end --> "
              "block", file=sys.stderr)
        return 2
    kept = kept_rows(m.group(2), table_text) if "--keep" in argv else []
    table_text += "".join(r + "\n" for r in kept)
    try:
        new_page = replace(page, BLOCK, table_text, "docs/performance.md")
        new_readme = replace(readme, SUMMARY, summary(table_text), "README.md")
    except LookupError as exc:
        print(exc, file=sys.stderr)
        return 2
    if (new_page, new_readme) == (page, readme):
        return 0
    if "--check" in argv:
        print("the benchmark tables (docs/performance.md, README.md) differ from", ", ".join(paths))
        return 1
    PAGE.write_text(new_page)
    README.write_text(new_readme)
    n = sum(len(d["benchmarks"]) for d in runs)
    print(f"rewrote the benchmark tables from {', '.join(paths)} ({n} rows"
          + (f", {len(kept)} kept from other machines)" if kept else ")"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
