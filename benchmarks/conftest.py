"""Benchmarks: speed as ratios against a baseline measured in the same run, never wall-clock asserts.

Run: ``pytest benchmarks`` (the default test run does not collect them). Each benchmark records
``ratio`` (ours / baseline, best of the rounds for both, the two alternating round by round so that
the machine's drift reaches both alike) in ``extra_info``, prints it, and checks it against the
issue's target (``target``, a cap; with ``at_least=True``, a floor to reach, as a throughput
share; tools/benchtable.py renders both). The default ``-n auto`` (pyproject.toml) is turned off here: workers
timing side by side would measure each other, and pytest-benchmark disables itself under xdist.
"""
from __future__ import annotations

import time

import pytest


def pytest_configure(config):
    """No xdist workers for a benchmark run: the default addopts' ``-n auto`` becomes ``-n 0``.
    Runs before xdist's own pytest_configure (trylast), which would start the workers."""
    if config.pluginmanager.hasplugin("xdist") and not hasattr(config, "workerinput"):
        config.option.numprocesses, config.option.dist, config.option.tx = 0, "no", []


@pytest.fixture(autouse=True)
def machine_kind(request):
    """Every benchmark's JSON record says what it ran on: the CPU kernels torch dispatched to
    (AVX512, AVX2, DEFAULT: ATEN_CPU_CAPABILITY changes it), the CPU's model, torch's version,
    the CPU count.
    tools/benchtable.py writes the README's table from these records."""
    yield
    bench = request.node.funcargs.get("benchmark")
    if bench is not None:
        import os

        import torch
        bench.extra_info.update(isa=torch.backends.cpu.get_cpu_capability(), cpu=cpu_model(),
                                torch=torch.__version__.split("+")[0], cpus=os.cpu_count())


def cpu_model() -> str:
    """The CPU's model name as the OS gives it ("AMD EPYC", "Intel(R) Xeon(R) …"): two machines
    that dispatch to the same kernels (AVX2 on a Xeon told to, AVX2 on an EPYC) differ here."""
    import platform

    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def best_of(fn, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


@pytest.fixture
def ratio_to(benchmark, capsys):
    """``ratio_to(ours, baseline, rounds=…)``: benchmark ``ours``, time ``baseline`` alike, → ratio.

    The baseline runs right before each round of ours (pytest-benchmark's untimed ``setup``), so
    the two alternate: the machine's speed moves by 10–50% within minutes here, and all rounds of
    one side before all of the other's set a quiet moment of one against a busy one of the other
    (the op observer's benchmark read 1.07–1.42 over five runs of the same code that way)."""
    def measure(ours, baseline, rounds: int = 5, label: str = "") -> float:
        times: list[float] = []

        def timed_baseline() -> None:
            t0 = time.perf_counter()
            baseline()
            times.append(time.perf_counter() - t0)
        benchmark.pedantic(ours, setup=timed_baseline, rounds=rounds, iterations=1, warmup_rounds=1)
        base = min(times[1:])                       # the first ran before the warm-up round
        ratio = benchmark.stats.stats.min / base
        benchmark.extra_info.update(baseline_s=base, ratio=ratio)
        with capsys.disabled():
            print(f"\n{label or benchmark.name}: ours {benchmark.stats.stats.min * 1e3:.1f} ms, "
                  f"baseline {base * 1e3:.1f} ms, ratio {ratio:.2f}")
        return ratio
    return measure
