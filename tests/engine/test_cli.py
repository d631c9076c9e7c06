"""``zerospec train``: the same config on the simulator and on real processes prints the same table."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from zerospec.__main__ import main

ARGS = ["train", "--stage", "3", "--ranks", "2", "--steps", "2", "--model", "odd"]


def _rows(text: str) -> list[list[str]]:
    """Table rows (step, loss, collectives, elements, wire) of ``zerospec train``'s output."""
    return [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()
            if line.startswith("| ") and line[2].isdigit()]


def test_sim_and_local_processes_print_the_same_losses_and_traffic(capsys):
    """Losses and ledger columns agree; only the wire column shows gloo's reduce-scatter cost."""
    assert main([*ARGS, "--backend", "sim"]) == 0
    sim = _rows(capsys.readouterr().out)
    assert main([*ARGS, "--backend", "torch"]) == 0
    gloo = _rows(capsys.readouterr().out)
    assert len(sim) == len(gloo) == 2
    for s, g in zip(sim, gloo):
        assert s[:4] == g[:4]                        # step, loss, collectives, elements
        assert int(g[4].replace(",", "")) > int(s[4].replace(",", ""))   # RS: 2× on gloo's wire


@pytest.mark.parametrize("bad,message", [
    (["--steps", "0"], "--steps must be >= 1, got 0"),
    (["--ranks", "0"], "--ranks must be >= 1, got 0"),
    (["--backend", "mpi"], "invalid choice: 'mpi'"),
    (["--loss-scale", "0"], "--loss-scale: expected a finite number > 0, got '0'"),
    (["--clip-grad-norm", "inf"], "--clip-grad-norm: expected a finite number > 0, got 'inf'"),
    (["--grad-accum", "0"], "--grad-accum: expected an integer >= 1, got '0'"),
    (["--precision", "bf16", "--grad-accum", "2"], "need precision='fp16', got 'bf16'"),
])
def test_bad_arguments_are_one_line_errors(capsys, bad, message):
    """Exit code 2 and a message naming the bad value."""
    assert main(["train", *bad]) == 2
    assert message in capsys.readouterr().err


def test_robustness_flags_reach_the_run_and_its_table(capsys):
    """--loss-scale/--clip-grad-norm/--grad-accum give train()'s run, with their columns."""
    from zerospec.optim.loss_scale import LossScale
    from zerospec.model.gpt import ODD
    from zerospec.training.config import TrainConfig
    from zerospec.training.sections import BatchOptions, OptimOptions
    from zerospec.training.run import train
    assert main([*ARGS, "--loss-scale", "1024", "--clip-grad-norm", "0.01", "--grad-accum", "2"]) == 0
    out = capsys.readouterr().out
    assert "2 micro-batches per step" in out and "| loss scale | skipped | grad norm |" in out
    res = train(TrainConfig(stage=3, n_d=2, steps=2, model=ODD,
                            optim=OptimOptions(loss_scale=LossScale(1024.0), clip_grad_norm=0.01),
                            batching=BatchOptions(grad_accum_steps=2)))
    assert [r[1] for r in _rows(out)] == [f"{x:.6f}" for x in res.losses]
    assert [r[5:] for r in _rows(out)] == [["1024", "no", f"{n:.6g}"] for n in res.grad_norms]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun not on PATH")
def test_torchrun_runs_the_same_training(capsys):
    """`torchrun --nproc-per-node 2 -m zerospec train --backend torch` prints the sim's table."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(["torchrun", "--nproc-per-node", "2", "-m", "zerospec", *ARGS[:3],
                           *ARGS[5:], "--backend", "torch"], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "torchrun" in done.stdout
    assert main([*ARGS, "--backend", "sim"]) == 0
    sim = _rows(capsys.readouterr().out)
    assert [r[:4] for r in _rows(done.stdout)] == [r[:4] for r in sim]
