"""The spec and the tests name the same claims, with the same status: nothing promised in spec/ goes
untested, and no claim passes on a tautology or an unexplained mismatch."""
from __future__ import annotations

import dataclasses
import dis
import functools
import importlib
import inspect
import pathlib
import re
import sys
from collections import Counter, defaultdict
from types import SimpleNamespace

import pytest

from tests.support import claims   # the claims plugin: the claim mark and the summary's rules
from zerospec.evaluation import timing
from zerospec.paper import hardware

ROOT = pathlib.Path(__file__).resolve().parent.parent
# Modules a test can import from without running anything: the closed forms and the paper's data
CLOSED_FORM_ONLY = ("zerospec.paper", "zerospec.plan.closed_form")
# The spec-sheet time model: a value computed there is modelled, not measured (design.md, property 7)
TIME_MODEL = timing.__name__
# A machine's fields that are the paper's own description of its cluster, not the model's speeds:
# 16 GPUs per node and 32 GB per V100 are what the paper states and what a memory fit is held to
MACHINE_AS_THE_PAPER_STATES_IT = {"name", "gpus_per_node", "memory_bytes", "sources"}
# What a test can only read off a timed step or a machine's speeds, by name: an attribute of a
# returned object cannot be resolved without running the test
TIMED_NAMES = frozenset(
    {f.name for f in dataclasses.fields(timing.StepTime) if f.name.endswith("_s")}
    | {n for n, v in vars(timing.StepTime).items() if isinstance(v, property)}
    | {f.name for f in dataclasses.fields(hardware.Machine)} - MACHINE_AS_THE_PAPER_STATES_IT)
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
    """The successors' families are ids too, each range within its family: B2–B4, C-I1–C-I3, D7,
    M1–M2."""
    assert claims.ids_in("B2–B4, C-I1–C-I3, D7 and M1–M2") == {"B2", "B3", "B4", "C-I1", "C-I2",
                                                               "C-I3", "D7", "M1", "M2"}
    assert [claims.section_of(c) for c in ("C8", "B2", "C-I8", "D2", "M3")] == [
        "A.2 ZeRO-DP stage formulas", "B. ZeRO-Offload (arXiv:2101.06840)",
        "C. ZeRO-Infinity (arXiv:2104.07857)", "D. ZeRO++ (arXiv:2306.10209)",
        "M. MiCS (arXiv:2205.00119)"]


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


def test_claim_option_makes_the_deselected_tests_snapshots_a_warning():
    """With `--claim`, syrupy reports the snapshots of the tests it left out as unused, which
    fails the run and hints at deleting them (`pytest --claim C9 -m "not deepspeed"` exited 1 with
    every test passed): the plugin makes unused snapshots a warning then, and only then."""
    for given, warned in ((["C9"], True), ([], False)):
        option = SimpleNamespace(warn_unused_snapshots=False)
        config = SimpleNamespace(option=option, getoption=lambda name, default=None: given)
        claims.pytest_configure(config)
        assert option.warn_unused_snapshots is warned


def test_claim_option_refuses_what_is_not_a_claim_id(pytester):
    """`--claim 8` is a usage error naming the value and the accepted families."""
    result = pytester.runpytest("-p", "tests.support.claims", "--claim", "8")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "'8' is not a claim id; accepted: C1–C57, P1–P12, B1–B8" in result.stderr.str()


SOURCES = """
import pytest

@pytest.mark.claim("C41", status="modelled_differs", page="spec/evaluation.md#x")
def test_timed(claim_values):
    claim_values("48.7 TFLOPS/GPU", "over 38")

@pytest.mark.claim("C41", status="closed_form")
def test_arithmetic(claim_values):                  # the paper's arithmetic, recorded last
    claim_values("15.2 PFlops", "over 15 PFlops")

@pytest.mark.claim("C53")
def test_grid():                                     # measures, records nothing
    pass

@pytest.mark.claim("C53", status="closed_form")
def test_counts(claim_values):
    claim_values("[256, 384]", "384 or 256")

@pytest.mark.claim("C43", status="modelled")
def test_scaling(claim_values):
    claim_values("x2.26", "more than doubles")
"""


