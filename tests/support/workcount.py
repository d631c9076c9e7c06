"""The expensive work a test run does, counted, and the default run's count pinned in
tests/work_count.md: a change that adds meta steps, cluster runs or processes to ``pytest`` says so
in its diff (docs/performance.md, "The budget").

Five kinds of work are counted where they start, by wrapping their entry points for the session
(nothing in zerospec changes): a meta step (one :func:`zerospec.training.scale.measure`, seen as
its :class:`~zerospec.comm.meta.MetaBackend`), a meta rank step (one rank class stepped inside it),
a thread-cluster run (:meth:`VirtualCluster.run`), a forked process (a rank process from the
forkserver) and a fresh interpreter (a subprocess, the forkserver, a spawned process), which pays
the import of torch and zerospec again.

Each count is booked to the test file that did the work, unless a cache did it: then to the
innermost cached function on the stack (lru_cache / functools.cache / ``memoised`` functions of
zerospec and of the test modules, and tests/support/runs.py's ``cached``), keyed by its arguments,
or to the session-scoped fixture that was being set up. A cached result is made once per process,
so the xdist worker that happens to ask first pays it; booking it to the cache key, counted once
per key however many workers made it, keeps the count the same however xdist spreads the files.

The pinned count is checked at the end of a full default run (``pytest`` with no paths, marks or
keywords of its own) that passed; ``pytest --work-count-update`` rewrites the file after such a run.
"""
from __future__ import annotations

import collections
import inspect
import json
import pathlib
import re
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PINNED = ROOT / "tests" / "work_count.md"
KINDS = ("meta steps", "meta rank steps", "cluster runs", "forked processes", "fresh interpreters")
DEFAULT_MARKEXPR = "not slow and not deepspeed"
FORKSERVER = "(the forkserver: imports torch and zerospec once per worker that launches ranks)"

_counts: dict = collections.defaultdict(collections.Counter)   # row -> kind -> count
_cached_codes: set = set()
_where = {"file": "(collection)"}
_fixture_stack: list = []


def _key_of(frame) -> str:
    """The innermost cache or session fixture on the stack, else the test file running."""
    while frame is not None:
        code = frame.f_code
        if code in _cached_codes:
            n = code.co_argcount + code.co_kwonlyargcount
            n += bool(code.co_flags & inspect.CO_VARARGS) + bool(code.co_flags & inspect.CO_VARKEYWORDS)
            args = {k: frame.f_locals.get(k) for k in code.co_varnames[:n]}
            if code.co_name == "cached" and "key" in args:
                args = {"key": args["key"]}
            text = re.sub(r" at 0x[0-9a-f]+", "", repr(args))
            where = pathlib.Path(code.co_filename).resolve().relative_to(ROOT).as_posix() \
                if code.co_filename.startswith(str(ROOT)) else code.co_filename
            return f"cache {code.co_qualname} ({where}): {text}"
        frame = frame.f_back
    if _fixture_stack:
        return f"fixture {_fixture_stack[-1]}"
    return _where["file"]


def _book(kind: str, where: str | None = None) -> None:
    _counts[where or _key_of(sys._getframe(2))][kind] += 1


def _counting(cls, name: str, kind, when=None, where: str | None = None) -> None:
    inner = getattr(cls, name)

    def wrapper(self, *args, **kwargs):
        before = when(self) if when else None
        out = inner(self, *args, **kwargs)
        what = kind(self) if callable(kind) else kind
        if what and (when is None or when(self) != before):
            _book(what, where)
        return out
    wrapper.__wrapped__ = inner
    setattr(cls, name, wrapper)


def _count_function(module, name: str, kind: str) -> None:
    inner = getattr(module, name)

    def wrapper(*args, **kwargs):
        _book(kind)
        return inner(*args, **kwargs)
    wrapper.__wrapped__ = inner
    setattr(module, name, wrapper)


def _python(popen) -> str | None:
    """The kind of a subprocess: a fresh interpreter if it runs Python (python, torchrun); None
    (not counted) for another program."""
    argv = [popen.args] if isinstance(popen.args, (str, bytes)) else list(popen.args)
    program = pathlib.Path(str(argv[0]).split()[0]).name if argv else ""
    return "fresh interpreters" if program.startswith(("python", "torchrun")) \
        or str(argv[0]) == sys.executable else None


def install() -> None:
    """Wrap the entry points of the four kinds of work (once per process)."""
    import multiprocessing.forkserver
    import multiprocessing.process
    import subprocess

    from zerospec.cluster.threads import VirtualCluster
    from zerospec.comm.meta import MetaBackend
    from zerospec.training import scale
    if getattr(VirtualCluster.run, "__wrapped__", None):
        return
    _counting(MetaBackend, "__init__", "meta steps")
    _count_function(scale, "_run_rank", "meta rank steps")   # called through the module's globals
    _counting(VirtualCluster, "run", "cluster runs")
    # a fresh interpreter imports torch and zerospec (seconds of CPU); a fork starts with them
    _counting(multiprocessing.process.BaseProcess, "start", lambda process: "fresh interpreters"
              if type(process).__name__ == "SpawnProcess" else "forked processes")
    _counting(subprocess.Popen, "__init__", _python)   # not git's few ms (pytest-benchmark's)
    _counting(multiprocessing.forkserver.ForkServer, "ensure_running", "fresh interpreters",
              when=lambda server: server._forkserver_pid,   # counted when it starts a server,
              where=FORKSERVER)                             # once a run, whichever worker


