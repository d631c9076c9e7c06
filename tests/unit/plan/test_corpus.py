"""Public configs people bring (tests/data/corpus, SOURCES.md): each read as its owner reads it —
every key modelled, defaulted or listed with why; Ψ the published total; refusals one line."""
from __future__ import annotations

import json
import math
import pathlib

import pytest

from tests.support.cli import assert_usage_error, run_cli
from zerospec.model import hf_config as hf
from zerospec.model.presets import preset
from zerospec.paper import theory
from zerospec.paper.estimators import deepspeed_bytes
from zerospec.plan import ds_config
from zerospec.plan.deepspeed import deepspeed_table

CORPUS = pathlib.Path(__file__).parents[2] / "data" / "corpus"
HF = sorted((CORPUS / "hf").glob("*.json"))
DS = sorted((CORPUS / "deepspeed").glob("*.json"))
# published parameter counts (the model cards / safetensors totals, corpus README)
PUBLISHED = {"kqi__Llama_2_7b_hf": 6_738_415_616, "kqi__Llama_2_70b_hf": 68_976_648_192,
             "kqi__Meta_Llama_3_8B": 8_030_261_248, "llmprof__Llama-3.1-8B": 8_030_261_248,
             "thunder__Mistral-Nemo-Base-2407": 12_247_782_400,
             "llmprof__Qwen2.5-7B": 7_615_616_512, "kqi__gpt2": 124_439_808}
REFUSED_ARCH = {"kqi__gemma_2_2b", "thunder__gemma-2-9b-it", "kqi__gpt", "llmprof__Qwen3-30B-A3B",
                "llmprof__Qwen3-8B"}
# what DeepSpeed 0.19.8's config models refuse in the corpus, as they refuse it
DS_REFUSED = {
    "dsexamples__ds_zero_stage_3_config": "stage3_param_persitence_threshold is not a DeepSpeed "
                                          "0.19.8 setting",
    "dsexamples__ds_zero_stage_3_config_release": "stage3_param_persitance_threshold is not",
    "dsexamples__ds_zero_stage_infinity_config": "stage3_param_persitance_threshold is not",
    "dsexamples__Megatron-LM_scripts_ds_zero-offload_10B_config": "comm_overlap is not a DeepSpeed",
    "hf_transformers__ds_config_zero3": "reduce_bucket_size = 0; accepted: an integer >= 1",
    "megatron-deepspeed__ds_zero2_config_bf16": "bfloat16.loss_scale is not a DeepSpeed",
}


@pytest.mark.parametrize("path", HF, ids=lambda p: p.stem)
def test_every_config_json_key_is_modelled_defaulted_or_listed(path):
    """Each key of an accepted config.json is read, or listed with why; Ψ is the published total
    where one is known; other architectures are refused naming the accepted ones."""
    doc = json.loads(path.read_text())
    if path.stem in REFUSED_ARCH:
        with pytest.raises(ValueError, match="accepted: one of LlamaForCausalLM"):
            hf.parse(doc, path.name)
        return
    c = hf.parse(doc, path.name)
    listed = dict(c.not_modelled)
    read = set(doc) - set(listed)
    assert all(why for why in listed.values())
    assert read <= {*hf.DEFAULTS[c.arch], "architectures", "hidden_size", "intermediate_size",
                    "num_hidden_layers", "num_attention_heads", "vocab_size", "n_embd", "n_layer",
                    "n_head"}
    assert not {k for k, _ in c.defaulted} & set(doc)
    if path.stem in PUBLISHED:
        assert c.model.psi == PUBLISHED[path.stem]


def test_refused_architectures_exit_2_with_one_line(capsys):
    """A MoE or gemma config.json: exit 2, one line naming the architecture."""
    for stem in ("llmprof__Qwen3-30B-A3B", "kqi__gemma_2_2b"):
        assert_usage_error(capsys, "plan", "--explain", "--hf-config", str(CORPUS / "hf" / f"{stem}.json"),
                           "--stage", "3", named="accepted: one of LlamaForCausalLM")


