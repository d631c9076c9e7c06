"""Speed of the real engine: zerospec stage k on 4 gloo processes vs torch's own peer (issue 6).

Target (issue 18): each stage's step time ≤ 1.0× its peer's (DDP, ZeroRedundancyOptimizer,
FSDP2 without and with resharding; issue 6's ≤ 1.5× is no longer the one asserted), same model
(small GPT), data and fp32 Adam (zerospec's own arithmetic against the peer's torch.optim.Adam).

Paired step by step (zerospec/testing/paired.py): every rank runs zerospec's step s, then the
peer's step s, then zerospec's step s + 1 …, in the same 4 processes, so each pair is timed within
a tenth of a second. Timed one side after the other instead, a round's ratio read anywhere from
0.71 to 1.42 for stage 0 (2026-12-03 to 05): the machine's drift between the two halves. The
figure is the sum of every rank's step times over the sum of its peer's, steps 3…STEPS (step 1
pays set-up and FSDP2's lazy init, step 2 DDP's bucket rebuild) of ROUNDS launches. Beside it,
the same ratio of the processes' CPU time (``cpu_ratio``, a diagnostic: 4 processes share 2
cores, so a step's wall time also holds the time its rank waited for a core). Run:

    pytest -o addopts="" benchmarks/test_engine_bench.py
"""
from __future__ import annotations

import pytest

from zerospec.model.gpt import SMALL
from zerospec.testing.oracles import PEERS
from zerospec.testing.paired import paired
from zerospec.training.config import TrainConfig
from zerospec.training.sections import OptimOptions

N, STEPS, TARGET, ROUNDS = 4, 12, 1.0, 3
SKIP = 2     # steps left out of every run: set-up, lazy init and DDP's bucket rebuild


def _sums(ranks, key: str) -> float:
    return sum(sum(r[key][SKIP:]) for r in ranks)


@pytest.mark.parametrize("stage", [0, 1, 2, 3], ids=lambda s: f"stage{s}-vs-{PEERS[s]}")
def test_stage_step_time_vs_its_peer(benchmark, capsys, stage):
    cfg = TrainConfig(stage=stage, n_d=N, model=SMALL, steps=STEPS, timeout=120,
                      optim=OptimOptions(precision="fp32"))
    rounds: list[list[dict]] = []               # per round, every rank's step times

    benchmark.pedantic(lambda: rounds.append(paired(cfg)), rounds=ROUNDS, iterations=1)
    ours, peer = (sum(_sums(r, k) for r in rounds) for k in ("ours", "peer"))
    cpu = sum(_sums(r, "ours_cpu") for r in rounds) / sum(_sums(r, "peer_cpu") for r in rounds)
    ratio, steps = ours / peer, ROUNDS * N * (STEPS - SKIP)
    per_round = [_sums(r, "ours") / _sums(r, "peer") for r in rounds]
    benchmark.extra_info.update(ours_s=ours / steps, peer_s=peer / steps, ratio=ratio,
                                cpu_ratio=cpu, peer=PEERS[stage], target=TARGET,
                                round_ratios=per_round)
    with capsys.disabled():
        print(f"\nstage {stage} vs {PEERS[stage]}: ours {ours / steps * 1e3:.1f} ms/step, "
              f"peer {peer / steps * 1e3:.1f} ms/step, ratio {ratio:.2f} ({ROUNDS} rounds of "
              f"{STEPS - SKIP} paired steps on {N} ranks; per round: "
              f"{', '.join(f'{x:.2f}' for x in per_round)}); CPU time: {cpu:.2f}")
    assert ratio <= TARGET
