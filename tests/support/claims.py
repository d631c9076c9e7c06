"""The claims plugin: the `claim` marker, what its statuses mean, and the claims summary.

Loaded for every run by the project's root conftest.py (``pytest_plugins``), benchmarks included.

Every test that checks a paper claim carries ``@pytest.mark.claim("C9")`` (ids from
docs/claims.md; ``P1``… are properties of ZeRO the paper relies on without numbering
them, listed in spec/README.md). The mark also says what a pass is worth — where the test's
values come from (design.md, property 7) and whether they agree with the paper — so that nothing
passes on a tautology, a model or a mismatch:

* ``claim("C9")`` — *measured = paper*: zerospec ran the stage code and its ledgers, the
  observer, the wire or a counter give the paper's number;
* ``claim("C27", status="differs", page="spec/scale.md#...")`` — *measured ≠ paper*: measured,
  and the gap is explained on ``page``;
* ``claim("C43", status="modelled", ...)`` — *modelled = paper*: measured FLOPs and collectives
  timed on the spec-sheet machine model (zerospec/paper/hardware.py, zerospec/evaluation/timing.py)
  give the paper's number; ``status="modelled_differs", page=...`` — *modelled ≠ paper*;
* ``claim("C11", status="closed_form")`` — *closed form only*: the paper's number follows from a
  closed form (theory.py) or from the paper's own numbers; nothing was run (computed).

A claim's status is the weakest source its verdict rests on: modelled if any of its tests is
modelled, else measured; ≠ if any of its tests differs. A closed form compares the paper with
itself, so it speaks for a claim only when no test measures or models it (``claim_status``).
FAIL when any of its tests failed. Claims with no test are listed in spec/README.md with why (not
checkable, or not yet checked). A test may record its values and what the paper says with the
``claim_values`` fixture; at the end of the run pytest prints one line per claim id, grouped by
section of the paper, like the paper's own tables, each value labelled by the source of the test
that recorded it: measured, modelled or computed.
"""
from __future__ import annotations

import argparse
import pathlib
import re
from collections import defaultdict
from typing import NamedTuple

import pytest

SECTIONS = [  # (first id, last id, section of the paper)
    ("C1", "C5", "A.1 Memory model"),
    ("C6", "C13", "A.2 ZeRO-DP stage formulas"),
    ("C14", "C14", "A.3 Figure 1 (7.5B, N_d = 64)"),
    ("C15", "C16", "A.4 Table 1"),
    ("C17", "C19", "A.5 Table 2"),
    ("C20", "C26", "A.6 Communication volume"),
    ("C27", "C37", "A.7 ZeRO-R"),
    ("C38", "C57", "A.8-A.10 Evaluation and notes"),
    ("P1", "P12", "Properties ZeRO relies on (not numbered in the paper)"),
    ("B1", "B99", "B. ZeRO-Offload (arXiv:2101.06840)"),
    ("C-I1", "C-I99", "C. ZeRO-Infinity (arXiv:2104.07857)"),
    ("D1", "D99", "D. ZeRO++ (arXiv:2306.10209)"),
    ("M1", "M99", "M. MiCS (arXiv:2205.00119)"),
]


def _key(cid: str) -> tuple[str, int]:
    m = re.fullmatch(r"(C-I|[A-Z]+)(\d+)", cid)
    return (m.group(1), int(m.group(2))) if m else (cid, 0)


def section_of(cid: str) -> str:
    for lo, hi, name in SECTIONS:
        if _key(lo)[0] == _key(cid)[0] and _key(lo) <= _key(cid) <= _key(hi):
            return name
    return "Other"


# -- what a claim test's pass is worth ---------------------------------------------------------------
class Status(NamedTuple):
    source: str      # where the test's values come from: measured, modelled, computed
    agrees: bool     # its values are the paper's (else the gap is explained on its page)
    text: str        # what the summary and spec/README.md say