def test_head_dim_is_read_mistral_nemo():
    """Mistral-Nemo's head_dim 128 (not 5120/32 = 160) gives its published 12,247,782,400."""
    c = hf.read(str(CORPUS / "hf" / "thunder__Mistral-Nemo-Base-2407.json"))
    assert c.model.head_dim == 128 and c.model.psi == 12_247_782_400


def test_biases_as_each_modelling_code_builds_them():
    """Llama's attention_bias adds q, k, v and o_proj biases and mlp_bias gate, up and down;
    Mistral builds none whatever the file says (listed, not read)."""
    base = json.loads((CORPUS / "hf" / "llmprof__Llama-3.1-8B.json").read_text())
    psi = hf.from_hf(base).psi
    L, d, f, kv = 32, 4096, 14336, 8 * 128
    assert hf.from_hf({**base, "attention_bias": True}).psi - psi == L * (d + 2 * kv + d)
    assert hf.from_hf({**base, "mlp_bias": True}).psi - psi == L * (2 * f + d)
    nemo = json.loads((CORPUS / "hf" / "thunder__Mistral-Nemo-Base-2407.json").read_text())
    c = hf.parse({**nemo, "attention_bias": True, "mlp_bias": True})
    assert c.model.psi == 12_247_782_400 and "attention_bias" in dict(c.not_modelled)


def test_llama_2_without_rope_theta_takes_transformers_default():
    """The published Llama-2 config.json has no rope_theta: transformers' default 10000 is used
    and said."""
    c = hf.read(str(CORPUS / "hf" / "kqi__Llama_2_7b_hf.json"))
    assert c.model.rope_theta == 10000.0 and ("rope_theta", 10000.0) in c.defaulted


def test_psi_does_not_depend_on_the_steps_sequence():
    """GPT-2's position table is its n_positions whatever --seq: 124,439,808 at seq 128 too, and
    the paper's 1.5B keeps its Ψ."""
    import dataclasses
    _, gpt2 = hf.read(str(CORPUS / "hf" / "kqi__gpt2.json"))
    short = dataclasses.replace(gpt2, block_size=128)        # what --seq 128 steps
    assert short.psi == 124_439_808
    assert sum(math.prod(shape) for _, ps in short.unit_spec() for _, shape in ps) == 124_439_808
    p = preset("1.5B").model
    assert dataclasses.replace(p, block_size=128).psi == p.psi == 1_557_611_200


def test_deepspeeds_largest_layer_is_the_largest_module():
    """Llama-3.1-405B at 16,384 GPUs: L = the embedding (128,256 × 16,384), 4L + 18Ψ/N = 8.85 GB
    as DeepSpeed's estimate_zero3_model_states_mem_needs, not a whole block's 13.2 GB."""
    m = preset("llama-3.1-405b").model
    L = m.largest_module()
    assert L == 128_256 * 16_384
    b = deepspeed_bytes(3, m.psi, 16_384, L)
    assert b == 4 * 128_256 * 16_384 + 18 * m.psi // 16_384 and round(b / 1e9, 2) == 8.85


@pytest.mark.parametrize("path", DS, ids=lambda p: p.stem)
def test_every_deepspeed_config_is_read_or_refused_as_deepspeed_does(path):
    """Each corpus config parses with every key it does not model listed, or is refused with the
    key DeepSpeed 0.19.8's config models refuse (and the nearest known one for a misspelling)."""
    if path.stem in DS_REFUSED:
        with pytest.raises(ValueError, match=DS_REFUSED[path.stem].replace("(", r"\(")):
            ds_config.read(str(path))
        return
    ds = ds_config.read(str(path))
    doc = json.loads(path.read_text())
    listed = {k.split(" ")[0] for k, _ in ds.not_modelled}
    structural = {"zero_optimization", "activation_checkpointing", "fp16", "bf16", "bfloat16",
                  *ds_config.BATCH_KEYS}
    assert set(doc) - structural <= {k.split(".")[0] for k in listed}
    zero = doc.get("zero_optimization", {})
    assert set(zero) <= ds.given | {k.split(".")[1] for k in listed if k.startswith("zero_o")}