def test_the_summary_says_where_each_value_came_from(pytester):
    """The claims summary: the status in the same words as spec/README.md ("modelled ≠ paper"),
    and each row's values labelled by the source of the test that recorded them — "computed"
    for a closed form's, though the claim reads measured — taken from a test its verdict rests on
    where one recorded any (C41's modelled values, not its arithmetic recorded after them)."""
    pytester.makepyfile(test_sources=SOURCES)
    result = pytester.runpytest("-p", "tests.support.claims", "-p", "no:xdist", "-p", "no:benchmark",
                                "--claim", "C41", "--claim", "C53", "--claim", "C43")
    rows = {line.split()[0]: " ".join(line.split()) for line in result.outlines
            if re.match(r"  (C41|C43|C53) ", line)}
    assert rows == {
        "C41": "C41 modelled ≠ paper 2 passed 0 failed modelled 48.7 TFLOPS/GPU | paper over 38 "
               "(why: spec/evaluation.md#x)",
        "C43": "C43 modelled = paper 1 passed 0 failed modelled x2.26 | paper more than doubles",
        "C53": "C53 measured = paper 2 passed 0 failed computed [256, 384] | paper 384 or 256"}


def test_the_counts_per_status_in_spec_are_its_rows():
    """spec/README.md's table of claims per status adds up its index's rows, and names every
    status a mark can declare and every "not …" reason the index uses."""
    text = claims.SPEC_INDEX.read_text()
    counts = dict(re.findall(r"^\| ([^|]+?) \| (\d+) \|$", text, re.M))
    tally = Counter(status for status, _ in claims.spec_statuses(text).values())
    assert set(claims.STATUS_TEXT.values()) <= counts.keys()
    assert {s: int(n) for s, n in counts.items()} == {s: tally.get(s, 0) for s in counts}
    assert set(tally) <= counts.keys()


def test_spec_index_reads_status_and_reason_from_every_table():
    """spec/README.md's tables give each claim id, ranges expanded, its status and page or reason."""
    text = ("| claim | what | status | page | test |\n|---|---|---|---|---|\n"
            "| C6–C7 | x | measured = paper | memory.md | t |\n\n"
            "| claim | status | why |\n|---|---|---|\n| C1, C4 | not checkable | definitions |\n")
    assert claims.spec_statuses(text) == {"C6": ("measured = paper", "memory.md"),
                                          "C7": ("measured = paper", "memory.md"),
                                          "C1": ("not checkable", "definitions"),
                                          "C4": ("not checkable", "definitions")}


@pytest.mark.parametrize("statuses,status", [
    ({"closed_form"}, "closed_form"),                           # never reads as measured
    ({"closed_form", "measured"}, "measured"),                  # a closed form does not weaken it
    ({"measured", "differs", "closed_form"}, "differs"),        # one explained gap: ≠
    ({"measured", "modelled"}, "modelled"),                     # one modelled test: modelled
    ({"differs", "modelled"}, "modelled_differs"),              # both weaknesses at once
    ({"closed_form", "modelled_differs"}, "modelled_differs"),  # C41 with the slow cases
    ({"measured", "modelled_differs"}, "modelled_differs")])
def test_a_claims_status_is_the_weakest_source_its_verdict_rests_on(statuses, status):
    """Modelled if any test is modelled, else measured; ≠ if any test differs; closed form only
    when no test measures or models the claim (claims.claim_status)."""
    assert claims.claim_status(statuses) == status


@pytest.mark.parametrize("kwargs,named", [({"status": "ok"}, "status='ok'"),
                                           ({"status": "differs"}, "page=None"),
                                           ({"status": "modelled_differs"}, "page=None"),
                                           ({"page": "spec/scale.md#x"}, "page='spec/scale.md#x'"),
                                           ({"status": "modelled", "page": "spec/scale.md#x"},
                                            "page='spec/scale.md#x'")],
                         ids=["unknown-status", "differs-without-page", "modelled-differs-without-page",
                              "page-without-differs", "page-on-modelled"])
