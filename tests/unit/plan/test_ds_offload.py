"""DeepSpeed's offload sections in plan (zerospec/plan/ds_config.py, deepspeed.py, offload.py):
offload_optimizer / offload_param read with DeepSpeed 0.19.8's defaults, passed to the meta step,
DeepSpeed's pinned swap buffers counted as host memory, and each bad input refused in one line."""
from __future__ import annotations

import json

import pytest

from tests.support.cli import assert_usage_error, run_cli, tiny_hf_config
from zerospec.model.gpt import GPTConfig
from zerospec.plan import ds_config
from zerospec.plan.deepspeed import config_kwargs
from zerospec.plan.offload import pinned_buffers
from zerospec.training.config import TrainConfig
from zerospec.training.sections import OffloadOptions, OptimOptions
from zerospec.training.scale import measure

NVME = {"device": "nvme", "nvme_path": "/local_nvme"}
TINY = GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=64)


def test_offload_sections_read_with_deepspeeds_defaults():
    """Absent or device none: no offload; nvme: 4 optimizer buffers sized by DeepSpeed, 5 of 1e8
    parameter elements (deepspeed/runtime/zero/offload_config.py)."""
    assert ds_config.parse({}).offload_optimizer is None
    assert ds_config.parse({"zero_optimization": {"offload_param": {"device": "none"}}}
                           ).offload_param is None
    ds = ds_config.parse({"zero_optimization": {"stage": 3, "offload_optimizer": NVME,
                                                "offload_param": NVME}})
    o, p = ds.offload_optimizer, ds.offload_param
    assert (o.device, o.buffer_count, o.buffer_size) == ("nvme", 4, None)
    assert (p.device, p.buffer_count, p.buffer_size) == ("nvme", 5, 10**8)
    left = dict(ds.not_modelled)
    assert left["zero_optimization.offload_param.nvme_path"].startswith("where the swap files")


@pytest.mark.parametrize("section,named", [
    ({"device": "gpu"}, "offload_optimizer.device = 'gpu'; accepted: none, cpu, nvme"),
    ({"device": "cpu", "buffer_sise": 4}, "offload_optimizer.buffer_sise is not a DeepSpeed"),
    ({"device": "nvme"}, "device = 'nvme' needs zero_optimization.offload_optimizer.nvme_path"),
    ({"device": "cpu", "ratio": 2}, "offload_optimizer.ratio = 2; accepted: a number in [0, 1]"),
    ({**NVME, "buffer_count": -1}, "offload_optimizer.buffer_count = -1; accepted: an integer"),
])
def test_bad_offload_values_are_refused_naming_key_and_value(section, named):
    with pytest.raises(ValueError, match=named.replace("(", r"\(").replace("[", r"\[")):
        ds_config.parse({"zero_optimization": {"stage": 2, "offload_optimizer": section}})


def test_offload_reaches_the_step_in_deepspeeds_mode():
    """offload_optimizer cpu → ZeRO-Offload in DeepSpeed's mode (fp32 gradients down),
    offload_param → parameter offload; DeepSpeed's bucket, contiguous-gradient and stage-3
    settings pass with it, the persistence threshold and reuse distance too (ZeRO-Offload and
    ZeRO-Infinity combine with them), none dropped."""
    ds = ds_config.parse({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {
        "stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}})
    kw, left = config_kwargs(ds, 4)
    assert kw["offload_optimizer"] == "cpu" and kw["offload_mode"] == "deepspeed"
    assert kw["offload_params"] == "cpu" and kw["contiguous_gradients"] is True
    assert kw["bucket_elements"] and kw["stage3_persistence_threshold"] == 100_000
    assert kw["stage3_max_reuse_distance"] == 1_000_000_000
    assert not any("offload_param: not measured" in n for n in left)


@pytest.mark.parametrize("zero,named", [
    ({"stage": 2, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}},
     "offload_param (device cpu) offloads ZeRO-3's parameter partitions: it needs stage 3, got "
     "stage 2"),
    ({"stage": 1, "offload_optimizer": {"device": "cpu"}},
     "offload_optimizer (device cpu) is built on ZeRO-2 and ZeRO-3 here; accepted: stage 2 or 3"),
    ({"stage": 3, "offload_param": {"device": "cpu"}}, "offload_param without offload_optimizer"),
])
def test_offload_without_the_stage_it_needs_is_one_clear_error(capsys, tmp_path, zero, named):
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "zero_optimization": zero}))
    assert_usage_error(capsys, "plan", "--explain", "--hf-config", tiny_hf_config(tmp_path),
                       "--gpus", "4", "--deepspeed-config", str(cfg), named=named)


