"""plan/ds_config.py: one reader of DeepSpeed configs — settings, DeepSpeed's batch rule, and every
key it does not model listed, never ignored."""
from __future__ import annotations

import json

import pytest

from tests.support.cli import assert_usage_error, run_cli
from zerospec.model.presets import preset
from zerospec.plan import ds_config
from zerospec.plan.deepspeed import config_kwargs


def test_defaults_are_deepspeeds_and_overlap_comm_follows_the_stage():
    """An empty zero section reads as DeepSpeed 0.19.8's defaults; overlap_comm is on at stage 3
    only (DeepSpeed's overlap_comm_valid); no fp16/bf16 section is fp32."""
    ds = ds_config.parse({"train_batch_size": 8})
    assert (ds.stage, ds.reduce_bucket_size, ds.allgather_bucket_size, ds.contiguous_gradients,
            ds.stage3_prefetch_bucket_size, ds.stage3_param_persistence_threshold,
            ds.stage3_max_live_parameters, ds.stage3_max_reuse_distance, ds.precision) == \
        (0, 5 * 10**8, 5 * 10**8, True, 5 * 10**7, 10**5, 10**9, 10**9, "fp32")
    assert not ds.overlap_comm and not ds.given
    assert ds_config.parse({"zero_optimization": {"stage": 3}}).overlap_comm
    assert ds_config.parse({"bf16": {"enabled": True}}).precision == "bf16"
    assert ds_config.parse({"fp16": {"enabled": True}}).precision == "fp16"


@pytest.mark.parametrize("keys,n_d,batch", [
    ({"train_micro_batch_size_per_gpu": 4}, 8, (4, 1, 32)),
    ({"train_batch_size": 64}, 8, (8, 1, 64)),
    ({"train_batch_size": 64, "gradient_accumulation_steps": 2}, 8, (4, 2, 64)),
    ({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2}, 8, (2, 4, 64)),
    ({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 3}, 8, (2, 3, 48)),
    ({"train_batch_size": 48, "train_micro_batch_size_per_gpu": 2,
      "gradient_accumulation_steps": 3}, 8, (2, 3, 48)),
])
def test_batch_keys_resolve_by_deepspeeds_rule(keys, n_d, batch):
    """Two of train_batch_size, the micro-batch and the accumulation steps give the third:
    train_batch_size = micro × gas × N_d."""
    b = ds_config.parse(keys).batch(n_d)
    assert (b.micro, b.gas, b.train) == batch


@pytest.mark.parametrize("keys,n_d,named", [
    ({"train_batch_size": 48, "train_micro_batch_size_per_gpu": 2,
      "gradient_accumulation_steps": 3}, 4, "train_batch_size 48 != train_micro_batch_size_per_gpu 2 "
                                            "× gradient_accumulation_steps 3 × N_d 4"),
    ({"train_batch_size": 10, "train_micro_batch_size_per_gpu": 3}, 1, "10 != "),
    ({"train_batch_size": 4}, 8, "train_batch_size 4 != train_micro_batch_size_per_gpu 0"),
    ({"gradient_accumulation_steps": 2}, 8, "neither train_batch_size nor"),
])
def test_inconsistent_batch_keys_are_refused_naming_the_values(keys, n_d, named):
    """A batch DeepSpeed's assertion refuses is refused here, with all the values."""
    with pytest.raises(ValueError, match=named.replace("(", r"\(")):
        ds_config.parse(keys).batch(n_d)


def test_every_key_it_does_not_model_is_listed_with_why():
    """Keys it does not read at all are listed; the modelled ones (ZeRO++'s and MiCS's:
    test_ds_zeropp.py; the offload sections: test_ds_offload.py) are not, but their settings
    that change no byte are, each with why."""
    ds = ds_config.parse({
        "train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "AdamW"}, "foo": 1,
        "fp16": {"enabled": True, "loss_scale": 0},
        "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": True},
                              "offload_param": {"device": "cpu"}, "zero_hpz_partition_size": 8,
                              "zero_quantized_weights": True, "zero_quantized_gradients": True,
                              "mics_shard_size": 8, "sub_group_size": 10**9,
                              "reduce_bucket_size": 10**6},
        "activation_checkpointing": {"partition_activations": True, "number_checkpoints": 4}})
    left = dict(ds.not_modelled)
    assert left["zero_optimization.offload_optimizer.pin_memory"].startswith("page-locked")
    assert set(left) == {"optimizer", "foo", "zero_optimization.offload_optimizer.pin_memory",
                         "zero_optimization.sub_group_size",
                         "activation_checkpointing.number_checkpoints", "fp16.loss_scale"}
    assert ds.given == {"stage", "reduce_bucket_size", "partition_activations",
                        "zero_hpz_partition_size", "zero_quantized_weights",
                        "zero_quantized_gradients", "mics_shard_size", "offload_optimizer",
                        "offload_param"}
    _, notes = config_kwargs(ds, 8, gpus_per_node=8)
    assert sum("pin_memory" in n for n in notes) == 1


