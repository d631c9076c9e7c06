"""Write the README's "What is verified" block from the snapshots and spec/README.md, never by hand.

    python tools/readme.py            # rewrite the block
    python tools/readme.py --check    # exit 1 if the README's block differs (tests/test_readme.py)

The block sits between ``<!-- readme: verified -->`` and ``<!-- /readme -->``: the claims counted
by status (spec/README.md's index, which tests/test_spec_meta.py holds to the tests' marks), then
headline claims, each with a measured cell read from a pinned snapshot (its test measures it
afresh in every run that includes it) beside the value the paper prints, cited by claim id.
"""
from __future__ import annotations

import pathlib
import re
import sys
from collections import Counter

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.support.claims import spec_statuses  # noqa: E402  (the one parser of the index)

README = ROOT / "README.md"
BLOCK = re.compile(r"(<!-- readme: verified -->\n)(.*?)(<!-- /readme -->)", re.S)
SNAP = ROOT / "tests" / "claims" / "__snapshots__"
MEMORY = "test_tables_spec/test_memory_table_at_32_gpus.md"
COMM = "test_tables_spec/test_comm_table_at_32_gpus.md"
EQUAL = "test_tables_spec/test_equivalence_table_at_32_gpus.md"
SCALE = "test_tables_spec/test_scale_7_5b_on_64_gpus.md"
TABLE1 = "test_tables_spec/test_scale_table1_measured.md"
FRAG = "test_allocator/test_fragmentation_table_of_eight_configurations.md"
P_A = "test_model_parallel_at_scale/test_p_a_at_100b_table.md"
FIG6 = "test_evaluation_allocator/test_figure6_table.md"
# every snapshot the block reads, as spec/ pointers name them (tools/specsync.py refreshes them too)
SNAPSHOTS = tuple(f"tests/claims/__snapshots__/{name}" for name in
                  (MEMORY, COMM, EQUAL, SCALE, TABLE1, FRAG, P_A, FIG6))


def table(name: str) -> dict[str, dict[str, str]]:
    """A snapshot's Markdown table as {first cell: {column: cell}}, bold marks dropped."""
    lines = [line for line in (SNAP / name).read_text().splitlines() if line.startswith("|")]
    split = [[c.strip().replace("**", "") for c in line.strip("|").split("|")] for line in lines]
    header, rows = split[0], split[2:]
    return {row[0]: dict(zip(header, row)) for row in rows}


def formula(cell: str) -> str:
    """"16Ψ = 8,577,024 (C6)" → "16Ψ = 8,577,024 B": the paper's formula at the run's Ψ and N_d."""
    return re.sub(r"\s*\(C\d+\)$", "", cell) + " B"