def test_a_claim_mark_the_summary_cannot_report_is_refused(kwargs, named):
    """An unknown status, a ≠ ("differs", "modelled_differs") with no page, or a page on a status
    that takes none: refused at collection, naming the value and what is accepted."""
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


def catalogue_ids(text: str) -> set[str]:
    """The ids docs/claims.md numbers: each item that opens ``- **C5.**`` or ``- **C6. Baseline DP:**``."""
    return set(re.findall(r"^- \*\*((?:C-I|[BCDM])\d{1,2})[.*]", text, re.M))


def test_catalogue_ids_are_read_from_its_numbered_items():
    """An item's opening names its id; an id inside a sentence or a range does not number an item."""
    text = "- **C5.** Plain DP ...\n- **C-I9. DeepSpeed ...** x\n  see C6–C9 and **B7**\n- **D4.** 3x\n"
    assert catalogue_ids(text) == {"C5", "C-I9", "D4"}


def test_every_claim_of_the_catalogue_is_checked_or_listed_with_its_reason():
    """Every id docs/claims.md numbers is in spec/README.md: indexed with its status and page, or
    listed as not checked with a reason — none is left out silently."""
    ids = catalogue_ids((ROOT / "docs" / "claims.md").read_text())
    index = claims.spec_statuses()
    assert len(ids) > 80
    assert sorted(ids - index.keys(), key=claims._key) == []
    assert {c: why for c, (status, why) in index.items() if not why.strip()} == {}


def test_every_claims_status_in_spec_is_the_status_its_tests_declare(request):
    """spec/README.md's status of each claim == what its tests' marks add up to (claim_status)."""
    tested = {c: claims.STATUS_TEXT[claims.claim_status(s)]
              for c, s in declared(whole_claim_suite(request)).items()}
    in_spec = {c: status for c, (status, _) in claims.spec_statuses().items()
               if not status.startswith("not ")}
    assert {c: (in_spec.get(c), tested.get(c)) for c in in_spec.keys() | tested.keys()
            if in_spec.get(c) != tested.get(c)} == {}


def test_a_measurement_that_differs_is_explained_on_its_page(request):
    """Every ≠ mark ("differs", "modelled_differs"), slow ones included, names a spec page and one
    of its headings, and spec/README.md's row for that claim points to the same page and heading."""
    index = claims.spec_statuses()
    pages = {(m.cid, m.page) for it in claims.all_items(request.session)
             for m in claims.claim_marks(it) if m.status in claims.GAPS}
    if not pages:
        pytest.skip("no test declaring a ≠ status was collected")
    for cid, page in sorted(pages):
        path, _, anchor = page.partition("#")
        headings = [line.lstrip("#") for line in (ROOT / path).read_text().splitlines()
                    if line.startswith("#")]
        assert anchor in {slug(h) for h in headings}, f"{cid}: no heading of {path} has anchor #{anchor}"
        assert page.removeprefix("spec/") in index[cid][1], (cid, page, index[cid])


def test_a_test_that_can_only_compute_closed_forms_does_not_declare_a_measurement(request):
    """A claim test whose module imports, from zerospec and tests/, only closed forms and the
    paper's data (zerospec.paper, report.plan) cannot have measured anything: it is closed_form
    (slow tests included)."""
    wrong = []
    for it in claims.all_items(request.session):
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


