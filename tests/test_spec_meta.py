"""The spec and the tests name the same claims, with the same status: nothing promised in spec/ goes
untested, and no claim passes on a tautology or an unexplained mismatch."""
from __future__ import annotations

import importlib
import pathlib
import re
from collections import defaultdict
from types import SimpleNamespace

import pytest

from tests.support import claims   # the claims plugin: the claim mark and the summary's rules

ROOT = pathlib.Path(__file__).resolve().parent.parent
# Modules a test can import from without running anything: the closed forms and the paper's data
CLOSED_FORM_ONLY = ("zerospec.paper", "zerospec.plan.closed_form")
# Spec pages that name claim ids but have no claims of their own, so no tests/claims/ file
NO_CLAIMS_OF_THEIR_OWN = {"README.md": "the index: claim -> page -> test",
                          "glossary.md": "defines the terms; its ids point to the pages that check them"}


def whole_claim_suite(request) -> list:
    """The collected items, deselected ones included (a slow test's mark counts too), or a skip
    when a file of tests/claims/ is not among them."""
    items = claims.all_items(request.session)
    collected = {pathlib.Path(str(it.path)) for it in items}
    if not set((ROOT / "tests" / "claims").glob("test_*.py")) <= collected:
        pytest.skip("runs when the whole claim suite is collected")
    return items


def declared(items) -> dict[str, set[str]]:
    """claim id -> the statuses its tests declare."""
    out = defaultdict(set)
    for it in items:
        for m in claims.claim_marks(it):
            out[m.cid].add(m.status)
    return out


def slug(heading: str) -> str:
    """A Markdown heading's anchor as GitHub makes it: lower case, punctuation dropped, - for spaces."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_ranges_expand():
    """C6–C9 names C6, C7, C8 and C9; a single id names itself."""
    assert claims.ids_in("see C6–C9 and P1, C57") == {"C6", "C7", "C8", "C9", "P1", "C57"}


def test_ranges_expand_in_every_id_family():
    """The successors' families are ids too, each range within its family: B2–B4, C-I1–C-I3, D7."""
    assert claims.ids_in("B2–B4, C-I1–C-I3 and D7") == {"B2", "B3", "B4", "C-I1", "C-I2", "C-I3",
                                                        "D7"}
    assert [claims.section_of(c) for c in ("C8", "B2", "C-I8", "D2")] == [
        "A.2 ZeRO-DP stage formulas", "B. ZeRO-Offload (arXiv:2101.06840)",
        "C. ZeRO-Infinity (arXiv:2104.07857)", "D. ZeRO++ (arXiv:2306.10209)"]


CLAIMED = """
import pytest

@pytest.mark.claim("C2")
def test_c2(): pass

@pytest.mark.claim("C20")
def test_c20(): pass

@pytest.mark.claim("C-I8", status="closed_form")
def test_infinity(): pass

@pytest.mark.claim("C2")
@pytest.mark.claim("D2")
def test_both(): pass

def test_unmarked(): pass
"""


@pytest.mark.parametrize("ids, ran", [(["C2"], ["test_c2", "test_both"]),
                                      (["C-I8"], ["test_infinity"]),
                                      (["D2", "C20"], ["test_c20", "test_both"])])
def test_claim_option_runs_exactly_the_tests_marked_with_that_id(pytester, ids, ran):
    """`pytest --claim C2` runs C2's tests and no other: not C20's, as `-k C2` would."""
    pytester.makepyfile(test_claimed=CLAIMED)
    args = [a for cid in ids for a in ("--claim", cid)]
    result = pytester.runpytest("-p", "tests.support.claims", "-p", "no:xdist", "-p", "no:benchmark", "-v",
                                *args)
    passed = [line.split("::")[1].split()[0] for line in result.outlines if " PASSED" in line]
    assert sorted(passed) == sorted(ran)


def test_claim_option_refuses_what_is_not_a_claim_id(pytester):
    """`--claim 8` is a usage error naming the value and the accepted families."""
    result = pytester.runpytest("-p", "tests.support.claims", "--claim", "8")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "'8' is not a claim id; accepted: C1–C57, P1–P12, B1–B8" in result.stderr.str()


