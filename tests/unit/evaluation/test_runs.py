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


def test_the_same_step_printed_in_two_tables_is_measured_once(monkeypatch):
    """Figure 8's 170B row and Figure 2's 170B ZeRO row are one step (400 GPUs, MP 16, 212 × 8192,
    12 per GPU), printed from two appendix tables: asked for with C5 from either, it is measured
    once; a row of another shape is measured apart."""
    calls = []
    monkeypatch.setattr(pr, "measure", lambda *a, **k: calls.append(k) or len(calls))
    fig8 = next(r for r in ev.FIGURE8 if r.size == "170B")
    fig2 = next(r for r in ev.FIGURE2 if (r.size, r.who) == ("170B", "ZeRO"))
    assert fig8 != fig2 and fig8.source != fig2.source
    pr.step.cache_clear()
    try:
        assert pr.step(fig8, config="C5") == pr.step(fig2, config="C5") == 1
        assert pr.step(ev.FIGURE8[0], config="C5") == 2 and len(calls) == 2
    finally:
        pr.step.cache_clear()


def test_a_rows_peak_steps_the_classes_past_rank_0s_uncounted_once_and_only_when_read(monkeypatch):
    """Timing a row steps rank 0's class alone, FLOPs counted; its peak, when first read, steps
    each other class alone without counting (the class counted is 0, not it) and is the highest
    of all classes' peaks, here the second class's; read again, nothing is stepped."""
    from types import SimpleNamespace as NS
    calls, peaks = [], [5, 9, 7]

    def stub(cfg, *, micro_batch, count_in, only):
        calls.append((cfg.count_flops, count_in, only))
        return NS(class_count=3, classes=[NS(memory=NS(peak_total=peaks[only]))])
    monkeypatch.setattr(pr, "measure", stub)
    monkeypatch.setattr(pr, "step_time", lambda r, machine, *a, **kw: r)
    run = ev.FIGURE3[0]
    for memo in (pr.step, pr.timed, pr._peak):
        memo.cache_clear()
    try:
        t = pr.timed(run, config="C4")
        assert calls == [(True, 0, 0)]
        assert (t.peak, t.peak, t.fits) == (9, 9, True)
        assert calls == [(True, 0, 0), (True, 0, 1), (True, 0, 2)]
    finally:
        for memo in (pr.step, pr.timed, pr._peak):
            memo.cache_clear()