def headline() -> list[tuple[str, str, str, str]]:
    """(claim, what, measured here, the paper's value): each measured cell from a snapshot."""
    mem, comm, eq = table(MEMORY), table(COMM), table(EQUAL)
    scale, t1, frag, p_a, fig6 = table(SCALE), table(TABLE1), table(FRAG), table(P_A), table(FIG6)
    col = "model states /GPU (B)"
    return [
        *((cid, what, f"{mem[row][col]} B", formula(mem[row]["paper formula (B)"]))
          for cid, what, row in (("C6", "model states per GPU, plain DP, N_d = 32", "DP"),
                                 ("C7", "… with P_os", "P_os"), ("C8", "… with P_os+g", "P_os+g"),
                                 ("C9", "… with P_os+g+p", "P_os+g+p"))),
        ("C23", "traffic per GPU per step, P_os+g", comm["P_os+g"]["in Ψ"],
         f"2Ψ; ring at N_d = 32: {comm['P_os+g']['ring model (C21–C24)']}"),
        ("C24", "… P_os+g+p", comm["P_os+g+p"]["in Ψ"],
         f"3Ψ; ring at N_d = 32: {comm['P_os+g+p']['ring model (C21–C24)']}"),
        ("P1", "every stage trains the same bits: max Δ of losses, master weights vs DP",
         f"{eq['P_os+g+p']['max Δloss vs DP']}, {eq['P_os+g+p']['max Δmaster vs DP']}",
         "(stated, not numbered)"),
        ("C14", "7.5B on 64 GPUs, DP → P_os+g+p (meta)",
         f"{scale['DP']['GB']} → {scale['P_os+g+p']['GB']} GB", "120 → 1.9 GB"),
        ("C16", "1T on 1,024 GPUs, P_os+g+p (meta)", f"{t1['1024']['1T P_os+g+p']} GB", "15.6 GB"),
        ("C30", "GPT-2 1.5B, P_os+g+p, N_d = 400: the allocator model runs out",
         frag["1.5B, P_os+g+p, N_d=400, k=2"]["runs out without M_D"].split(", ", 1)[1],
         "over 30% free"),
        ("C32", "100B, MP 16: checkpoints on each GPU, without → with P_a (meta)",
         f"{p_a['checkpoints']['checkpoints on the GPU (B)']} → "
         f"{p_a['P_a']['checkpoints on the GPU (B)']} B", "about 33 GB → 2 GB"),
        ("C47", "largest model with P_os+g + P_a (Table 3's C4), 400 GPUs, memory fit (meta)",
         f"{int(fig6['C4']['Ψ'].replace(',', '')) / 1e9:.0f}B", fig6["C4"]["paper"]),
    ]


# the successors' claim families (docs/claims.md), in the order the README names them
SUCCESSORS = (("D", "ZeRO++"), ("M", "MiCS"), ("B", "ZeRO-Offload"), ("C-I", "ZeRO-Infinity"))


def successors(statuses: dict) -> str:
    """" Beyond the paper: ZeRO++ (D1, D2, D6): 3 measured = paper; …" for the families spec/'s
    index holds claims of (none: empty)."""
    parts = []
    for prefix, name in SUCCESSORS:
        ids = sorted((c for c in statuses if re.fullmatch(re.escape(prefix) + r"\d+", c)),
                     key=lambda c: int(c[len(prefix):]))
        if ids:
            n = Counter(statuses[c][0] for c in ids)
            parts.append(f"{name} ({', '.join(ids)}): " + ", ".join(f"{n[s]} {s}" for s in sorted(n)))
    return " Beyond the paper: " + "; ".join(parts) + "." if parts else ""


def render() -> str:
    statuses = spec_statuses()
    counts = Counter(status for cid, (status, _) in statuses.items() if re.fullmatch(r"C\d+", cid))
    props = Counter(status for cid, (status, _) in statuses.items() if re.fullmatch(r"P\d+", cid))
    order = sorted(counts, key=lambda s: (-counts[s], s))
    lines = [f"The paper's {sum(counts.values())} claims (C1–C57) by what their tests are worth, "
             f"slow cases included: " + "; ".join(f"{counts[s]} {s}" for s in order) + ". "
             f"And {sum(props.values())} properties the paper relies on unnumbered (P1–P12): "
             + "; ".join(f"{props[s]} {s}" for s in sorted(props)) + ". *measured*: the stage code ran "
             "(threads, processes or meta); *modelled*: timed on a spec-sheet machine; *closed form "
             "only*: the paper's arithmetic; ≠: the page says why. The cells below are pinned tables, "
             "most from the slow cases (`pytest -m slow`)." + successors(statuses), "",
             "| claim | what | measured here | paper | status |", "|---|---|---|---|---|"]
    for cid, what, measured, paper in headline():
        lines.append(f"| {cid} | {what} | {measured} | {paper} | {statuses[cid][0]} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    text = README.read_text()
    m = BLOCK.search(text)
    if m is None:
        print("README.md has no '<!-- readme: verified -->' block", file=sys.stderr)
        return 1
    new = render()
    if "--check" in argv:
        if m.group(2) != new:
            print("stale: README.md's 'What is verified' block (python tools/readme.py)")
            return 1
        return 0
    README.write_text(text[:m.start(2)] + new + text[m.end(2):])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
