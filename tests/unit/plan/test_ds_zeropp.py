"""`plan --deepspeed-config`'s ZeRO++ and MiCS keys: zero_hpz_partition_size, zero_quantized_weights,
zero_quantized_gradients and mics_shard_size each reach the meta step and change what it moves
(spec/zeropp.md, spec/nodes.md, spec/mics.md)."""
from __future__ import annotations

import functools
import json

import pytest
import torch

from tests.support.cli import assert_usage_error, run_cli
from zerospec.model.gpt import GPTConfig
from zerospec.model.hf_config import to_hf
from zerospec.plan import ds_config
from zerospec.plan.deepspeed import MICS_NOTE, config_kwargs, deepspeed_table
from zerospec.plan.nodes import node_bytes
from zerospec.training.scale import measure
from zerospec.training.config import TrainConfig

SMALL = GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=64)
BASE = {"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": True}}
# DeepSpeed's defaults keep every unit of a small model whole (persistence) or gathered from
# forward to backward (reuse distance): off, so that stage 3 gathers as the paper's
PLAIN3 = {"stage3_param_persistence_threshold": 0, "stage3_max_reuse_distance": 0}


@functools.lru_cache(maxsize=None)
def stepped(keys: tuple = (), stage: int = 3):
    """The config BASE + zero_optimization {stage, **keys} through config_kwargs onto 8 meta GPUs
    as 2 nodes × 4; (the step, the lines not modelled)."""
    ds = ds_config.parse({**BASE, "zero_optimization": {"stage": stage, **PLAIN3, **dict(keys)}})
    kw, left = config_kwargs(ds, 8, gpus_per_node=4)
    kw.pop("micro_batch")
    return measure(TrainConfig.of(stage=stage, n_d=8, model=SMALL, **kw)), left


@pytest.mark.claim("D7")
def test_hpz_partition_size_keeps_backwards_all_gather_inside_the_node():
    """zero_hpz_partition_size = 4: backward's all-gather crosses nodes with 0 bytes (> 0 without)."""
    plain, hpz = (node_bytes(stepped(k)[0]) for k in ((), (("zero_hpz_partition_size", 4),)))
    assert plain.node_total("backward all-gather", "inter") > 0
    assert hpz.node_total("backward all-gather", "inter") == 0
    assert stepped((("zero_hpz_partition_size", 4),))[0].memory(0).peak["secondary16"] > 0


@pytest.mark.claim("D7")
def test_quantized_weights_halve_the_weight_all_gathers_bytes():
    """zero_quantized_weights: forward's all-gathers go as int8, exactly half of the fp16 bytes,
    plus fp32 scales."""
    plain, qwz = stepped()[0], stepped((("zero_quantized_weights", True),))[0]
    fwd = {dt: sum(r.bytes_sent for k in range(8) for r in
                   run.comm_ledger(range(8)).records(k, phase="forward", op="all_gather")
                   if r.dtype == dt) for run, dt in ((plain, torch.float16), (qwz, torch.int8))}
    assert 2 * fwd[torch.int8] == fwd[torch.float16] > 0


@pytest.mark.claim("D7")
def test_quantized_gradients_reduce_through_an_all_to_all_with_fewer_bytes_across():
    """zero_quantized_gradients: the gradients go through int4 all-to-alls; fewer bytes cross."""
    plain, qgz = (node_bytes(stepped(k)[0]) for k in ((), (("zero_quantized_gradients", True),)))
    assert stepped((("zero_quantized_gradients", True),))[0].comm_ledger([0]).records(
        0, op="all_to_all")
    g = "gradient reduce-scatter / all-to-all"
    assert 0 < qgz.node_total(g, "inter") < plain.node_total(g, "inter")


def test_mics_shard_size_shards_over_p_and_says_deepspeed_refuses_the_key():
    """mics_shard_size = 4: model states of N_d = 4 (more than at 8), only the replica all-reduce
    crosses nodes, and the notes say DeepSpeed 0.19 refuses the key."""
    (plain, _), (mics, left) = stepped(), stepped((("mics_shard_size", 4),))
    assert mics.model_states(0) > plain.model_states(0)
    nb = node_bytes(mics)
    assert {c for c in nb.sent if nb.node_total(c, "inter")} == {"replica all-reduce (MiCS)"}
    assert MICS_NOTE in left and "removed" in MICS_NOTE and "HSDP" in MICS_NOTE