@pytest.mark.parametrize("doc,named", [
    ({"zero_optimization": {"stage": True}}, "zero_optimization.stage = True"),
    ({"zero_optimization": {"overlap_comm": 1}},
     "zero_optimization.overlap_comm = 1; accepted: true or false"),
    ({"train_micro_batch_size_per_gpu": 0}, "train_micro_batch_size_per_gpu = 0; accepted: an integer >= 1"),
    ({"fp16": {"enabled": True}, "bf16": {"enabled": True}}, "fp16 and bf16 are both enabled"),
    ({"activation_checkpointing": {"cpu_checkpointing": "yes"}}, "cpu_checkpointing = 'yes'"),
])
def test_values_deepspeed_refuses_are_refused_naming_key_and_value(doc, named):
    with pytest.raises(ValueError, match=named):
        ds_config.parse(doc)


def test_the_configs_settings_reach_the_meta_step():
    """Micro-batch (DeepSpeed's rule), precision, buckets and contiguous gradients become
    scale.measure's keywords; P_a on a step without checkpoints is reported, not dropped."""
    ds = ds_config.parse({"train_batch_size": 64, "gradient_accumulation_steps": 2,
                          "bf16": {"enabled": True},
                          "activation_checkpointing": {"partition_activations": True},
                          "zero_optimization": {"stage": 2, "reduce_bucket_size": 10**7}})
    kw, left = config_kwargs(ds, 8)
    assert kw == {"precision": "bf16", "micro_batch": 4, "bucket_elements": 10**7,
                  "contiguous_gradients": True}
    assert any(n.startswith("gradient_accumulation_steps 2") for n in left)
    assert any(n.startswith("partition_activations") and "has none" in n for n in left)
    kw, left = config_kwargs(ds, 8, checkpoint_activations=1)   # P_a where there are checkpoints
    assert kw["partition_activations"] and "cpu_checkpointing" not in kw
    assert not any(n.startswith("partition_activations") for n in left)


# DeepSpeed 0.19.8, deepspeed/runtime/activation_checkpointing/checkpointing.py: each key acts
# alone (CheckpointFunction.forward: `if PARTITION_ACTIVATIONS` … `elif CPU_CHECKPOINT`), and
# mp_size is 1 without an mpu, so none of them depends on N_m
ACT = ("partition_activations", "cpu_checkpointing", "contiguous_memory_optimization")
OURS = {"partition_activations": "partition_activations", "cpu_checkpointing": "cpu_checkpointing",
        "contiguous_memory_optimization": "contiguous_checkpoints"}


@pytest.mark.parametrize("on", [("partition_activations",), ("cpu_checkpointing",),
                                ("partition_activations", "cpu_checkpointing"),
                                ("partition_activations", "contiguous_memory_optimization"),
                                ACT], ids="+".join)
def test_the_activation_keys_reach_the_step_as_deepspeed_reads_them_at_every_n_m(on):
    """Each activation_checkpointing key that is on becomes its switch, at N_m = 1 as at
    N_m = 2 (nothing read depends on N_m), and a TrainConfig takes them on one GPU; cpu_checkpointing
    without partition_activations is DeepSpeed's unpartitioned copy to the host."""
    from zerospec.model.gpt import GPTConfig
    from zerospec.training.config import TrainConfig
    ds = ds_config.parse({"train_micro_batch_size_per_gpu": 1,
                          "activation_checkpointing": {k: True for k in on}})
    kw, left = config_kwargs(ds, 1, checkpoint_activations=1)
    assert {k for k in OURS.values() if kw.get(k)} == {OURS[k] for k in on}
    assert not any(n.startswith(ACT) for n in left)
    m = GPTConfig(vocab_size=37, block_size=12, n_layer=2, n_head=4, n_embd=16)
    kw.pop("micro_batch")
    for n_m in (1, 2):
        assert TrainConfig.of(model=m, n_d=1, n_m=n_m, checkpoint_activations=1, **kw)


def test_contiguous_checkpoints_without_partitioned_activations_is_deepspeeds_error():
    """DeepSpeed's checkpointing.configure() asserts contiguous_memory_optimization needs
    partition_activations: on a step with checkpoints the reader raises, naming both keys;
    without checkpoints (configure never runs) it is listed, not an error."""
    ds = ds_config.parse({"train_micro_batch_size_per_gpu": 1, "activation_checkpointing": {
        "contiguous_memory_optimization": True, "cpu_checkpointing": True}})
    with pytest.raises(ValueError, match="contiguous_memory_optimization = true needs "
                                         "activation_checkpointing.partition_activations"):
        config_kwargs(ds, 4, checkpoint_activations=1)
    _, left = config_kwargs(ds, 4)
    assert any(n.startswith("contiguous_memory_optimization") for n in left)


def _write(tmp_path, doc) -> str:
    p = tmp_path / "ds.json"
    p.write_text(json.dumps(doc))
    return str(p)