@functools.lru_cache(maxsize=None)   # every claim test walks much the same functions of zerospec
def code_references(fn) -> tuple[list, set[str]]:
    """What a function's code names, statically: (the objects its global names, ``module.attr``
    pairs, imports inside it and closure cells resolve to; every name it reads, attributes included).
    Decorated functions (lru_cache, runs.memoised) are read through ``__wrapped__``."""
    fn = inspect.unwrap(fn)
    if not inspect.isfunction(fn):
        return [], set()
    objects, names, codes = [], set(), [fn.__code__]
    while codes:
        code = codes.pop()
        codes += [c for c in code.co_consts if inspect.iscode(c)]
        names |= set(code.co_names)
        held, module = None, None          # the object the last instruction loaded; the last import
        for ins in dis.get_instructions(code):
            if ins.opname == "LOAD_GLOBAL" and ins.argval in fn.__globals__:
                held = fn.__globals__[ins.argval]
            elif ins.opname in ("LOAD_ATTR", "LOAD_METHOD") and inspect.ismodule(held):
                held = getattr(held, ins.argval, None)
            elif ins.opname == "IMPORT_NAME":
                module, held = sys.modules.get(ins.argval), None
            elif ins.opname == "IMPORT_FROM" and module is not None:
                held = getattr(module, ins.argval, None)
            else:
                continue
            objects.append(held)
    for cell in fn.__closure__ or ():
        try:
            objects.append(cell.cell_contents)
        except ValueError:                  # an empty cell
            pass
    return objects, names


def reads_the_time_model(item, by_name: bool = True) -> str | None:
    """How a claim test's values come from the spec-sheet time model, or None: the test, its
    module's helpers and its fixtures name a timed step's or a machine's speed by attribute, or
    reach (through zerospec's and the tests' functions, transitively) a function or class of
    zerospec/evaluation/timing.py. Static, so it sees no method of an object a call returns: the
    time model is reached through functions (evaluation.runs), which it follows. ``by_name``
    False: only reaching timing.py counts, not a speed named in the tests' code."""
    fixtures = getattr(item, "_fixtureinfo", None)
    start = [item.obj] + [defs[-1].func for defs in (fixtures.name2fixturedefs.values() if fixtures
                                                    else ()) if defs]
    clean = _CLEAN[by_name]
    todo, seen, walked = list(start), set(), []
    while todo:
        obj = todo.pop()
        if id(obj) in seen or id(obj) in clean:
            continue
        seen.add(id(obj))
        walked.append(obj)
        obj = inspect.unwrap(obj) if inspect.isfunction(obj) or hasattr(obj, "cache_info") else obj
        module = getattr(obj, "__module__", None)
        module = module if isinstance(module, str) else ""
        if module == TIME_MODEL:
            return f"reaches {module}.{getattr(obj, '__qualname__', obj)}"
        if not (inspect.isfunction(obj) and module.startswith(("zerospec", "tests"))):
            continue
        objects, names = code_references(obj)
        if by_name and module.startswith("tests") and names & TIMED_NAMES:
            return f"{obj.__qualname__} reads {', '.join(sorted(names & TIMED_NAMES))}"
        todo += objects
    clean.update(id(o) for o in walked)   # a walk that found nothing saw all each of them reaches
    _HELD.extend(walked)                  # (their ids stay theirs while they are held)
    return None


# What earlier walks of reads_the_time_model showed reach nothing of the time model, per by_name:
# every object a walk visited is clean when the walk ends with None, since the walk saw all it reaches
_CLEAN: dict[bool, set[int]] = {True: set(), False: set()}
_HELD: list = []


def test_a_test_that_reads_the_time_model_is_not_marked_measured(request):
    """A claim test whose values come from the spec-sheet time model (zerospec/evaluation/timing.py,
    a machine's speeds in zerospec/paper/hardware.py) is modelled: "modelled" or "modelled_differs",
    never "measured" or "differs" (slow tests included), so no modelled time reads as measured."""
    wrong = []
    for it in claims.all_items(request.session):
        marks = [m for m in claims.claim_marks(it) if claims.STATUSES[m.status].source == "measured"]
        how = marks and reads_the_time_model(it)
        wrong += [(it.nodeid, m.cid, m.status, how) for m in marks if how]
    assert wrong == []


# Modelled claims whose tests reach no function of timing.py: a spec-sheet speed in a formula of the
# paper's own (checked: exactly these claims' modelled tests stop short of timing.py)
SPEC_SHEET_ONLY = {"C-I5": "C-I5's efficiency of the measured ait at a DGX-2 GPU's PCIe bandwidth "
                           "(hardware.DGX2), through the paper's formula, not a timed step"}