STATUSES = {  # declared on the mark
    "measured": Status("measured", True, "measured = paper"),
    "differs": Status("measured", False, "measured ≠ paper"),
    "modelled": Status("modelled", True, "modelled = paper"),
    "modelled_differs": Status("modelled", False, "modelled ≠ paper"),
    "closed_form": Status("computed", True, "closed form only"),
}
STATUS_TEXT = {name: s.text for name, s in STATUSES.items()}
GAPS = {name for name, s in STATUSES.items() if not s.agrees}     # each needs page= explaining it
# The sources a claim's verdict can rest on, weakest first: one modelled test makes a claim
# modelled. "computed" is not among them: a closed form checks the paper's arithmetic, not ZeRO.
VERDICT_SOURCES = ("modelled", "measured")
# Claims whose every test measures at paper scale for minutes (memory-fit searches and timed meta
# steps of 40B–170B models): the default run leaves them to the slow cases, and its summary says so
# (tests/test_spec_meta.py checks this is the whole list).
SLOW_ONLY = {"C34": "searches over 100B steps", "C38": "the baseline timed at 40B",
             "C42": "the baseline across nodes, timed at 40B", "C43": "60B on 64 to 400 GPUs",
             "C44": "the largest model per GPU count, by memory fit",
             "C48": "allocator replays of 40B and 100B steps",
             "C49": "60B throughput per configuration"}
# Claims the default run computes in closed form only, where the slow cases also measure or model
# them (the summary says so; tests/test_spec_meta.py checks this is the whole list): their status
# with those.
RUN_WHEN_SLOW = {"C18": "differs", "C41": "modelled_differs"}
SPEC_INDEX = pathlib.Path(__file__).resolve().parents[2] / "spec" / "README.md"
# the id families of docs/claims.md: C (ZeRO), P (its unnumbered properties), B (ZeRO-Offload),
# C-I (ZeRO-Infinity), D (ZeRO++), M (MiCS); a range names one family: C6–C9, C-I2–C-I4
ID = re.compile(r"\b(C-I|[BCDMP])(\d{1,2})(?:\s*[–-]\s*\1(\d{1,2}))?\b")


class ClaimMark(NamedTuple):
    cid: str
    status: str          # a key of STATUSES
    page: str | None     # where a gap (differs, modelled_differs) is explained: spec/<page>.md#<anchor>


def claim_marks(item) -> list[ClaimMark]:
    """The item's ``claim`` marks, checked: a known status, and a page for every gap (≠)."""
    out = []
    for m in item.iter_markers("claim"):
        status, page = m.kwargs.get("status", "measured"), m.kwargs.get("page")
        if status not in STATUSES:
            raise pytest.UsageError(f"{item.nodeid}: claim {m.args[0]} has status={status!r}; "
                                    f"accepted: {', '.join(map(repr, STATUSES))}")
        if (status in GAPS) != (page is not None) or (page and not page.startswith("spec/")):
            raise pytest.UsageError(f"{item.nodeid}: claim {m.args[0]} (status={status!r}) has "
                                    f"page={page!r}; {' and '.join(map(repr, sorted(GAPS)))} need "
                                    f"page='spec/<page>.md#<anchor>' explaining the gap, and no "
                                    f"other status takes one")
        out.append(ClaimMark(m.args[0], status, page))
    return out


def claim_status(statuses) -> str:
    """One claim's status from its tests' declared ones: the weakest source its verdict rests on
    (VERDICT_SOURCES), and ≠ if any test's values differ from the paper's. A claim backed only by
    closed forms never reads as measured; closed forms beside a measurement or a model do not
    weaken it (they check the paper's arithmetic)."""
    statuses = set(statuses)
    if not statuses or not statuses <= STATUSES.keys():
        raise ValueError(f"no status or an unknown one among {sorted(statuses)!r}; "
                         f"accepted: {', '.join(STATUSES)}")
    verdicts = [STATUSES[s] for s in statuses if STATUSES[s].source in VERDICT_SOURCES]
    if not verdicts:
        return "closed_form"
    source = next(src for src in VERDICT_SOURCES if src in {v.source for v in verdicts})
    agrees = all(v.agrees for v in verdicts)
    return next(name for name, s in STATUSES.items() if (s.source, s.agrees) == (source, agrees))


