"""tools/benchtable.py: the benchmark tables (docs/performance.md's, the README's summary of it) are
written from pytest-benchmark's JSON."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tools"))
import benchtable  # noqa: E402

DATA = {"datetime": "2026-12-01T05:00:00", "benchmarks": [
    {"name": "test_step[0]", "param": "0",
     "extra_info": {"ratio": 1.234, "plain_ratio": 1.1, "shared_matched_ratio": 1.3,
                    "mixed_matched_ratio": 1.2, "target": 1.3,
                    "isa": "AVX2", "cpus": 2, "torch": "2.13.0"}},
    {"name": "test_meta", "param": None,
     "extra_info": {"seconds": 4.44, "target": 30.0, "isa": "AVX512", "cpus": 2, "torch": "2.13.0"}}]}


@pytest.fixture
def page(tmp_path, monkeypatch):
    """A performance page whose table block holds "old" and a README whose summary block holds
    "old", in place of the project's; returns the page's path."""
    path, readme = tmp_path / "performance.md", tmp_path / "README.md"
    path.write_text("intro\n<!-- benchmarks: begin -->\nold\n<!-- benchmarks: end -->\nrest\n")
    readme.write_text("<!-- benchmarks-summary: begin -->\nold\n<!-- benchmarks-summary: end -->\n")
    monkeypatch.setattr(benchtable, "PAGE", path)
    monkeypatch.setattr(benchtable, "README", readme)
    return path


def write_json(path: Path, data: dict) -> Path:
    path.write_text(json.dumps(data))
    return path


def table_rows(page: Path) -> list[str]:
    """The benchmark rows of the page's table (no header, no separator)."""
    return [r for r in page.read_text().splitlines() if r.startswith("| `")]


def test_each_row_shows_its_figure_target_and_machine():
    rows = benchtable.rows(DATA)
    assert rows[2] == ("| `test_step` | 0 | ratio | 1.23 (step/floor 1.10; shared floor 1.30; mixed-precision "
                       "floor 1.20) | ≤ 1.30 | yes "
                       "| AVX2, 2 CPUs, torch 2.13.0, 2026-12-01 |")
    assert rows[3] == ("| `test_meta` |  | seconds | 4.4 s | ≤ 30.0 s | yes "
                       "| AVX512, 2 CPUs, torch 2.13.0, 2026-12-01 |")


def test_a_missed_target_is_shown_as_missed():
    data = {"benchmarks": [{"name": "t", "extra_info": {"ratio": 1.33, "target": 1.3}}]}
    assert "| **no** |" in benchtable.rows(data)[2]


def test_a_benchmark_without_a_figure_is_refused_by_name():
    bad = {"benchmarks": [{"name": "test_x", "extra_info": {}}]}
    with pytest.raises(ValueError, match="test_x records neither 'ratio' nor 'seconds'"):
        benchtable.rows(bad)


def test_the_tables_are_rewritten_between_their_markers(tmp_path, page):
    path = write_json(tmp_path / "b.json", DATA)
    assert benchtable.main([str(path), "--check"]) == 1
    assert benchtable.main([str(path)]) == 0 and benchtable.main([str(path), "--check"]) == 0
    text = page.read_text()
    assert text.startswith("intro\n<!-- benchmarks: begin -->\n| benchmark |") and text.endswith("<!-- benchmarks: end -->\nrest\n")
    assert benchtable.README.read_text() == ("<!-- benchmarks-summary: begin -->\n"
                                             + benchtable.summary(benchtable.table([DATA]))
                                             + "<!-- benchmarks-summary: end -->\n")


def test_the_summary_counts_the_latest_runs_targets_met_and_names_each_missed_case():
    """The first row's machine is the latest run: benchmarks with a target are counted, one that
    missed gets a line with its missed cases' figures and the target; another machine's rows are left out."""
    latest = {"datetime": "2026-12-05T05:00:00", "benchmarks": [
        {"name": "test_step[0]", "param": "0", "extra_info": {"ratio": 1.1, "target": 1.25, "plain_ratio": 1.0}},
        {"name": "test_step[3]", "param": "3", "extra_info": {"ratio": 1.4, "target": 1.25}},
        {"name": "test_lockstep", "extra_info": {"ratio": 1.0}}]}
    text = benchtable.summary(benchtable.table([latest, DATA]))
    assert text.splitlines() == [
        "On ?, ? CPUs, torch ?, 2026-12-05: 0 of 1 benchmarks with a target met it (1 more only "
        "measure); not met:", "",
        "- `test_step`: 3: 1.40 (target ≤ 1.25)"]
    met = {"datetime": "2026-12-05T05:00:00", "benchmarks": latest["benchmarks"][:1]}
    assert benchtable.summary(benchtable.table([met])).splitlines() == [
        "On ?, ? CPUs, torch ?, 2026-12-05: 1 of 1 benchmarks with a target met it (0 more only "
        "measure)."]