def test_a_modelled_claim_test_reads_the_time_model(request):
    """The converse: a test marked "modelled" or "modelled_differs" reaches the time model
    (zerospec/evaluation/timing.py) — a measurement or a closed form is not called modelled for
    naming one spec-sheet speed — but for the claims of SPEC_SHEET_ONLY, which name it and say why."""
    items = claims.all_items(request.session)
    modelled = [it for it in items if any(claims.STATUSES[m.status].source == "modelled"
                                          for m in claims.claim_marks(it))]
    if not modelled:
        pytest.skip("no test declaring a modelled status was collected")
    assert [it.nodeid for it in modelled if not reads_the_time_model(it)] == []
    short = {m.cid for it in modelled if not reads_the_time_model(it, by_name=False)
             for m in claims.claim_marks(it) if claims.STATUSES[m.status].source == "modelled"}
    assert short == SPEC_SHEET_ONLY.keys() & declared(items).keys()


def test_the_time_model_check_does_not_take_one_speed_for_a_timed_step():
    """A test whose only contact with the machine model is one spec-sheet speed in a comparison
    (C-I6's `dgx2 > pcie`) reads a speed by name but reaches no function of timing.py: the strict
    reading says so; Figure 2's helpers reach it either way."""
    from tests.claims import test_evaluation as ev_tests

    def one_speed():
        return hardware.DGX2.host_bytes_per_s > 3 * 10**9

    timed = SimpleNamespace(obj=ev_tests.test_100b_on_400_gpus_is_timed_above_38_tflops_per_gpu_and_15_pflops)
    assert reads_the_time_model(SimpleNamespace(obj=one_speed))
    assert reads_the_time_model(SimpleNamespace(obj=one_speed), by_name=False) is None
    assert reads_the_time_model(timed, by_name=False)


def test_the_time_model_check_sees_a_timed_test_and_passes_a_measured_one():
    """The static reader finds the time model behind Figure 2's helpers (runs.figure2 → timed →
    step_time), through lru_cache and runs.memoised, and not behind a memory fit or a ledger."""
    from tests.claims import test_evaluation as ev_tests
    item = lambda fn: SimpleNamespace(obj=fn)        # noqa: E731
    assert reads_the_time_model(item(ev_tests.test_100b_on_400_gpus_is_timed_above_38_tflops_per_gpu_and_15_pflops))
    assert reads_the_time_model(item(ev_tests.test_zero_outruns_the_baseline_at_every_size_by_more_as_models_grow))
    assert reads_the_time_model(item(ev_tests.test_170b_at_its_appendix_batch_fits_32_gb_only_with_p_a_cpu)) is None
    assert reads_the_time_model(item(ev_tests.test_each_table3_configuration_runs_the_zero_dp_stage_and_zero_r_options_it_names)) is None
    assert TIMED_NAMES >= {"tflops_per_gpu", "step_s", "comm_s", "peak_flops", "hbm_bytes_per_s"}
    assert not TIMED_NAMES & {"memory_bytes", "gpus_per_node"}


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
    """A claim whose status the slow cases change (one the default run computes in closed form
    only, where the slow cases measure or model it) is in claims.py's RUN_WHEN_SLOW with the
    status all its tests add up to, so the default summary does not pass a "closed form only" off
    as the claim's whole status."""
    items = whole_claim_suite(request)
    fast, full = declared(in_default_run(items)), declared(items)
    weaker = {c: claims.claim_status(full[c]) for c in fast
              if claims.claim_status(fast[c]) != claims.claim_status(full[c])}
    assert weaker == claims.RUN_WHEN_SLOW
    assert {claims.claim_status(fast[c]) for c in weaker} <= {"closed_form"}


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
                           "-o", "addopts=-p no:cacheprovider -p no:anyio", "-q", "--collect-only",
                           "tests/unit/tools/test_benchtable.py"],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