def test_hpz_beside_mics_gathers_backward_inside_the_node_of_a_group_spanning_two():
    """zero_hpz_partition_size = 2 with mics_shard_size = 8 on 2 nodes × 4: MiCS's group spans
    both nodes; backward's all-gather crosses with 0 bytes (> 0 with MiCS alone), the secondary
    shards are held, and the closed form's hpZ row counts what it spares over the group of p."""
    keys = (("zero_hpz_partition_size", 2), ("mics_shard_size", 8))
    (mics, _), (both, _) = stepped(keys[1:]), stepped(keys)
    assert node_bytes(mics).node_total("backward all-gather", "inter") > 0
    assert node_bytes(both).node_total("backward all-gather", "inter") == 0
    assert both.memory(0).peak["secondary16"] > 0 == mics.memory(0).peak["secondary16"]
    ds = ds_config.parse({**BASE, "zero_optimization": {"stage": 3, **dict(keys)}})
    row = {r[0]: r for r in deepspeed_table(ds, 10 ** 9, 16, 4).rows}["zero_hpz_partition_size"]
    assert "875M fp16 elements (M(p−1)/p, MiCS's group)" in row[2]   # 10⁹·7/8


@pytest.mark.parametrize("gpus_per_node", [None, 4])
def test_an_hpz_that_does_not_divide_mics_shard_size_is_refused_on_both_paths(gpus_per_node):
    """zero_hpz_partition_size = 4 with mics_shard_size = 2: the closed form and the measured
    step refuse it alike, naming both keys."""
    ds = ds_config.parse({**BASE, "zero_optimization": {"stage": 3, "zero_hpz_partition_size": 4,
                                                        "mics_shard_size": 2}})
    named = r"zero_hpz_partition_size\)=4 with shard_group \(mics_shard_size\)=2: .* accepted hpz: 1, 2"
    with pytest.raises(ValueError, match=named):
        deepspeed_table(ds, 10 ** 9, 8, 4)
    if gpus_per_node:
        kw, _ = config_kwargs(ds, 8, gpus_per_node=gpus_per_node)
        kw.pop("micro_batch")
        with pytest.raises(ValueError, match=named):
            TrainConfig.of(stage=3, n_d=8, model=SMALL, **kw)


def test_the_keys_are_zero3_settings():
    """At stage 2 the keys reach no step: each is listed as having no effect."""
    keys = (("zero_quantized_weights", True), ("mics_shard_size", 4))
    ds = ds_config.parse({**BASE, "zero_optimization": {"stage": 2, **dict(keys)}})
    kw, left = config_kwargs(ds, 8, gpus_per_node=4)
    assert not {"qwz", "shard_group"} & set(kw)
    assert sum("a ZeRO-3 setting" in line for line in left) == 2


def test_hpz_without_the_gpus_per_node_is_refused_naming_the_key():
    """zero_hpz_partition_size > 1 needs nodes: refused, naming --gpus-per-node and --machine."""
    ds = ds_config.parse({**BASE, "zero_optimization": {"stage": 3, "zero_hpz_partition_size": 8}})
    with pytest.raises(ValueError, match="zero_hpz_partition_size = 8 .* --gpus-per-node G or "
                                         "--machine NAME"):
        config_kwargs(ds, 16)


@pytest.mark.parametrize("key,value,named", [
    ("zero_hpz_partition_size", 0, "zero_hpz_partition_size = 0; accepted: an integer >= 1"),
    ("zero_quantized_weights", 1, "zero_quantized_weights = 1; accepted: true or false"),
    ("mics_shard_size", 0, "mics_shard_size = 0; accepted: -1 (off) or an integer >= 1"),
])
def test_values_deepspeed_refuses_are_refused(key, value, named):
    """A bad value of a ZeRO++ / MiCS key: refused, naming the key, the value and what is accepted."""
    import re
    with pytest.raises(ValueError, match=re.escape(named)):
        ds_config.parse({"zero_optimization": {key: value}})