def test_a_misspelled_key_names_the_nearest_known_one():
    with pytest.raises(ValueError, match="did you mean 'stage3_param_persistence_threshold'"):
        ds_config.read(str(CORPUS / "deepspeed" / "dsexamples__ds_zero_stage_3_config.json"))


def test_legacy_offload_keys_are_honoured():
    """cpu_offload → offload_optimizer {device: cpu}; cpu_offload_param → offload_param; with the
    key replacing it, refused as DeepSpeed refuses it."""
    ds = ds_config.parse({"train_batch_size": 8, "zero_optimization": {
        "stage": 3, "cpu_offload": True, "cpu_offload_param": True}})
    assert ds.offload_optimizer.device == "cpu" and ds.offload_param.device == "cpu"
    with pytest.raises(ValueError, match="cpu_offload and offload_optimizer together"):
        ds_config.parse({"zero_optimization": {"cpu_offload": True,
                                               "offload_optimizer": {"device": "cpu"}}})


def test_legacy_bfloat16_section_is_bf16():
    assert ds_config.parse({"bfloat16": {"enabled": True}}).precision == "bf16"
    assert ds_config.parse({}).precision == "fp32"


@pytest.mark.parametrize("text,named", [('{"zero_optimization": {"stage": 3, "reduce_bucket_size": '
                                         '1e400}}', "zero_optimization.reduce_bucket_size = inf"),
                                        ('{"train_batch_size": NaN}', "train_batch_size = nan")])
def test_nan_and_infinity_are_named_by_key(capsys, tmp_path, text, named):
    p = tmp_path / "ds.json"
    p.write_text(text)
    assert_usage_error(capsys, "plan", "--deepspeed-config", str(p), "--gpus", "8", named=named)


def test_auto_is_resolved_as_transformers_resolves_it():
    """transformers' ds_config_zero3.json ("auto"): bucket sizes from hidden_size (h², 0.9·h²,
    10·h), the micro-batch from --micro-batch, accumulation 1, fp16 "auto" false (fp32)."""
    ds = ds_config.read(str(CORPUS / "deepspeed" / "hf_transformers__ds_config_zero3_auto.json"))
    with pytest.raises(ValueError, match="give --micro-batch N"):
        ds.batch(8)
    with pytest.raises(ValueError, match=r"give --preset NAME \(or --explain with --hf-config"):
        ds.resolve()
    r = ds.resolve(hidden_size=4096, micro_batch=1)
    assert (r.reduce_bucket_size, r.stage3_prefetch_bucket_size,
            r.stage3_param_persistence_threshold) == (4096 ** 2, int(0.9 * 4096 ** 2), 40960)
    assert r.batch(8) == ds_config.Batch(1, 1, 8) and r.precision == "fp32"
    assert {k for k, _ in r.resolved} >= {"zero_optimization.reduce_bucket_size",
                                          "train_micro_batch_size_per_gpu", "fp16.enabled"}


@pytest.mark.slow
def test_auto_config_plans_with_micro_batch_1_listing_what_auto_became(capsys):
    """`plan --explain --deepspeed-config ds_config_zero3.json ("auto") --micro-batch 1`."""
    cfg = str(CORPUS / "deepspeed" / "hf_transformers__ds_config_zero3_auto.json")
    rc, out, _ = run_cli(capsys, "plan", "--explain", "--preset", "llama-3-8b", "--gpus", "8",
                         "--seq", "64", "--deepspeed-config", cfg, "--micro-batch", "1",
                         "--format", "json")
    assert rc == 0
    notes = " ".join(n for t in json.loads(out)["tables"] for n in t["notes"])
    assert "\"auto\" resolved: " in notes and "auto → 16,777,216" in notes