def _explain(capsys, tmp_path, zero: dict, *flags) -> dict:
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
                               "zero_optimization": zero}))
    rc, out, err = run_cli(capsys, "plan", "--explain", "--hf-config", tiny_hf_config(tmp_path),
                           "--gpus", "4", "--deepspeed-config", str(cfg), *flags,
                           "--format", "json")
    assert rc == 0, err
    return {t["name"]: t for t in json.loads(out)["tables"]}


def _rows(table) -> dict[str, int]:
    return {r[0]: int(r[1].replace(",", "")) for r in table["rows"]}


def test_the_configs_offload_is_the_step_measured(capsys, tmp_path):
    """The explained step is ZeRO-Offload's in DeepSpeed's mode: its device model states, host
    bytes and PCIe bytes per direction are those of measure(offload_optimizer='cpu',
    offload_mode='deepspeed'), not of the plain stage."""
    from zerospec.model.hf_config import read as read_hf
    rows = _rows(_explain(capsys, tmp_path, {"stage": 2, "offload_optimizer": {"device": "cpu"}}
                          )["offload_bytes"])
    model = read_hf(tiny_hf_config(tmp_path))[1]
    r = measure(TrainConfig(stage=2, n_d=4, model=model, optim=OptimOptions(precision="bf16"),
                            offload=OffloadOptions(offload_optimizer="cpu",
                                                   offload_mode="deepspeed")))
    led = r.comm_ledger([0])
    assert rows["device: model states after setup"] == r.model_states(0) < measure(TrainConfig(stage=2,
                                                                                               n_d=4,
                                                                                               model=model,
                                                                                               optim=OptimOptions(precision="bf16"))).model_states(0)
    assert rows["host: peak the step holds"] == r.host(0).peak_total > 0
    assert rows["per step: PCIe down (device → host)"] == led.link_bytes(0, op="to_host") \
        == 2 * rows["per step: PCIe up (host → device)"]     # fp32 gradients down, bf16 up


def test_pinned_swap_buffers_count_against_host_memory(capsys, tmp_path):
    """offload_optimizer on NVMe: DeepSpeed's buffer_count pinned buffers of the largest fp32
    partition are host memory, added to what the step holds; the swap files are NVMe bytes."""
    t = _explain(capsys, tmp_path, {"stage": 3, "offload_optimizer": {**NVME, "buffer_count": 6}}
                 )["offload_bytes"]
    rows = _rows(t)
    units = TrainConfig(stage=3, n_d=4, model=_model(tmp_path)).units()
    pinned = 6 * max(u.chunk for u in units) * 4
    assert rows["host: DeepSpeed's pinned swap buffers (offload_optimizer)"] == pinned
    assert rows["host: peak + pinned buffers"] == rows["host: peak the step holds"] + pinned
    assert rows["NVMe: swap files"] == 12 * sum(u.chunk for u in units)
    assert rows["per step: NVMe read (NVMe → host)"] == rows["NVMe: swap files"]


def _model(tmp_path):
    from zerospec.model.hf_config import read as read_hf
    return read_hf(tiny_hf_config(tmp_path))[1]


def test_parameter_buffers_are_buffer_count_times_buffer_size():
    """offload_param on NVMe: buffer_count × buffer_size elements of the parameters' dtype."""
    ds = ds_config.parse({"bf16": {"enabled": True}, "zero_optimization": {
        "stage": 3, "offload_optimizer": {"device": "cpu"},
        "offload_param": {**NVME, "buffer_count": 3, "buffer_size": 10**5}}})
    units = TrainConfig(stage=3, n_d=4, model=TINY).units()
    assert pinned_buffers(ds, units, "bf16") == {"offload_param": 3 * 10**5 * 2}


@pytest.mark.parametrize("zero,named", [
    ({"offload_optimizer": {"device": "cpu"}, "offload_param": {**NVME, "buffer_size": 100}},
     "offload_param.buffer_size = 100 elements is smaller than the largest unit's partition"),
    ({"offload_optimizer": {**NVME, "buffer_count": 3}},
     "offload_optimizer.buffer_count = 3 is fewer than the 4 tensors Adam swaps"),
])
def test_buffers_smaller_than_the_largest_unit_are_refused_naming_both(capsys, tmp_path, zero,
                                                                      named):
    """Before the step runs (DeepSpeed would assert mid-run): one line naming the setting and
    the largest unit's partition."""
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1,
                               "zero_optimization": {"stage": 3, **zero}}))
    assert_usage_error(capsys, "plan", "--explain", "--hf-config", tiny_hf_config(tmp_path),
                       "--gpus", "4", "--deepspeed-config", str(cfg), named=named)


