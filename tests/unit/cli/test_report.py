"""``zerospec report`` through the real entry point: JSON with figures, progress output, and bad
input. Small runs: 2 virtual GPUs, 1 step. Its pinned Markdown and its CSV, which check claims:
tests/claims/test_memory_report.py."""
from __future__ import annotations

import json

import pytest

from tests.support.cli import assert_usage_error, run_cli
from tests.support.report import SMALL_RUN, measured_calls


def test_report_json_and_figures(capsys, tmp_path, monkeypatch):
    """`--format json --out DIR`: parseable tables, report.json, and every figure the report
    draws as PNG and SVG, each a real picture (at least 600×400 pixels, not blank); C30's traces
    for the fragmentation figure measured with the rest."""
    from matplotlib.image import imread
    seen = measured_calls(monkeypatch)
    rc, out, err = run_cli(capsys, *SMALL_RUN, "--stages", "0,3", "--format", "json", "--out", str(tmp_path))
    assert rc == 0
    assert [(k["c30"], sorted(m.c30)) for k, m in seen] == [(True, [False, True])]
    doc = json.loads(out)
    assert [t["name"] for t in doc["tables"]][:2] == ["memory", "comm"]
    assert doc["meta"]["ranks"] == 2 and doc["meta"]["psi"] == 536_064
    assert json.loads((tmp_path / "report.json").read_text()) == doc
    names = ["memory_per_stage", "comm_per_stage", "memory_vs_n", "timeline", "fragmentation"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["report.json"] + [f"{n}.{ext}" for n in names for ext in ("png", "svg")])
    for name in names:
        assert (tmp_path / f"{name}.svg").read_text().lstrip().startswith("<?xml")
        img = imread(tmp_path / f"{name}.png")
        h, w = img.shape[:2]
        assert w >= 600 and h >= 400, (name, w, h)
        rgb = img[..., :3]
        non_white = (rgb < 0.95).any(axis=-1).mean()
        assert non_white > 0.02, f"{name}.png looks blank ({non_white:.1%} non-white pixels)"
    # stderr is not a terminal here: a summary line, no progress bar redraws
    assert "zerospec: measured 2 runs on 2 virtual GPUs" in err and "\r" not in err


@pytest.mark.parametrize("argv,named", [
    (["report", "--ranks", "0"], "'0'"),
    (["report", "--steps", "-1"], "'-1'"),
    (["report", "--stages", "0,9"], "'9'"),
    (["report", "--tables", "speed"], "'speed'"),
    (["report", "--embd", "130"], "--embd 130 must be divisible by --heads 4"),
    (["report", "--heads", "3"], "--embd 128 must be divisible by --heads 3"),
    (["report", "--format", "xml"], "'xml'"),
    (["report", "--gpu-mem", "lots"], "'lots'"),
])
def test_bad_report_input_is_one_line_and_exit_code_2(capsys, argv, named):
    """Bad input fails before any training: exit 2, one stderr line naming the value."""
    assert_usage_error(capsys, *argv, "--no-figures", "--quiet", named=named)


def test_an_unwritable_out_directory_fails_before_measuring(capsys, tmp_path, monkeypatch):
    """--out that cannot be created: exit 2 with one line, and no training was started."""
    import zerospec.report.measure
    monkeypatch.setattr(zerospec.report.measure, "measure", lambda *a, **k: pytest.fail("measured before --out"))
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    rc, out, err = run_cli(capsys, *SMALL_RUN, "--quiet", "--out", str(blocker / "sub"))
    assert rc == 2 and out == "" and err.count("\n") == 1
    assert err.startswith(f"zerospec: error: --out {blocker / 'sub'}: cannot create that directory")
