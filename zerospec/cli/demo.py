"""``zerospec demo``: one short run of every stage on a small cluster, as a table."""
from __future__ import annotations


HELP = "train every ZeRO stage briefly and print memory and traffic"


def add_parser(sub) -> None:
    p = sub.add_parser("demo", help=HELP)
    p.add_argument("--ranks", type=int, default=8, help="virtual GPUs (N_d), default 8")
    p.add_argument("--steps", type=int, default=2, help="training steps, default 2")


def run(args) -> int:
    from ..training.config import TrainConfig
    from ..training.run import train
    configs = [TrainConfig(stage=stage, n_d=args.ranks, steps=args.steps) for stage in range(4)]
    print("| stage | model states /GPU (B) | comm /step /GPU (elements) | collectives /step | loss |")
    print("|---|---|---|---|---|")
    for cfg in configs:
        r = train(cfg)
        s = args.steps
        print(f"| {r.config.label} | {r.model_states(0):,} | {r.comm.elements(0, step=s):,} | "
              f"{r.comm.count(0, step=s)} | {r.losses[-1]:.6f} |")
    return 0