def test_explain_with_a_deepspeed_config_steps_its_micro_batch_and_precision(capsys, tmp_path):
    """`plan --explain --deepspeed-config`: the step explained is the config's (micro-batch 2 per
    GPU from train_batch_size 16 on 8 GPUs, bf16), the same peak as the explainer given them, and
    not the peak of one sequence."""
    from zerospec.plan.explain import explain
    cfg = _write(tmp_path, {"train_batch_size": 16, "bf16": {"enabled": True},
                            "zero_optimization": {"stage": 3}})
    rc, out, _ = run_cli(capsys, "plan", "--explain", "--preset", "t4-1.16B-24x1920", "--gpus", "8",
                         "--seq", "64", "--deepspeed-config", cfg, "--format", "json")
    assert rc == 0
    t = {t["name"]: t for t in json.loads(out)["tables"]}["explain_phases"]
    assert "micro-batch 2" in t["title"] and "bf16" in t["title"]
    kw, _ = config_kwargs(ds_config.read(cfg), 8)
    kw.pop("micro_batch")
    ex = explain("t4-1.16B-24x1920", 3, 8, 32 * 10**9, "x", seq=64, micro_batch=2, settings=kw)
    assert max(r[1] for r in t["rows"]) == ex.peak
    one = explain("t4-1.16B-24x1920", 3, 8, 32 * 10**9, "x", seq=64, micro_batch=1, settings=kw)
    assert one.peak < ex.peak
    assert any(n.startswith("Not modelled:") for n in t["notes"])


def test_closed_forms_beside_a_preset_are_for_the_presets_psi(capsys, tmp_path):
    """`plan --deepspeed-config X --preset 1.5B`: the closed-form section is for Ψ of 1.5B (the
    model measured below it), not the default 7.5B."""
    from zerospec.render.format import fmt_count
    cfg = _write(tmp_path, {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 1}})
    rc, out, _ = run_cli(capsys, "plan", "--deepspeed-config", cfg, "--preset", "1.5B", "--gpus", "8",
                         "--format", "json")
    assert rc == 0
    titles = [t["title"] for t in json.loads(out)["tables"]]
    psi = fmt_count(preset("1.5B").psi)
    assert f"Ψ = {psi}" in titles[0] and f"Ψ = {psi}" in titles[-1]
    assert not any("7.5" in x for x in titles)
    assert_usage_error(capsys, "plan", "--deepspeed-config", cfg, "--preset", "1.5B", "--params", "2B",
                       named="--preset sets Ψ")


def test_a_stage_or_micro_batch_contradicting_the_config_is_refused(capsys, tmp_path):
    cfg = _write(tmp_path, {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 3}})
    base = ("plan", "--explain", "--preset", "llama-3-8b", "--gpus", "8", "--deepspeed-config", cfg)
    assert_usage_error(capsys, *base, "--stage", "2", named="--stage 2 contradicts")
    assert_usage_error(capsys, *base, "--micro-batch", "1", named="--micro-batch 1 contradicts")


def test_the_closed_form_section_lists_the_keys_it_does_not_model(capsys, tmp_path):
    """`plan --deepspeed-config` without a preset still names every key it does not read."""
    cfg = _write(tmp_path, {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {
        "stage": 2, "sub_group_size": 10, "offload_optimizer": {"device": "cpu", "fast_init": True}}})
    rc, out, _ = run_cli(capsys, "plan", "--deepspeed-config", cfg, "--gpus", "8", "--format", "json")
    notes = " ".join(json.loads(out)["tables"][0]["notes"])
    assert rc == 0 and "zero_optimization.sub_group_size (not read" in notes
    assert "zero_optimization.offload_optimizer.fast_init (how the NVMe files" in notes


def test_explain_refuses_deepspeeds_contiguous_checkpoints_without_partitioning_in_one_line(
        capsys, tmp_path):
    """`plan --explain --deepspeed-config` with contiguous_memory_optimization but not
    partition_activations, on a step with checkpoints: exit 2, one line naming the key (the error
    DeepSpeed's configure() raises); a selective --activation-checkpointing mode has checkpoints
    too."""
    cfg = _write(tmp_path, {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2},
                            "activation_checkpointing": {"contiguous_memory_optimization": True}})
    for ac in (("--checkpoint-activations", "1"), ("--activation-checkpointing", "selective-op")):
        assert_usage_error(capsys, "plan", "--explain", "--preset", "t4-1.16B-24x1920", "--gpus",
                           "8", "--seq", "64", "--deepspeed-config", cfg, *ac,
                           named="contiguous_memory_optimization = true needs")


def test_explain_runs_a_torchtitan_mode_as_the_steps_one_checkpointing_rule(capsys, tmp_path):
    """`plan --explain --activation-checkpointing selective-op`, alone and with DeepSpeed's
    activation keys (which act on its checkpoints): the step runs with that one rule, not with
    Megatron's segments beside it (the pair the table refuses)."""
    cfg = _write(tmp_path, {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2},
                            "activation_checkpointing": {"cpu_checkpointing": True}})
    base = ("plan", "--explain", "--preset", "t4-1.16B-24x1920", "--gpus", "8", "--seq", "64",
            "--activation-checkpointing", "selective-op", "--format", "json")
    for extra in (("--stage", "2"), ("--deepspeed-config", cfg)):
        rc, out, err = run_cli(capsys, *base, *extra)
        assert rc == 0, err
        assert json.loads(out)["summary"]["peak_allocated_bytes"] > 0
