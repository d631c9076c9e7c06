"""One training step at N = 32 against the compute floor: 32 × (forward + backward + Adam).

The floor is the same model and micro-batch run 32 times in one thread with plain fp32
parameters and torch.optim.Adam — what the ranks' arithmetic costs without ZeRO's bookkeeping.
Target (issue 18): the work-matched ratio ≤ 1.25 for every stage.

Work-matched: the floor holds N Adam passes over Ψ, stage 0's work, but stages 1–3 do one pass in
all (N ranks × Ψ/N elements), so for them the floor less N − 1 Adam passes (an Adam pass timed on
its own in the same run) is the equal-work baseline.

Two floors, both measured in every run. The *replica* floor gives each of the 32 passes its own
parameters and Adam state, as each rank holds its own (stage 0's replicas; stage 3's ranks gather
their own full unit before each use): the same arithmetic over the same bytes the 32 ranks read.
The *shared* floor (issue 18's original) runs all 32 passes on one parameter set, which stays in
cache between passes; no implementation whose ranks hold their own memory reads its parameters
that cheaply (on the 2-core AVX-512 machine the replica floor is 5–7% above the shared one: 232
vs 220 ms, 219 vs 207 ms). The replica floor is the one asserted; the shared floor's work-matched
ratio is recorded and printed beside it (``shared_matched_ratio``).
"""
from __future__ import annotations

import contextlib
import statistics

import pytest
import torch

from zerospec.model import gpt
from zerospec.model.data import BigramData
from zerospec.optim.adam import AdamConfig, reference_optimizer
from zerospec.cluster.threads import torch_threads
from zerospec.training.config import TrainConfig
from zerospec.testing.schedule import barriers
from zerospec.training.run import train

from conftest import best_of

N, STEPS, ROUNDS = 32, 6, 3
TARGET = 1.25   # work-matched, against the replica floor, every stage (issue 18)


def _floor(replicas: int):
    """(step, adam_pass): N passes of forward + backward + Adam over ``replicas`` parameter sets
    (pass r uses set r mod replicas), and the mean time of one Adam pass over one set."""
    cfg = gpt.SMALL
    init = gpt.init_params(cfg, 0)
    sets = [[{n: torch.nn.Parameter(t.clone()) for n, t in ps.items()} for ps in init.values()]
            for _ in range(replicas)]
    opts = [[reference_optimizer(list(p.values()), AdamConfig()) for p in params] for params in sets]
    idx, tgt = BigramData(cfg.vocab_size, cfg.block_size, 0).batch(0, 2)

    def fetcher(params):
        @contextlib.contextmanager
        def fetch(i, last=False):
            yield params[i]
        return fetch
    fetches = [fetcher(params) for params in sets]

    def step():
        for r in range(N):
            loss = gpt.forward(cfg, idx, tgt, fetches[r % replicas])
            loss.backward()
            for o in opts[r % replicas]:
                o.step()
                o.zero_grad(set_to_none=True)

    def adam_pass() -> float:
        """One Adam step over one set's model: N of them, timed together, / N."""
        for f in fetches:
            gpt.forward(cfg, idx, tgt, f).backward()
        seconds = best_of(lambda: [o.step() for r in range(N) for o in opts[r % replicas]], 1)
        for os_ in opts:
            for o in os_:
                o.zero_grad(set_to_none=True)
        return seconds / N
    return step, adam_pass