def test_zero2_offload_is_compared_with_zero2():
    """ZeRO-2 with optimizer offload: the GPU's model states beside ZeRO-2's own 2Ψ + 14Ψ/N."""
    from zerospec.render.format import fmt_bytes
    ds = ds_config.parse({"train_batch_size": 8, "fp16": {"enabled": True}, "zero_optimization": {
        "stage": 2, "offload_optimizer": {"device": "cpu"}}})
    psi, n = 10**9, 8
    row = {r[0]: r for r in deepspeed_table(ds, psi, n).rows}["offload_optimizer"]
    assert f"instead of {fmt_bytes(theory.model_state_bytes(2, psi, n))}" in row[2]


def test_hpz_formula_and_measured_paths_refuse_alike(capsys):
    """The ZeRO++ tutorial's hpZ 16 on 8-GPU nodes: the closed form refuses it with the measured
    step's reason."""
    cfg = str(CORPUS / "deepspeed" / "deepspeed_docs__zeropp_tutorial.json")
    named = "must divide the GPUs per node (8)"
    for model in ((), ("--preset", "llama-3-8b")):
        assert_usage_error(capsys, "plan", "--deepspeed-config", cfg, "--gpus", "32", "--machine",
                           "dgx-h100", *model, named=named)
    rc, out, _ = run_cli(capsys, "plan", "--deepspeed-config", cfg, "--gpus", "64",
                         "--gpus-per-node", "16", "--format", "json")      # 16-GPU nodes: planned
    rows = {r[0]: r for r in json.loads(out)["tables"][0]["rows"]}
    assert rc == 0 and "inside 16 ranks of a node" in rows["zero_hpz_partition_size"][2]


def test_fp32_config_gets_fp32_closed_forms(capsys, tmp_path):
    """No fp16/bf16 section is fp32 training: the paper's column is 8Ψ + 8Ψ/N at ZeRO-1 (4-byte
    parameters and gradients, K = 8), as the measured step's precision, not 4Ψ + 12Ψ/N."""
    p = tmp_path / "ds.json"
    p.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 1}}))
    rc, out, _ = run_cli(capsys, "plan", "--deepspeed-config", str(p), "--params", "8e9",
                         "--gpus", "8", "--format", "json")
    est = {t["name"]: t for t in json.loads(out)["tables"]}["estimators"]
    paper = est["rows"][0][est["columns"].index("paper")]
    assert rc == 0 and paper == 8 * 8 * 10**9 + 8 * 8 * 10**9 // 8


def test_formula_mode_uses_or_lists_every_zero_and_batch_key(capsys, tmp_path):
    """`plan --deepspeed-config` without a preset: max live parameters, overlap, contiguous
    gradients, buckets, activation keys and the batch (DeepSpeed's rule, refused when it fails)."""
    p = tmp_path / "ds.json"
    doc = {"train_batch_size": 64, "gradient_accumulation_steps": 2, "zero_optimization": {
        "stage": 3, "stage3_max_live_parameters": 10**8, "overlap_comm": True,
        "contiguous_gradients": True, "reduce_bucket_size": 10**7},
        "activation_checkpointing": {"partition_activations": True}}
    p.write_text(json.dumps(doc))
    rc, out, _ = run_cli(capsys, "plan", "--deepspeed-config", str(p), "--gpus", "8", "--format", "json")
    rows = {r[0]: r for r in json.loads(out)["tables"][0]["rows"]}
    assert rc == 0 and {"stage3_max_live_parameters", "overlap_comm", "contiguous_gradients",
                        "reduce_bucket_size", "partition_activations"} <= set(rows)
    assert rows["batch"][1] == "4 × 2 × 8"
    p.write_text(json.dumps({**doc, "train_micro_batch_size_per_gpu": 3}))
    assert_usage_error(capsys, "plan", "--deepspeed-config", str(p), "--gpus", "8",
                       named="train_batch_size 64 != train_micro_batch_size_per_gpu 3")


