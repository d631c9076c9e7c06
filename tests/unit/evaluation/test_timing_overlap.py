"""The step-time model's backward overlap (zerospec/evaluation/timing.py): communication can hide
behind backward's compute only for as long as that compute runs.

One small meta step (P_os+g, 2 blocks of 64, N_d = 2, no MP) is timed on the DGX-2 with its
NVSwitch slowed to 1 MB/s, so that backward's gradient reduce-scatters take far longer than
backward's compute.
"""
from __future__ import annotations

import dataclasses
import functools

import pytest

from zerospec.evaluation.timing import collective_seconds, step_time
from zerospec.model.presets import gpt
from zerospec.paper.hardware import DGX2
from zerospec.training.scale import measure
from zerospec.training.config import TrainConfig

SLOW_WIRE = dataclasses.replace(DGX2, intra_bytes_per_s=10**6)    # 1 MB/s inside the node


@functools.lru_cache(maxsize=None)
def tiny_step():
    """2 blocks of 64 (2 heads), P_os+g on 2 GPUs of one node, one sequence each, FLOPs counted."""
    return measure(TrainConfig(stage=2, n_d=2, model=gpt(2, 64, 2), count_flops=True),
                   micro_batch=1)


def test_overlap_hides_no_more_communication_than_backward_computes():
    """Backward's DP traffic outlasts backward's compute: the overlap hides exactly the compute's
    seconds, the rest of the traffic is exposed, and the step is forward + optimizer compute +
    all the communication (backward runs entirely under it)."""
    r = tiny_step()
    t = step_time(r, SLOW_WIRE, "backward")
    overlappable = sum(collective_seconds(SLOW_WIRE, x.op, x.group_size, 1, x.bytes_sent)
                       for x in r.comm_ledger([0]).records(0, phase="backward")
                       if x.group in ("dp", "world"))
    assert overlappable > 100 * t.compute_s["backward"] > 0        # the cap is what binds
    assert t.hidden_s == t.compute_s["backward"]
    comm = sum(t.comm_s.values())
    assert t.exposed_comm_s == pytest.approx(comm - t.compute_s["backward"], rel=1e-12)
    assert t.step_s == pytest.approx(t.compute_s["forward"] + t.compute_s["step"] + comm, rel=1e-12)
