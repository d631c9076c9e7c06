"""zerospec/evaluation/runs.py: a paper-scale step is measured once, however it is asked for."""
from __future__ import annotations

from zerospec.paper import evaluation as ev
from zerospec.evaluation import runs as pr


def test_a_rows_step_is_measured_once_whichever_way_it_is_called(monkeypatch):
    """step(r), step(r, "zero"), step(r, "zero", None) and step(r, how="zero") are one step (each
    is a paper-scale meta step of seconds); "baseline" is another."""
    calls = []
    monkeypatch.setattr(pr, "measure", lambda *a, **k: calls.append(k.get("n_m")) or len(calls))
    run = ev.FIGURE4[0]
    pr.step.cache_clear()
    try:
        assert {pr.step(run), pr.step(run, "zero"), pr.step(run, "zero", None),
                pr.step(run, how="zero"), pr.step(run, config=None)} == {1}
        assert pr.step(run, "baseline") == pr.step(run, how="baseline") == 2
        assert len(calls) == 2
    finally:
        pr.step.cache_clear()   # the stub's answers must not outlive the test
