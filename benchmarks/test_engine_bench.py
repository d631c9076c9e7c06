"""Speed of the real engine: zerospec stage k on 4 gloo processes vs torch's own peer (issue 6).

Target (issue 18): each stage's step time ≤ 1.0× its peer's (DDP, ZeroRedundancyOptimizer,
FSDP2 without and with resharding; issue 6's ≤ 1.5× is no longer the one asserted), same model
(small GPT), data, fp32 and torch.optim-style Adam on both sides. Both run in the same 4
processes, one after the other, so they share every condition of the machine; a round's step
time is the median over steps 3…STEPS on rank 0 (step 1 pays set-up and FSDP2's lazy init, step 2
DDP's bucket rebuild). ROUNDS rounds alternate which side runs first, and each side's figure is its
best round, as ``ratio_to`` does: one round's ratio, either order, read anywhere from 0.80 to 1.37
for stage 0 on one machine in six rounds (2026-12-03), the machine's drift between the two halves of
a round. Run:

    pytest -o addopts="" benchmarks/test_engine_bench.py
"""
from __future__ import annotations

import statistics

import pytest

from zerospec.model.gpt import SMALL
from zerospec.testing.oracles import PEERS, compare
from zerospec.training.config import TrainConfig

N, STEPS, TARGET, ROUNDS = 4, 10, 1.0, 4


@pytest.mark.parametrize("stage", [0, 1, 2, 3], ids=lambda s: f"stage{s}-vs-{PEERS[s]}")
def test_stage_step_time_vs_its_peer(benchmark, capsys, stage):
    cfg = TrainConfig(stage=stage, n_d=N, model=SMALL, steps=STEPS, precision="fp32", timeout=120)
    rounds: list[tuple[float, float]] = []       # (ours, peer) median step per round

    def one_round():
        row = compare(cfg, (stage,), count=False, weights=False, peer_first=len(rounds) % 2 == 1)[0]
        rounds.append((statistics.median(row["seconds"][2:]),
                       statistics.median(row["peers"]["torch"]["seconds"][2:])))
    benchmark.pedantic(one_round, rounds=ROUNDS, iterations=1)
    ours, peer = min(o for o, _ in rounds), min(p for _, p in rounds)
    ratio = ours / peer
    benchmark.extra_info.update(ours_s=ours, peer_s=peer, ratio=ratio, peer=PEERS[stage], target=TARGET,
                                round_ratios=[o / p for o, p in rounds])
    with capsys.disabled():
        print(f"\nstage {stage} vs {PEERS[stage]}: ours {ours * 1e3:.1f} ms/step, "
              f"peer {peer * 1e3:.1f} ms/step, ratio {ratio:.2f} (best of {ROUNDS} rounds, "
              f"alternately ours or the peer first; per round: "
              f"{', '.join(f'{o / p:.2f}' for o, p in rounds)})")
    assert ratio <= TARGET