def _files(tmp_path, zero: dict, precision: str = "fp16") -> tuple[str, str]:
    ds, hf = tmp_path / "ds.json", tmp_path / "config.json"
    prec = {precision: {"enabled": True}} if precision != "fp32" else {}
    ds.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, **prec,
                              "zero_optimization": {"stage": 3, **PLAIN3, **zero}}))
    hf.write_text(json.dumps(to_hf(SMALL, "GPT2LMHeadModel")))
    return str(ds), str(hf)


def _node_rows(out: str) -> dict[str, list[str]]:
    """The bytes-inside-vs-across table of `plan --explain`'s markdown: collective → cells."""
    table = out.split("### Bytes inside vs across nodes")[1].split("\n\n")[1]
    return {r.split("|")[1].strip(): [c.strip() for c in r.split("|")[2:-1]]
            for r in table.splitlines()[2:]}


def test_explain_steps_the_configs_hpz_on_the_given_nodes(capsys, tmp_path):
    """`plan --explain --deepspeed-config` with zero_hpz_partition_size = 4 on --gpus-per-node 4:
    backward's all-gather sends 0 bytes across (> 0 without the key)."""
    rows = {}
    for h in (1, 4):
        ds, hf = _files(tmp_path, {"zero_hpz_partition_size": h})
        rc, out, _ = run_cli(capsys, "plan", "--explain", "--hf-config", hf, "--gpus", "8",
                             "--deepspeed-config", ds, "--gpus-per-node", "4")
        assert rc == 0, out
        rows[h] = _node_rows(out)["backward all-gather"][1]
    assert rows[4] == "0" != rows[1]


def test_explain_refuses_quantized_weights_on_fp32_parameters(capsys, tmp_path):
    """A config with zero_quantized_weights and neither fp16 nor bf16: exit 2, one line."""
    ds, hf = _files(tmp_path, {"zero_quantized_weights": True}, precision="fp32")
    assert_usage_error(capsys, "plan", "--explain", "--hf-config", hf, "--gpus", "8",
                       "--deepspeed-config", ds, "--gpus-per-node", "4",
                       named="got precision='fp32' (fp32 parameters); accepted: 'fp16', 'bf16'")


def test_a_flag_contradicting_the_config_is_refused(capsys, tmp_path):
    """--hpz 2 beside a config's zero_hpz_partition_size = 4: exit 2, naming both."""
    ds, hf = _files(tmp_path, {"zero_hpz_partition_size": 4})
    assert_usage_error(capsys, "plan", "--explain", "--hf-config", hf, "--gpus", "8",
                       "--deepspeed-config", ds, "--gpus-per-node", "4", "--hpz", "2",
                       named="--hpz 2 contradicts")


@pytest.mark.slow
def test_the_measured_table_beside_a_preset_says_what_leaves_node_0(capsys, tmp_path):
    """`plan --deepspeed-config --preset 1.5B --gpus 16 --gpus-per-node 8`: the measured table
    adds node 0's bytes across per collective; with zero_hpz_partition_size = 8 backward's
    all-gather sends 0 of them."""
    rows = {}
    for h in (1, 8):
        ds, _ = _files(tmp_path, {"zero_hpz_partition_size": h})
        rc, out, _ = run_cli(capsys, "plan", "--deepspeed-config", ds, "--preset", "1.5B",
                             "--gpus", "16", "--gpus-per-node", "8", "--format", "json")
        assert rc == 0, out
        table = next(t for t in json.loads(out)["tables"] if t["name"] == "deepspeed_measured")
        rows[h] = {r[0].strip(): r[1] for r in table["rows"]}
    assert rows[8]["of which backward all-gather"] == "0 B" != rows[1]["of which backward all-gather"]
    left = {h: int(r["bytes leaving node 0 per step"].split(" B")[0].replace(",", ""))
            for h, r in rows.items()}
    assert 0 < left[8] < left[1]