def ids_in(text: str) -> set[str]:
    """Claim ids in ``text``; a range such as C6–C9 names every id in it."""
    out = set()
    for kind, lo, hi in ID.findall(text):
        out |= {f"{kind}{i}" for i in range(int(lo), int(hi or lo) + 1)}
    return out


def spec_statuses(text: str | None = None) -> dict[str, tuple[str, str]]:
    """claim id -> (status, page or why), from every table of spec/README.md with a ``claim`` and
    a ``status`` column (the claim → page → test index and the list of claims not checked)."""
    lines = (SPEC_INDEX.read_text() if text is None else text).splitlines()
    out: dict[str, tuple[str, str]] = {}
    header = None
    for line, nxt in zip(lines, lines[1:] + [""]):
        if not line.startswith("|"):
            header = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header = cells if nxt.startswith("|---") else []
            continue
        row = dict(zip(header, cells))
        if "claim" in row and "status" in row and not set(row["claim"]) <= set("-"):
            for cid in ids_in(row["claim"]):
                out[cid] = (row["status"], row.get("why") or row.get("page", ""))
    return out


@pytest.fixture
def claim_values(request):
    """``claim_values(measured, paper)``: what this claim test measured, for the summary."""
    def record(measured, paper, note: str = "") -> None:
        request.node.user_properties.append(("claim_values", (str(measured), str(paper), note)))
    return record


def pytest_configure(config):
    """``--claim`` deselects as ``-k`` does, but syrupy does not know it: the snapshots of the tests
    it left out would read as unused and fail the run (a hint to --snapshot-update that would
    delete them). With ``--claim``, unused snapshots are a warning."""
    if config.getoption("claim", default=None) and hasattr(config.option, "warn_unused_snapshots"):
        config.option.warn_unused_snapshots = True


def pytest_addoption(parser):
    parser.addoption("--claim", action="append", default=[], metavar="ID", type=claim_id,
                     help="run only the tests marked with claim ID (C8, P3, B2, C-I8, D2, M2; "
                          "repeatable); the run's -m still applies: add -m 'not deepspeed' for the slow cases")


def claim_id(text: str) -> str:
    """``--claim``'s value: one id of a family of docs/claims.md, nothing else."""
    if not re.fullmatch(r"(C-I|[BCDMP])\d{1,2}", text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a claim id; accepted: C1–C57, P1–P12, B1–B8, C-I1–C-I9, D1–D9, M1–M9 "
            f"(docs/claims.md)")
    return text