def test_spec_index_reads_status_and_reason_from_every_table():
    """spec/README.md's tables give each claim id, ranges expanded, its status and page or reason."""
    text = ("| claim | what | status | page | test |\n|---|---|---|---|---|\n"
            "| C6–C7 | x | measured = paper | memory.md | t |\n\n"
            "| claim | status | why |\n|---|---|---|\n| C1, C4 | not checkable | definitions |\n")
    assert claims.spec_statuses(text) == {"C6": ("measured = paper", "memory.md"),
                                          "C7": ("measured = paper", "memory.md"),
                                          "C1": ("not checkable", "definitions"),
                                          "C4": ("not checkable", "definitions")}


def test_a_claim_backed_only_by_closed_forms_is_never_reported_measured():
    """One measuring test makes a claim measured; one explained gap makes it differ; else closed form."""
    assert claims.claim_status({"closed_form"}) == "closed_form"
    assert claims.claim_status({"closed_form", "measured"}) == "measured"
    assert claims.claim_status({"measured", "differs", "closed_form"}) == "differs"


@pytest.mark.parametrize("kwargs,named", [({"status": "ok"}, "status='ok'"),
                                           ({"status": "differs"}, "page=None"),
                                           ({"page": "spec/scale.md#x"}, "page='spec/scale.md#x'")],
                         ids=["unknown-status", "differs-without-page", "page-without-differs"])
def test_a_claim_mark_the_summary_cannot_report_is_refused(kwargs, named):
    """An unknown status, a "differs" with no page, or a page on a status that takes none: refused
    at collection, naming the value and what is accepted."""
    item = SimpleNamespace(nodeid="t::x", iter_markers=lambda name: [pytest.mark.claim("C9", **kwargs).mark])
    with pytest.raises(pytest.UsageError, match=re.escape(named)):
        claims.claim_marks(item)


def page_of(claims_file: str, pages) -> str | None:
    """The spec page a claims file is named for: ``test_<page>.py`` or ``test_<page>_<part>.py``
    (the longest such page), or None."""
    stem = pathlib.Path(claims_file).stem
    named = [p for p in pages if stem == f"test_{p}" or stem.startswith(f"test_{p}_")]
    return max(named, key=len, default=None)


def test_every_page_with_claims_has_a_claims_file_and_every_claims_file_names_its_page():
    """Each spec/<page>.md that names a claim id (but the index and the glossary) has its claims in
    tests/claims/test_<page>.py or test_<page>_<part>.py, and every file of tests/claims/ is named so
    for an existing page: the tests of a page are found by its name."""
    spec = sorted((ROOT / "spec").glob("*.md"))
    pages = {p.stem for p in spec}
    files = sorted(p.name for p in (ROOT / "tests" / "claims").glob("test_*.py"))
    with_claims = {p.stem for p in spec
                   if claims.ids_in(p.read_text()) and p.name not in NO_CLAIMS_OF_THEIR_OWN}
    assert set(NO_CLAIMS_OF_THEIR_OWN) <= {p.name for p in spec}
    assert [f for f in files if page_of(f, pages) is None] == [], "claims files named for no page"
    assert sorted(with_claims - {page_of(f, pages) for f in files}) == [], "pages with no claims file"


def test_every_claim_in_spec_has_a_test_and_every_claim_test_is_in_spec(request):
    """Ids mentioned in spec/ (less the visible not-checked list) == ids marked on tests."""
    items = whole_claim_suite(request)
    marked = set(declared(items))
    unchecked = {c for c, (status, _) in claims.spec_statuses().items() if status.startswith("not ")}
    in_spec = set().union(*(claims.ids_in(p.read_text()) for p in (ROOT / "spec").glob("*.md")))
    assert sorted(in_spec - unchecked - marked) == []
    assert sorted(marked - in_spec) == []
    assert sorted(marked & unchecked) == []


def test_every_claims_status_in_spec_is_the_status_its_tests_declare(request):
    """spec/README.md's status of each claim == what its tests' marks add up to (claim_status)."""
    tested = {c: claims.STATUS_TEXT[claims.claim_status(s)]
              for c, s in declared(whole_claim_suite(request)).items()}
    in_spec = {c: status for c, (status, _) in claims.spec_statuses().items()
               if not status.startswith("not ")}
    assert {c: (in_spec.get(c), tested.get(c)) for c in in_spec.keys() | tested.keys()
            if in_spec.get(c) != tested.get(c)} == {}