def _find_cached_codes() -> None:
    """The code of every cached function in zerospec and the test modules (unwrapped)."""
    from tests.support import runs
    _cached_codes.add(runs.cached.__code__)
    for name, module in list(sys.modules.items()):
        if not (name.startswith(("zerospec", "tests", "spec")) or "test_" in name):
            continue
        for value in list(vars(module).values()):
            if callable(value) and hasattr(value, "cache_info") and hasattr(value, "__wrapped__"):
                fn = value
                while hasattr(fn, "__wrapped__"):
                    fn = fn.__wrapped__
                if hasattr(fn, "__code__"):
                    _cached_codes.add(fn.__code__)


# -- hooks --------------------------------------------------------------------------------------
def pytest_addoption(parser):
    parser.addoption("--work-count-update", action="store_true",
                     help="rewrite tests/work_count.md from this run (a full default run)")


def pytest_configure(config):
    if not hasattr(config, "workerinput") and config.pluginmanager.hasplugin("xdist") \
            and config.getoption("numprocesses", None):
        return                                    # the xdist controller runs no test
    if config.option.collectonly:
        return          # no test runs, so nothing to count, and no torch to import for the wrappers
    install()


def pytest_collection_finish(session):
    if not session.config.option.collectonly:
        _find_cached_codes()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item):
    _where["file"] = item.nodeid.split("::")[0]
    yield
    _where["file"] = "(between tests)"


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
    scoped = fixturedef.scope in ("session", "package")
    if scoped:
        param = getattr(request, "param", None)
        _fixture_stack.append(fixturedef.argname + (f"[{param!r}]" if param is not None else ""))
    try:
        yield
    finally:
        if scoped:
            _fixture_stack.pop()


def _rows() -> dict:
    return {row: dict(c) for row, c in _counts.items()}


def pytest_sessionfinish(session):
    if hasattr(session.config, "workerinput"):
        session.config.workeroutput["workcount"] = json.dumps(_rows())


@pytest.hookimpl(optionalhook=True)   # xdist's hook
def pytest_testnodedown(node, error):
    got = json.loads(getattr(node, "workeroutput", {}).get("workcount", "{}"))
    for row, kinds in got.items():
        for kind, n in kinds.items():   # a file runs on one worker; a cache key counts once
            if row.startswith(("cache ", "fixture ", "(")):
                _counts[row][kind] = max(_counts[row][kind], n)
            else:
                _counts[row][kind] += n


def table(rows: dict) -> str:
    """The pinned Markdown: totals, then a row per test file, cache function and fixture."""
    grouped: dict = collections.defaultdict(collections.Counter)
    for row, kinds in rows.items():
        name = re.sub(r":.*", "", row) if row.startswith("cache ") else row
        grouped[name].update(kinds)
        if row.startswith("cache "):
            grouped[name]["keys"] += 1
    total = collections.Counter()
    for kinds in grouped.values():
        total.update({k: v for k, v in kinds.items() if k in KINDS})
    lines = ["| where | " + " | ".join(KINDS) + " |", "|---|" + "---:|" * len(KINDS),
             "| **the default run** | " + " | ".join(str(total[k]) for k in KINDS) + " |"]
    for name in sorted(grouped):
        kinds = grouped[name]
        if not any(kinds[k] for k in KINDS):
            continue
        label = f"{name} ({kinds['keys']} keys)" if kinds["keys"] else name
        lines.append(f"| {label} | " + " | ".join(str(kinds[k]) for k in KINDS) + " |")
    return "\n".join(lines) + "\n"


HEADER = ("# The default run's expensive work\n\n"
          "Counted by tests/support/workcount.py in a full default `pytest` and checked at its end;\n"
          "`pytest --work-count-update` rewrites this file (docs/performance.md, \"The budget\").\n"
          "Counted in a run that skipped {skipped} tests; a run that skips another number (a GPU,\n"
          "torchrun on the PATH) runs other tests and is not checked.\n\n")
SKIPPED = re.compile(r"run that skipped (\d+) tests")


def _full_default_run(config) -> bool:
    return (config.args_source == pytest.Config.ArgsSource.TESTPATHS
            and config.getoption("markexpr") == DEFAULT_MARKEXPR and not config.getoption("keyword")
            and not config.getoption("deselect") and not config.getoption("lf", False)
            and not config.option.collectonly)


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if hasattr(config, "workerinput"):
        return
    skipped = len(terminalreporter.stats.get("skipped", []))
    text = HEADER.format(skipped=skipped) + table(_rows())
    if not _full_default_run(config) or exitstatus != 0:
        if config.getoption("work_count_update"):   # not a full default run that passed: shown only
            terminalreporter.write_sep("=", "work count of this run (not written)")
            terminalreporter.write(table(_rows()))
        return
    if config.getoption("work_count_update"):
        PINNED.write_text(text)
        terminalreporter.write_line(f"work count: wrote {PINNED.relative_to(ROOT)}")
        return
    pinned = PINNED.read_text() if PINNED.exists() else ""
    same_tests = SKIPPED.search(pinned)
    if same_tests and int(same_tests.group(1)) != skipped:
        terminalreporter.write_line(f"work count not checked: {skipped} tests skipped here, "
                                    f"{same_tests.group(1)} where tests/work_count.md was counted")
        return
    if text != pinned:
        old, new = set(pinned.splitlines()), set(text.splitlines())
        terminalreporter.write_sep("=", "work count differs from tests/work_count.md", red=True)
        for line in [f"- {x}" for x in pinned.splitlines() if x not in new] + \
                    [f"+ {x}" for x in text.splitlines() if x not in old]:
            terminalreporter.write_line(line)
        terminalreporter.write_line("if the change is meant: pytest --work-count-update")
        terminalreporter._session.exitstatus = pytest.ExitCode.TESTS_FAILED