def pytest_collection_modifyitems(config, items):
    """``--claim ID``: only the tests marked with that id, exactly (``-k C2`` would take C20–C29
    too). Claim ids are also keywords. A claim mark whose status or page the summary cannot report
    is refused."""
    wanted = set(config.getoption("claim"))
    keep, drop = [], []
    for item in items:
        marks = claim_marks(item)
        for mark in marks:
            item.extra_keyword_matches.add(mark.cid)
        (keep if not wanted or wanted & {m.cid for m in marks} else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


DESELECTED = pytest.StashKey[list]()


def pytest_deselected(items):
    """Remember what ``-m``/``-k`` left out: a claim's status is what *all* its tests declare,
    slow ones included, so tests/test_spec_meta.py reads their marks from here too."""
    if items:
        stash = items[0].session.stash
        stash[DESELECTED] = stash.get(DESELECTED, []) + list(items)


def all_items(session) -> list:
    """Every collected test, selected or not (their marks only: nothing is run)."""
    return list(session.items) + session.stash.get(DESELECTED, [])


ORDER = pytest.StashKey[dict]()


def _position(item) -> int:
    """The item's place in the collection (the same on every xdist worker). Under xdist, reports
    reach the summary in the order workers finish them; this keeps "the last case" one case."""
    if ORDER not in item.session.stash:
        item.session.stash[ORDER] = {it.nodeid: i for i, it in enumerate(item.session.items)}
    return item.session.stash[ORDER].get(item.nodeid, -1)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    marks = [tuple(m) for m in claim_marks(item)]
    if marks and (report.when == "call" or report.outcome != "passed"):
        report.user_properties.append(("claim_ids", marks))
        report.user_properties.append(("position", _position(item)))


def in_collection_order(reports: list) -> list:
    """Reports sorted by their item's place in the collection, whichever xdist worker ran it."""
    return sorted(reports, key=lambda rep: dict(getattr(rep, "user_properties", [])).get("position", -1))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    rows: dict[str, dict] = {}
    for status in ("passed", "failed", "error", "skipped"):
        for rep in in_collection_order(terminalreporter.stats.get(status, [])):
            props = dict(getattr(rep, "user_properties", []))
            for cid, declared, page in props.get("claim_ids", []):
                row = rows.setdefault(cid, {"passed": 0, "failed": 0, "skipped": 0, "values": [],
                                            "declared": set(), "pages": set()})
                row["failed" if status in ("failed", "error") else status] += 1
                row["declared"].add(declared)
                row["pages"] |= {page} if page else set()
                if "claim_values" in props:   # with the status of the test that recorded them
                    row["values"].append((declared, props["claim_values"]))
    if not rows:
        return
    # Claims without a test, with spec/README.md's reason: on a full run only (a -k run names its own)
    # and the slow-only claims this run left out
    unchecked = {} if (config.option.keyword or config.getoption("claim")) else {
        **{cid: st for cid, st in spec_statuses().items() if st[0].startswith("not ")},
        **{cid: ("not run", f"slow only, `pytest -m slow` ({why})") for cid, why in SLOW_ONLY.items()}}
    unchecked = {cid: st for cid, st in unchecked.items() if cid not in rows}
    tw = terminalreporter
    tw.section("claims summary (ids from docs/claims.md)")
    by_section = defaultdict(list)
    for cid in sorted(rows.keys() | unchecked.keys(), key=_key):
        by_section[section_of(cid)].append(cid)
    for name, _, _ in [(s[2], 0, 0) for s in SECTIONS] + [("Other", 0, 0)]:
        if name not in by_section:
            continue
        tw.write_line(name)
        for cid in by_section[name]:
            if cid in unchecked:
                tw.write_line(f"  {cid:<5} {unchecked[cid][0]}: {unchecked[cid][1]}")
                continue
            r = rows[cid]
            declared = claim_status(r["declared"])
            status = "FAIL" if r["failed"] else (STATUS_TEXT[declared] if r["passed"] else "skipped")
            tw.write_line(f"  {cid:<5} {status:<16} {r['passed']:>3} passed {r['failed']:>2} failed  "
                          f"{values_text(r['values'], declared)}{why_text(cid, declared, r['pages'])}")


def speaking_values(recorded: list, declared: str):
    """(status, (value, paper, note)) that speak for a claim's row: the last case recorded (largest
    N_d) among the tests whose status is the claim's — the ones its verdict rests on — else the
    last recorded; None when no test recorded any."""
    verdict = [v for v in recorded if v[0] == declared]
    return (verdict or recorded or [None])[-1]


def values_text(recorded: list, declared: str) -> str:
    """The row's values, labelled with the source of the test that recorded them (not with the
    claim's status): "measured 4,288,512 B | paper 4,288,512 B (C9)", "computed …", "modelled …"."""
    spoken = speaking_values(recorded, declared)
    if spoken is None:
        return ""
    status, (value, paper, note) = spoken
    return f"{STATUSES[status].source} {value} | paper {paper}" + (f"  {note}" if note else "")


def why_text(cid: str, declared: str, pages: set) -> str:
    """Where a gap is explained, or what the slow cases add to a claim the default run computes."""
    if declared in GAPS:
        return f"  (why: {', '.join(sorted(pages))})"
    if declared == "closed_form" and cid in RUN_WHEN_SLOW:
        return f"  (with the slow cases: {STATUS_TEXT[RUN_WHEN_SLOW[cid]]}, `pytest -m slow`)"
    return ""