@pytest.mark.parametrize("stage", range(4))
def test_step_time_at_32_ranks_over_compute_floor(stage, benchmark, capsys):
    """Step time of a 32-rank run / the 32 ranks' work-matched compute floor, per stage."""
    floors = {"replica": _floor(N), "shared": _floor(1)}
    samples: dict[str, list[float]] = {"replica": [], "shared": []}
    adams: dict[str, list[float]] = {"replica": [], "shared": []}
    steps: list[float] = []
    with torch_threads(1):
        for step_fn, _ in floors.values():
            step_fn()                      # warm

    paired: list[float] = []               # per round: its best step / the floor right after it

    def matched(floor: float, adam: float) -> float:
        """The floor less the N − 1 Adam passes stages 1–3 do not do (stage 0 does them all)."""
        return floor - (N - 1) * adam if stage else floor

    def ours():
        res = train(TrainConfig(stage=stage, n_d=N, steps=STEPS))
        # the interior steps: each the whole cycle of 32 forward+backward passes, 32 optimizer
        # steps and the collectives (the first also holds start-up and ranks running ahead into
        # step 2, the last lacks the next step's forward: see Result.step_seconds)
        steps.extend(res.step_seconds[1:-1])
        with torch_threads(1):             # the cluster's setting, for a fair floor
            for _ in range(STEPS - 2):     # as many samples as of ours, at the same time
                for kind, (step_fn, _) in floors.items():
                    samples[kind].append(best_of(step_fn, 1))
            for kind, (_, adam_pass) in floors.items():
                adams[kind].append(adam_pass())
        paired.append(min(res.step_seconds[1:-1])
                      / matched(min(samples["replica"][-(STEPS - 2):]), adams["replica"][-1]))
    benchmark.pedantic(ours, rounds=ROUNDS, iterations=1)
    # best of the samples for both, as everywhere in benchmarks/ (conftest.py): what the machine
    # allows when nothing else gets in the way
    step = min(steps)
    fl = {k: min(v) for k, v in samples.items()}
    work = {k: matched(fl[k], min(adams[k])) for k in fl}
    ratio = step / work["replica"]
    benchmark.extra_info.update(
        step_s=step, floor_s=fl["replica"], matched_floor_s=work["replica"], ratio=ratio,
        plain_ratio=step / fl["replica"], shared_floor_s=fl["shared"],
        shared_matched_ratio=step / work["shared"],
        median_ratio=statistics.median(steps) / statistics.median(samples["replica"]),
        paired_ratios=paired, floor_spread=max(samples["replica"]) / fl["replica"], target=TARGET)
    with capsys.disabled():
        print(f"\nstage {stage}: step {step * 1e3:.0f} ms; replica floor {fl['replica'] * 1e3:.0f} ms "
              f"(work-matched {work['replica'] * 1e3:.0f}): {ratio:.2f} (target ≤ {TARGET}); "
              f"shared floor {fl['shared'] * 1e3:.0f} ms (work-matched "
              f"{work['shared'] * 1e3:.0f}): {step / work['shared']:.2f}; per round, paired "
              f"with the floor right after it: {', '.join(f'{x:.2f}' for x in paired)}; floor "
              f"samples spread {max(samples['replica']) / fl['replica']:.2f}×")
    assert ratio <= TARGET


def test_lockstep_inside_backward_over_the_same_barriers_after_it(benchmark, capsys):
    """Stage 0 at N = 32 with one barrier per unit gradient inside backward / as many after it:
    what running the ranks' backward in lockstep costs the simulator (zerospec/testing/schedule.py).

    A diagnostic, not a target: an estimate of what the simulation adds to stages 2 and 3's step
    (their collectives inside backward cut every rank's backward the same way), and the figure a
    schedule that lets each rank finish its backward first would be judged by."""
    cfg = TrainConfig(stage=0, n_d=N, steps=STEPS)
    steps: dict[str, list[float]] = {w: [] for w in ("backward", "after_backward")}
    rounds = 0

    def ours():
        nonlocal rounds
        order = list(steps) if rounds % 2 == 0 else list(steps)[::-1]   # neither always first
        rounds += 1
        for where in order:
            with barriers(where) as seen:
                res = train(cfg)
            assert seen["issued"] == N * STEPS * len(cfg.units())
            steps[where].extend(res.step_seconds[1:-1])
    benchmark.pedantic(ours, rounds=ROUNDS, iterations=1)
    inside, after = min(steps["backward"]), min(steps["after_backward"])
    ratio = inside / after
    benchmark.extra_info.update(inside_s=inside, after_s=after, ratio=ratio,
                                median_ratio=statistics.median(steps["backward"])
                                / statistics.median(steps["after_backward"]))
    with capsys.disabled():
        print(f"\nlockstep: barriers inside backward {inside * 1e3:.0f} ms, after it "
              f"{after * 1e3:.0f} ms: {ratio:.2f} (medians "
              f"{benchmark.extra_info['median_ratio']:.2f}; diagnostic, no target)")