@pytest.mark.slow
def test_explain_says_what_a_config_json_left_to_defaults_and_did_not_model(capsys):
    """`plan --explain --hf-config` (Llama-2-7b): rope_theta defaulted and rope_scaling not
    modelled, each said in the explanation."""
    rc, out, _ = run_cli(capsys, "plan", "--explain", "--hf-config",
                         str(CORPUS / "hf" / "kqi__Llama_2_7b_hf.json"), "--gpus", "8",
                         "--stage", "3", "--seq", "16", "--format", "json")
    notes = " ".join(n for t in json.loads(out)["tables"] for n in t["notes"])
    assert rc == 0 and "rope_theta = 10000.0" in notes and "rope_scaling (rescales" in notes


@pytest.mark.slow
def test_auto_micro_batch_in_the_closed_form_with_a_preset(capsys):
    """`plan --deepspeed-config (auto) --preset --micro-batch 2`: the flag fills the "auto" there
    too, and contradicts a number in the file."""
    cfg = str(CORPUS / "deepspeed" / "hf_transformers__ds_config_zero3_auto.json")
    rc, out, _ = run_cli(capsys, "plan", "--deepspeed-config", cfg, "--preset", "t4-1.16B-24x1920",
                         "--gpus", "8", "--micro-batch", "2", "--format", "json")
    rows = {r[0]: r for r in json.loads(out)["tables"][0]["rows"]}
    assert rc == 0 and rows["batch"][1] == "2 × 1 × 8"
    fixed = str(CORPUS / "deepspeed" / "megatron-deepspeed__sequence_parallel_ds_config_gbs256_mbs8_"
                             "log1_zero3.json")
    assert_usage_error(capsys, "plan", "--deepspeed-config", fixed, "--preset", "t4-1.16B-24x1920",
                       "--gpus", "8", "--micro-batch", "2", named="--micro-batch 2 contradicts")


def test_hf_config_alone_points_to_explain_only(capsys):
    """`plan --hf-config X` names --explain, not a --preset the config.json already replaces."""
    rc, out, err = run_cli(capsys, "plan", "--hf-config", str(CORPUS / "hf" / "kqi__gpt2.json"))
    assert rc == 2 and err.strip().endswith("add --explain") and "--preset" not in err


def test_largest_module_keeps_llamas_q_k_v_apart():
    """The Llama family's q, k and v are three modules (LlamaAttention), GPT-2's c_attn one: with
    a 16-token vocabulary and d_ff 16 the largest module is one 64 × 64 projection, not the fused
    64 × 192."""
    from zerospec.model.family import GPTConfig
    kw = dict(vocab_size=16, block_size=8, n_layer=1, n_head=4, n_embd=64, d_ff=16)
    llama = GPTConfig(**kw, norm="rmsnorm", mlp="swiglu", positions="rope", tie_embeddings=False,
                      bias=False)
    assert llama.largest_module() == 64 * 64
    assert GPTConfig(**kw).largest_module() == 64 * 192 + 192     # GPT-2's Conv1D c_attn + bias


def test_auto_transformers_does_not_fill_is_deepspeeds_default():
    """DeepSpeedConfigModel drops "auto": overlap_comm's stage-dependent default, hpZ off, and at
    stage 2 the stage-3 buckets (transformers fills those at stage 3 only)."""
    for stage, overlap in ((2, False), (3, True)):
        ds = ds_config.parse({"zero_optimization": {
            "stage": stage, "overlap_comm": "auto", "zero_hpz_partition_size": "auto",
            "stage3_prefetch_bucket_size": "auto"}})
        assert (ds.overlap_comm, ds.zero_hpz_partition_size) == (overlap, 1)
        assert ("zero_optimization.stage3_prefetch_bucket_size" in ds.auto) == (stage == 3)
