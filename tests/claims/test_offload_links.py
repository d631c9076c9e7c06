"""Bytes per tier and per link (zerospec/plan/offload.py; spec/offload.md's figure): what an
offloaded step holds on the device, the host and NVMe, and what it moves per link and direction,
read from the ledgers — on threads and on meta tensors alike, and as the figure draws it."""
from __future__ import annotations

import functools

import pytest

from zerospec.model.gpt import ODD
from zerospec.plan import offload as O
from zerospec.training.config import TrainConfig
from zerospec.training.run import train
from zerospec.training.scale import measure

N = 4
RUNS = {"paper": {"offload_optimizer": "cpu"},
        "deepspeed": {"offload_optimizer": "cpu", "offload_mode": "deepspeed"},
        "nvme": {"offload_optimizer": "nvme"},
        "params": {"offload_optimizer": "cpu", "offload_params": "cpu"},
        "params_nvme": {"offload_optimizer": "cpu", "offload_params": "nvme"}}
# bytes per element of the rank's share M per step: (down, up) over PCIe, (write, read) NVMe
EXPECTED = {"paper": (2, 2, 0, 0), "deepspeed": (4, 2, 0, 0), "nvme": (2, 2, 12, 12),
            "params": (2, 4, 0, 0),    # Infinity: each unit fetched up in forward and backward
            "params_nvme": (2, 4, 2, 4)}   # ... read from NVMe each time, the update written back


@functools.lru_cache(maxsize=None)
def threads(stage: int, name: str):
    return train(TrainConfig.of(stage=stage, n_d=N, model=ODD, steps=2, global_batch=N,
                                **RUNS[name]))


@pytest.mark.parametrize("name", [pytest.param(n, marks=[pytest.mark.slow] if "nvme" in n else [])
                                  for n in RUNS])   # nvme: fsync-ed files, over a second
@pytest.mark.claim("B5")
def test_bytes_per_link_and_direction_per_step(name):
    """Rank 0 at step 2 (ODD, N = 4, stage 3): PCIe down and up, NVMe write and read, in bytes
    per element of its share M, as B5 (paper: 2 + 2), DeepSpeed's mode (4 + 2), the NVMe tier
    (12 each way) and parameter offload (2 fetches up per step) say; the same on meta."""
    r = threads(3, name)
    ob = O.offload_bytes(r, 0, step=2)
    m = ob.share
    assert m == sum(u.chunk for u in r.units)
    got = tuple(ob.moved[op] for op in ("to_host", "from_host", "to_nvme", "from_nvme"))
    assert got == tuple(k * m for k in EXPECTED[name])
    assert ob.moved["to_host"] == r.comm.bytes(0, step=2, op="to_host")    # the ledger's sends
    meta = O.offload_bytes(measure(TrainConfig.of(stage=3, n_d=N, model=ODD, **RUNS[name])))
    assert (meta.moved, meta.device_states, meta.host_states, meta.nvme) == \
        (ob.moved, ob.device_states, ob.host_states, ob.nvme)


@pytest.mark.parametrize("stage", [2, 3])
def test_the_closed_form_is_what_is_measured_without_padding(stage):
    """closed_form (Ψ, N_d only) equals the measured bytes where no unit pads (Ψ = 8·k units)."""
    from zerospec.model.gpt import GPTConfig
    model = GPTConfig(vocab_size=64, block_size=16, n_layer=1, n_head=2, n_embd=64)
    for mode, params in (("paper", False), ("deepspeed", False), ("deepspeed", stage == 3)):
        kw = {"offload_params": "cpu"} if params else {}
        r = measure(TrainConfig.of(stage=stage, n_d=N, model=model, offload_optimizer="cpu",
                                   offload_mode=mode, **kw))
        if r.psi_padded != model.psi:
            pytest.skip("a unit pads at this N")
        ob, c = O.offload_bytes(r), O.closed_form(stage, model.psi, N, mode, params)
        assert (ob.device_states, ob.host_states, ob.moved["to_host"], ob.moved["from_host"]) == \
            (c["device"], c["host"], c["to_host"], c["from_host"]), (mode, params)


@pytest.mark.slow
@pytest.mark.claim("B5")
@pytest.mark.claim("C-I8")
def test_bytes_per_link_per_step_for_stage_2_offload_and_infinity(md_snapshot):
    """What spec/figures/offload_link_bytes.svg draws (7.5B on 16 meta GPUs, rank 0): stage 2
    moves nothing over PCIe; Offload 2M down and 2M up (paper) or 4M down (DeepSpeed); the NVMe
    tier 12M each way; Infinity's parameters 2 × 2M up per step, nothing up in param_sync (on
    NVMe: 2 × 2M read, 2M written). The
    figure's bars are these bytes, each on its direction."""
    runs = O.figure_runs()
    m = {name: ob.share for name, ob in runs.items()}
    moved = {name: ob.moved for name, ob in runs.items()}
    assert moved["ZeRO-2"]["to_host"] == moved["ZeRO-2"]["from_host"] == 0
    assert moved["ZeRO-2 + Offload (paper)"]["to_host"] == 2 * m["ZeRO-2"]
    assert moved["ZeRO-2 + Offload (DeepSpeed)"]["to_host"] == 4 * m["ZeRO-2"]
    assert moved["ZeRO-2 + Offload (DeepSpeed)"]["from_host"] == 2 * m["ZeRO-2"]
    assert moved["ZeRO-3 + Offload nvme (paper)"]["to_nvme"] == 12 * m["ZeRO-2"]
    assert moved["Infinity: ZeRO-3 + params cpu"]["from_host"] == 4 * m["ZeRO-2"]
    nvme = moved["Infinity: ZeRO-3 + params nvme"]
    assert (nvme["from_host"], nvme["from_nvme"], nvme["to_nvme"]) == \
        (4 * m["ZeRO-2"], 4 * m["ZeRO-2"], 2 * m["ZeRO-2"])
    fig = O.figure(runs, O.FIGURE_TITLE)
    bars = {a.get_gid(): a.get_height() for ax in fig.axes for a in ax.patches if a.get_gid()}
    for ax_ops, ax in zip((["gpus"], list(O.LABELS)[1:]), fig.axes):
        top = max(runs[n].moved[op] for n in runs for op in ax_ops)
        for n in runs:
            for op in ax_ops:   # each bar's height is its direction's bytes, on its axis' scale
                assert bars[f"{n}:{op}"] * top == pytest.approx(runs[n].moved[op] * max(
                    bars[f"{k}:{o}"] for k in runs for o in ax_ops))
    assert O.markdown(runs) == md_snapshot
