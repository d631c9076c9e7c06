"""Speed of the main job, ``python -m zerospec report`` at its default size (32 virtual GPUs, five
variants, 3 steps), as a new user runs it: a fresh process, tables and figures written.

Target (issue 18): ≤ 20 s of measuring (the report's own ``measure_seconds``: the trainings, the
FLOP-counting meta steps, the memory sweep, ZeRO-R's options and C30's traces for the
fragmentation figure, the meta steps in a helper process on a second CPU when there is one). The
whole command, imports and figures included, is recorded beside it. Run:

    pytest -o addopts="" benchmarks/test_report_bench.py
"""
from __future__ import annotations

import json
import subprocess
import sys
import time

MEASURING = 20.0


def test_report_at_its_default_size(benchmark, capsys, tmp_path):
    argv = [sys.executable, "-m", "zerospec", "report", "--format", "json", "--quiet",
            "--out", str(tmp_path)]
    t0 = time.perf_counter()
    proc = benchmark.pedantic(subprocess.run, args=(argv,), rounds=1, iterations=1,
                              kwargs=dict(capture_output=True, text=True))
    whole = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stderr
    measuring = json.loads(proc.stdout)["meta"]["measure_seconds"]
    figures = sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".png")
    benchmark.extra_info.update(seconds=measuring, target=MEASURING, whole_seconds=whole,
                                figures=len(figures))
    with capsys.disabled():
        print(f"\nzerospec report at its default size: {measuring:.1f} s of measuring "
              f"(target {MEASURING:g} s), {whole:.1f} s in all with {len(figures)} figures")
    assert len(figures) == 5
    assert measuring <= MEASURING, \
        f"measuring took {measuring:.1f} s; the target is {MEASURING:g} s"