def test_runs_on_several_machines_share_one_table_each_row_naming_its_own():
    avx2 = {"datetime": "2026-12-02T05:00:00", "benchmarks": [
        {"name": "test_meta", "extra_info": {"seconds": 5.0, "target": 30.0, "isa": "AVX2",
                                             "cpus": 2, "torch": "2.13.0"}}]}
    lines = benchtable.table([DATA, avx2]).splitlines()
    assert lines[0].startswith("| benchmark |") and sum(ln.startswith("| benchmark") for ln in lines) == 1
    assert len(lines) == 2 + 2 + 1
    assert lines[-1].endswith("| AVX2, 2 CPUs, torch 2.13.0, 2026-12-02 |")
    assert lines[3].endswith("| AVX512, 2 CPUs, torch 2.13.0, 2026-12-01 |")


def test_a_row_names_the_cpu_model_when_the_run_recorded_it():
    data = {"datetime": "2026-12-04T10:00:00", "benchmarks": [
        {"name": "t", "extra_info": {"ratio": 1.0, "cpu": "AMD EPYC", "isa": "AVX2", "cpus": 2,
                                     "torch": "2.13.0"}}]}
    assert benchtable.rows(data)[2].endswith("| AMD EPYC, AVX2, 2 CPUs, torch 2.13.0, 2026-12-04 |")


def test_keep_adds_a_run_and_keeps_only_the_other_machines_rows(tmp_path, page):
    first = write_json(tmp_path / "a.json", DATA)          # AVX2 and AVX512 rows, 2026-12-01
    epyc = {"datetime": "2026-12-04T10:00:00", "benchmarks": [
        {"name": "test_meta", "extra_info": {"seconds": 3.0, "target": 30.0, "cpu": "AMD EPYC",
                                             "isa": "AVX2", "cpus": 2, "torch": "2.13.0"}}]}
    second = write_json(tmp_path / "b.json", epyc)
    assert benchtable.main([str(first)]) == 0
    assert benchtable.main([str(second), "--keep"]) == 0
    assert [benchtable.machine_of(r) for r in table_rows(page)] == [
        "AMD EPYC, AVX2, 2 CPUs, torch 2.13.0, 2026-12-04",
        "AVX2, 2 CPUs, torch 2.13.0, 2026-12-01", "AVX512, 2 CPUs, torch 2.13.0, 2026-12-01"]
    assert benchtable.main([str(second), "--keep"]) == 0     # the same run again: no duplicate
    assert len(table_rows(page)) == 3
    assert benchtable.main([str(second), "--keep", "--check"]) == 0
    epyc["datetime"] = "2026-12-05T10:00:00"                # the same machine a day later
    write_json(second, epyc)
    assert benchtable.main([str(second), "--keep"]) == 0
    days = [benchtable.machine_of(r)[-10:] for r in table_rows(page)]
    assert days == ["2026-12-05", "2026-12-01", "2026-12-01"]


def test_a_mistyped_option_is_refused_and_the_table_left_alone(tmp_path, page, capsys):
    path = write_json(tmp_path / "b.json", DATA)
    assert benchtable.main([str(path), "--kep"]) == 2
    assert "unknown option '--kep'; accepted: --keep, --check" in capsys.readouterr().err
    assert "\nold\n" in page.read_text()


def test_a_target_to_reach_reads_at_least_and_is_met_from_above():
    """A benchmark that records ``at_least`` (a share of a plain file's throughput) meets its
    target at or above it, and the table says ≥."""
    data = {"datetime": "2026-12-05T05:00:00", "benchmarks": [
        {"name": "test_io", "extra_info": {"ratio": 1.02, "target": 0.5, "at_least": True}},
        {"name": "test_slow_io", "extra_info": {"ratio": 0.4, "target": 0.5, "at_least": True}}]}
    io, slow = benchtable.rows(data)[2:]
    assert "| ≥ 0.50 | yes |" in io and "| ≥ 0.50 | **no** |" in slow
