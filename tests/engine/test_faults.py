"""A failing rank never hangs the real engine either: every rank fails, naming the one to blame."""
from __future__ import annotations

import time

import pytest

from tests.engine import workers
from tests.support.runs import MODELS
from zerospec.runtime.errors import RankError
from zerospec.cluster.processes import launch
from zerospec.training.config import TrainConfig

# Spawning N processes that each import torch is what every test here waits for: 0.5 s on an idle
# machine, 10 s measured with the first launch of a session on 2 cores at load 9 (xdist plus other
# work). The process group's timeout must be far above that, so that "failed before the timeout"
# means "failed at once", not "started quickly".
STARTUP = 30.0   # allowance for the start-up alone, 3x the worst measured
TIMEOUT = 60.0   # the process group's timeout: no rank may wait longer than this


def _cfg(stage: int, n_d: int) -> TrainConfig:
    return TrainConfig(stage=stage, n_d=n_d, model=MODELS["odd"], steps=3, timeout=TIMEOUT)


def _fail(fn, n_d: int, *args) -> tuple[RankError, float]:
    t0 = time.monotonic()
    with pytest.raises(RankError) as info:
        launch(fn, n_d, *args, timeout=TIMEOUT)
    return info.value, time.monotonic() - t0


def assert_every_rank_blames(err: RankError, bad: int, n_d: int) -> None:
    assert err.rank == bad and err.fates.keys() == set(range(n_d))
    for r, fate in err.fates.items():
        assert fate != "ok"
        if r != bad:   # the survivors' own errors name the rank that failed
            assert f"rank {bad} failed first" in fate, fate


@pytest.mark.parametrize("stage", [pytest.param(0, marks=pytest.mark.slow), 3])   # 3: the most collectives
def test_a_rank_that_raises_fails_every_rank_naming_it(stage):
    """Rank 1 raises after step 1; its peers, waiting in step 2's collectives, fail at once."""
    err, seconds = _fail(workers.raise_at, 4, _cfg(stage, 4), 1, 1)
    assert_every_rank_blames(err, 1, 4)
    assert "injected failure on rank 1" in str(err) and "ValueError" in str(err)
    assert seconds < TIMEOUT


def test_a_killed_process_fails_every_rank_naming_it():
    """Rank 2 is SIGKILLed mid-run: no report of its own; the launcher names it for everyone."""
    err, seconds = _fail(workers.die_at, 4, _cfg(3, 4), 2, 1)
    assert_every_rank_blames(err, 2, 4)
    assert "SIGKILL" in str(err)
    assert seconds < TIMEOUT


@pytest.mark.slow
def test_a_rank_hung_outside_collectives_makes_peers_time_out_and_is_killed():
    """Rank 0 sleeps; its peers give up after the timeout; the launcher kills it and names it."""
    timeout = 5.0
    t0 = time.monotonic()
    with pytest.raises(RankError) as info:
        launch(workers.hang_at, 2, _cfg(2, 2), 0, 1, 600.0, timeout=timeout)
    err = info.value
    assert err.rank == 0 and "killed by the launcher" in str(err)
    assert err.fates[1] != "ok"
    # start-up, the peers' timeout, their wait for a peer's report (5 s), the launcher's grace
    # (2 s): far below the 600 s the hung rank would sleep if nobody killed it
    assert time.monotonic() - t0 < STARTUP + timeout + 5 + 2


def test_bad_launch_arguments_name_the_value_and_what_is_accepted():
    """n_ranks, backend and timeout are checked before any process starts."""
    with pytest.raises(ValueError, match=r"n_ranks must be an integer >= 1, got 0"):
        launch(workers.collectives, 0)
    with pytest.raises(ValueError, match=r"backend must be one of \('gloo', 'nccl'\), got 'mpi'"):
        launch(workers.collectives, 2, backend="mpi")
    with pytest.raises(ValueError, match=r"timeout must be a finite number of seconds > 0, got -1"):
        launch(workers.collectives, 2, timeout=-1)


def test_the_failure_names_the_phase_the_exception_left():
    """Not the outer phase the context is back in by the time the launcher's report is written."""
    err, _ = _fail(workers.raise_in_phase, 2, 1, "grad_sync")
    assert err.rank == 1 and "phase 'grad_sync'" in str(err), str(err)