def test_a_measurement_that_differs_is_explained_on_its_page(request):
    """Every ``differs`` mark names a spec page and one of its headings, and spec/README.md's row
    for that claim points to the same page and heading."""
    index = claims.spec_statuses()
    pages = {(m.cid, m.page) for it in request.session.items for m in claims.claim_marks(it)
             if m.status == "differs"}
    if not pages:
        pytest.skip("no test declaring status='differs' was collected")
    for cid, page in sorted(pages):
        path, _, anchor = page.partition("#")
        headings = [line.lstrip("#") for line in (ROOT / path).read_text().splitlines()
                    if line.startswith("#")]
        assert anchor in {slug(h) for h in headings}, f"{cid}: no heading of {path} has anchor #{anchor}"
        assert page.removeprefix("spec/") in index[cid][1], (cid, page, index[cid])


def test_a_test_that_can_only_compute_closed_forms_does_not_declare_a_measurement(request):
    """A claim test whose module imports, from zerospec and tests/, only closed forms and the
    paper's data (zerospec.paper, report.plan) cannot have measured anything: it is closed_form."""
    wrong = []
    for it in request.session.items:
        marks = [m for m in claims.claim_marks(it) if m.status != "closed_form"]
        if not marks or it.module is None:
            continue
        used = {getattr(v, "__module__", None) or getattr(v, "__name__", "")
                for v in vars(it.module).values()}
        used = {u for u in used if isinstance(u, str) and u.startswith(("zerospec", "tests."))
                and u != it.module.__name__}      # tests.support.runs & co. train: that is measuring
        if used and all(u.startswith(CLOSED_FORM_ONLY) for u in used):
            wrong += [(it.nodeid, m.cid, m.status) for m in marks]
    assert wrong == []


def test_closed_form_modules_are_importable_names():
    """The closed-form module list names real modules (a rename would silently pass everything)."""
    for name in CLOSED_FORM_ONLY:
        importlib.import_module(name)


def in_default_run(items) -> list:
    """The items plain ``pytest`` runs: neither slow nor DeepSpeed (pyproject.toml's addopts)."""
    return [it for it in items
            if not it.get_closest_marker("slow") and not it.get_closest_marker("deepspeed")]


def test_the_default_run_checks_every_claim_but_the_evaluations_longest(request):
    """The slow cases widen or lengthen checks the default run makes: every claim a test checks has
    a test outside the slow and DeepSpeed marks too (plain ``pytest`` checks it), but claims.py's
    SLOW_ONLY, which the summary names as not run."""
    items = whole_claim_suite(request)
    assert sorted(set(declared(items)) - set(declared(in_default_run(items)))) == sorted(claims.SLOW_ONLY)


def test_the_summary_names_what_only_the_slow_cases_measure(request):
    """A claim the default run checks in closed form only but the slow cases measure is in
    claims.py's MEASURED_WHEN_SLOW with the status all its tests add up to, so the default
    summary does not pass a "closed form only" off as the claim's whole status."""
    items = whole_claim_suite(request)
    fast, full = declared(in_default_run(items)), declared(items)
    weaker = {c: claims.claim_status(full[c]) for c in fast
              if claims.claim_status(fast[c]) != claims.claim_status(full[c])}
    assert weaker == claims.MEASURED_WHEN_SLOW


def test_every_file_the_scheduler_groups_exists():
    """The xdist units of tests/support/scheduling.py name files that exist: a renamed file would
    silently leave its group (and train the shared grid twice, or start a second forkserver)."""
    from tests.support import scheduling as setup
    assert setup.UNITS and all((ROOT / path).is_file() for path in setup.UNITS), \
        sorted(p for p in setup.UNITS if not (ROOT / p).is_file())


def test_the_suite_runs_without_xdist():
    """The tests run in one process, without xdist (for a debugger or a profiler, as the README
    says): the scheduler hook tests/support/scheduling.py gives xdist is optional where xdist is
    absent."""
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:randomly",
                           "-o", "addopts=-p no:cacheprovider", "-q", "--collect-only",
                           "tests/unit/tools/test_benchtable.py"],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