def test_plan_offload_flags_step_offload_and_a_contradiction_is_refused(capsys, tmp_path):
    """--offload-optimizer without a config steps the paper's mode (2 bytes down, 2 up); a flag
    that contradicts the config (DeepSpeed's mode) is refused, naming both."""
    rc, out, err = run_cli(capsys, "plan", "--explain", "--hf-config", tiny_hf_config(tmp_path),
                           "--gpus", "4", "--stage", "2", "--offload-optimizer", "cpu",
                           "--format", "json")
    assert rc == 0, err
    rows = _rows({t["name"]: t for t in json.loads(out)["tables"]}["offload_bytes"])
    assert rows["per step: PCIe down (device → host)"] == rows["per step: PCIe up (host → device)"]
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {
        "stage": 2, "offload_optimizer": {"device": "cpu"}}}))
    assert_usage_error(capsys, "plan", "--explain", "--hf-config", tiny_hf_config(tmp_path),
                       "--gpus", "4", "--deepspeed-config", str(cfg), "--offload-mode", "paper",
                       named="--offload-mode paper contradicts")
    assert_usage_error(capsys, "plan", "--explain", "--hf-config", tiny_hf_config(tmp_path),
                       "--gpus", "4", "--stage", "2", "--offload-params", "cpu",
                       "--offload-optimizer", "cpu", named="it needs stage 3")


@pytest.mark.slow
def test_the_measured_table_beside_a_preset_counts_host_nvme_and_pinned_bytes():
    """`plan --deepspeed-config --preset` (no --explain): with offload_optimizer on NVMe the
    measured table adds the host's peak, the pinned buffers and their sum, the NVMe files and
    each link direction; its device model states are ZeRO-3 Offload's (2Ψ/N of fp32 here: 4Ψ/N)."""
    from zerospec.plan.deepspeed import deepspeed_measured_table
    ds = ds_config.parse({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {
        "stage": 3, "offload_optimizer": {**NVME, "buffer_count": 4}}})
    rows = dict((r[0], r[1]) for r in deepspeed_measured_table(ds, "1.5B", 16).rows)
    r = measure(TrainConfig(stage=3, n_d=16, model=preset_model("1.5B"),
                            optim=OptimOptions(precision="fp32"),
                            offload=OffloadOptions(offload_optimizer="nvme",
                                                   offload_mode="deepspeed")))
    pinned = 4 * max(u.chunk for u in r.units) * 4
    from zerospec.render.format import fmt_bytes as gb
    assert rows["  + DeepSpeed's pinned swap buffers (offload_optimizer)"] == gb(pinned)
    assert rows["host memory per GPU with pinned buffers"] == gb(r.host(0).peak_total + pinned)
    assert rows["NVMe per GPU (swap files)"] == gb(12 * sum(u.chunk for u in r.units))
    assert rows["PCIe down (device → host) per step"] == \
        f"{r.comm_ledger([0]).link_bytes(0, op='to_host'):,} B"


def preset_model(name):
    from zerospec.model.presets import preset
    return preset(name).model


def test_parameter_offload_to_nvme_is_stepped_with_its_pinned_buffers(capsys, tmp_path):
    """offload_param on NVMe, nothing persistent or reused: the step keeps its parameters in NVMe
    files (no model state on the device), and buffer_count × buffer_size bf16 elements of pinned
    buffers count as host."""
    t = _explain(capsys, tmp_path, {"stage": 3, "offload_optimizer": {"device": "cpu"},
                                    "stage3_param_persistence_threshold": 0,
                                    "stage3_max_reuse_distance": 0,
                                    "offload_param": {**NVME, "buffer_count": 2,
                                                      "buffer_size": 20_000}})["offload_bytes"]
    rows = _rows(t)
    assert rows["device: model states after setup"] == 0
    assert rows["host: DeepSpeed's pinned swap buffers (offload_param)"] == 2 * 20_000 * 2
    units = TrainConfig(stage=3, n_d=4, model=_model(tmp_path)).units()
    assert rows["NVMe: swap files"] == 2 * sum(u.chunk for u in units)     # fp16 chunks
    assert rows["per step: NVMe read (NVMe → host)"] == 2 * rows["NVMe: swap files"]


def test_with_a_persistence_threshold_the_persistent_units_stay_on_the_device(capsys, tmp_path):
    """offload_param with stage3_param_persistence_threshold (1,000 elements: the tiny model's
    final LayerNorm): the units at most that large stay whole on the device (DeepSpeed's
    ``_partition_param`` allocates a persistent partition on the local device), the others'
    chunks go to the NVMe files."""
    t = _explain(capsys, tmp_path, {"stage": 3, "offload_optimizer": {"device": "cpu"},
                                    "stage3_param_persistence_threshold": 1000,
                                    "offload_param": NVME})["offload_bytes"]
    rows = _rows(t)
    units = TrainConfig(stage=3, n_d=4, model=_model(tmp_path)).units()
    kept = [u for u in units if u.numel <= 1000]
    assert kept and len(kept) < len(units)
    assert rows["device: model states after setup"] == 2 * sum(u.padded for u in kept)
    assert rows["NVMe: swap files"] == 2 * sum(u.chunk for u in units if u not in kept)
