"""DeepSpeed's ZeRO-Offload and ZeRO-Infinity as peers: zerospec's offloaded stages 2 and 3 against
DeepSpeed ZeRO-2/3 with ``offload_optimizer: {device: cpu}`` (and ``offload_param``), equal bits.

As in tests/engine/test_deepspeed.py (marked ``deepspeed``, skipped without DeepSpeed): fp32, N = 2,
DeepSpeed driving zerospec's Adam arithmetic as its client optimizer (``zero_force_ds_cpu_optimizer:
false``: DeepSpeedCPUAdam's fused arithmetic would round differently), so only the engines differ:
a two-term sum has one order, and an elementwise Adam on a partition — on the host or not —
equals the whole-vector one. zerospec runs in DeepSpeed's mode (fp32 gradients down; in fp32 the
host keeps the fp32 master copy, as DeepSpeed's offload does).

On DeepSpeed's CPU accelerator device and host are one memory: what is compared is what its
code path copies into its fp32 host gradient buffers and out of its fp32 master partitions per
step (zerospec/testing/deepspeed_host.py), against the bytes zerospec books on its PCIe link.
The NVMe peer needs DeepSpeed's async_io op (libaio; .ci/run installs libaio-dev): it skips,
saying why, where the op cannot build.
"""
from __future__ import annotations

import dataclasses

import pytest

from tests.engine.test_deepspeed import MISSING
from tests.engine.test_peers import assert_equal_every_step
from zerospec.model.gpt import ODD
from zerospec.training.config import TrainConfig

pytestmark = [pytest.mark.deepspeed, pytest.mark.skipif(MISSING is not None, reason=MISSING or "")]

RUN = ("zerospec", "offload")
PARAMS = ("zerospec", "offload_params")
NVME = ("zerospec", "offload_nvme")
STEPS = 3


def cfg(**kw) -> TrainConfig:
    return TrainConfig.of(stage=kw.pop("stage", 2), n_d=2, model=ODD, steps=STEPS, precision="fp32",
                          timeout=600, offload_optimizer=kw.pop("offload_optimizer", "cpu"),
                          offload_mode="deepspeed", **kw)


@pytest.fixture(scope="module")
def offloaded():
    from zerospec.testing.deepspeed_peer import compare
    return compare(cfg(), stages=(2, 3), runs=(RUN,))


@pytest.fixture(scope="module")
def infinity():
    from zerospec.testing.deepspeed_peer import compare
    return compare(cfg(stage=3, offload_params="cpu"), stages=(3,), runs=(PARAMS,))[0]


def share(stage: int) -> int:
    """M: zerospec's share of one rank, padded (every rank's is equal)."""
    return sum(u.chunk for u in cfg(stage=stage).units())


def pcie(records, op: str, step: int) -> int:
    """Bytes zerospec booked on the rank's PCIe link in ``op``'s direction at ``step``."""
    return sum(r.bytes_sent + r.bytes_recv for r in records if r.op == op and r.step == step)


@pytest.mark.parametrize("k", [0, 1], ids=["P_os+g-vs-ZeRO-2-Offload", "P_os+g+p-vs-ZeRO-3-Offload"])
def test_deepspeeds_offload_equals_ours_bit_for_bit(offloaded, k):
    """Every step's loss and every weight after every step: DeepSpeed's ZeRO-Offload and
    zerospec's, stage 2 and stage 3, equal bit for bit."""
    row = offloaded[k]
    assert len(row["losses"]) == STEPS
    assert_equal_every_step(row, row["deepspeed"][RUN])


def test_deepspeeds_parameter_offload_equals_ours_bit_for_bit(infinity):
    """ZeRO-3 with offload_param and offload_optimizer on the CPU (ZeRO-Infinity's host tier):
    every loss and weight equals zerospec's offload_params='cpu' run bit for bit."""
    assert len(infinity["losses"]) == STEPS
    assert_equal_every_step(infinity, infinity["deepspeed"][PARAMS])


@pytest.mark.parametrize("k", [0, 1], ids=["ZeRO-2", "ZeRO-3"])
def test_deepspeed_copies_fp32_gradients_down_as_our_deepspeed_mode_books(offloaded, k):
    """Per step, DeepSpeed writes each real gradient element once into its fp32 host buffers, 4
    bytes each (Σ over ranks: 4Ψ; it skips its partitions' padding), and copies each rank's
    whole fp32 master partition, 4 bytes an element, back out; zerospec's DeepSpeed mode books 4
    bytes per element of its share M each way on PCIe, padding included (Σ: 4Ψ_p), where the
    paper's mode books 2 down (tests/claims/test_offload.py)."""
    row, psi = offloaded[k], sum(u.numel for u in cfg().units())
    host, m = row["deepspeed"][RUN]["host"], share(2 + k)
    for step in range(1, STEPS + 1):
        got = [h[step - 1] for h in host]
        assert sum(g["down"] for g in got) == 4 * psi, step
        assert [g["up"] for g in got] == [4 * g["elements"] for g in got], step
        assert [(pcie(rec, "to_host", step), pcie(rec, "from_host", step))
                for rec in row["records"]] == [(4 * m, 4 * m)] * 2, step
    assert 0 < 2 * m - psi <= len(cfg().units())       # zerospec's padding: under 1 a unit


def test_with_parameter_offload_deepspeed_copies_the_same_gradients_down(infinity):
    """ZeRO-Infinity's host tier changes nothing on the gradient side: each real element once,
    4 bytes, into DeepSpeed's host buffers (4Ψ over the ranks) and 4M per rank booked down by
    zerospec; zerospec books nothing up in param_sync (its fetches go up in forward and
    backward instead)."""
    psi, m = sum(u.numel for u in cfg().units()), share(3)
    host = infinity["deepspeed"][PARAMS]["host"]
    for step in range(1, STEPS + 1):
        assert sum(h[step - 1]["down"] for h in host) == 4 * psi, step
        for records in infinity["records"]:
            assert pcie(records, "to_host", step) == 4 * m
            assert not [r for r in records if r.step == step and r.phase == "param_sync"
                        and r.op == "from_host"]


def _aio() -> str | None:
    """None if DeepSpeed's async_io op can build here, else why not."""
    from zerospec.testing.deepspeed_peer import available
    if available():
        return available()
    from deepspeed.ops.op_builder import AsyncIOBuilder
    if not AsyncIOBuilder().is_compatible(verbose=False):
        return ("DeepSpeed's async_io op is not compatible here (it needs libaio: apt-get install "
                "libaio-dev, as .ci/run does)")
    return None


def test_deepspeeds_nvme_offload_equals_ours_bit_for_bit(tmp_path):
    """ZeRO-3 with offload_optimizer and offload_param on NVMe (DeepSpeed's async_io swap files):
    every loss and weight equals zerospec's NVMe tiers (optimizer and parameters) bit for bit."""
    why = _aio()
    if why:
        pytest.skip(why)
    from zerospec.testing.deepspeed_peer import compare
    ours = cfg(stage=3, offload_optimizer="nvme", offload_params="nvme").replace(nvme_path=str(tmp_path))
    row = compare(ours, stages=(3,), runs=(NVME,))[0]
    assert_equal_every_step(row, row["deepspeed"][NVME])
