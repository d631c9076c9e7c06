"""model/hf_config.py: a Hugging Face config.json as a decoder shape; a missing field or an unknown
architecture refused by name."""
from __future__ import annotations

import dataclasses

import json

import pytest

from tests.support.cli import assert_usage_error, run_cli
from zerospec.model.hf_config import ARCHITECTURES, from_hf, to_hf
from zerospec.model.presets import PAPER, PUBLISHED, preset


def _arch(cfg) -> str:
    if cfg.norm == "layernorm":
        return "GPT2LMHeadModel"
    return "Qwen2ForCausalLM" if cfg.qkv_bias else "LlamaForCausalLM"


@pytest.mark.parametrize("name", [*PUBLISHED, *PAPER])
def test_every_preset_round_trips_through_a_config_json(name, tmp_path):
    """preset → config.json (written, read back as JSON) → GPTConfig == the preset, Ψ included
    (a config.json's model runs today's attention kernel, which the paper's presets do not)."""
    cfg = dataclasses.replace(preset(name).model, attention="sdpa")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(to_hf(cfg, _arch(cfg))))
    back = from_hf(json.loads(path.read_text()))
    assert back == cfg and back.psi == preset(name).psi


# Llama-3-8B's config.json fields, as the Hugging Face file has them (values of the preset)
LLAMA3_8B = {"architectures": ["LlamaForCausalLM"], "attention_bias": False, "hidden_size": 4096,
             "intermediate_size": 14336, "max_position_embeddings": 8192, "num_attention_heads": 32,
             "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
             "rope_theta": 500000.0, "tie_word_embeddings": False, "vocab_size": 128256,
             "hidden_act": "silu", "torch_dtype": "bfloat16", "model_type": "llama"}
QWEN25_7B = {"architectures": ["Qwen2ForCausalLM"], "hidden_size": 3584, "intermediate_size": 18944,
             "max_position_embeddings": 131072, "num_attention_heads": 28, "num_hidden_layers": 28,
             "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
             "tie_word_embeddings": False, "vocab_size": 152064}
GPT2_XL = {"architectures": ["GPT2LMHeadModel"], "n_embd": 1600, "n_layer": 48, "n_head": 25,
           "n_positions": 1024, "n_ctx": 1024, "n_inner": None, "vocab_size": 50257,
           "layer_norm_epsilon": 1e-05}


def test_hand_written_configs_are_the_presets():
    """Files as Hugging Face writes them: Llama-3-8B (8 kv heads of 32), Qwen2.5-7B (q/k/v biases
    from the architecture, no attention_bias field), GPT-2 XL (tied, 4d MLP)."""
    assert from_hf(LLAMA3_8B) == preset("llama-3-8b").model
    assert from_hf(LLAMA3_8B).kv_heads == 8
    assert from_hf(QWEN25_7B) == preset("qwen2.5-7b").model
    gpt2 = from_hf(GPT2_XL)
    assert gpt2.psi == 1_557_611_200 and gpt2.tie_embeddings and gpt2.ff == 4 * 1600


@pytest.mark.parametrize("field", ["hidden_size", "intermediate_size", "num_hidden_layers",
                                   "num_attention_heads", "vocab_size"])
def test_a_missing_field_is_named(field):
    """A shape key is never taken from a config class's default (another model's shape)."""
    doc = {k: v for k, v in LLAMA3_8B.items() if k != field}
    with pytest.raises(ValueError, match=f"LlamaForCausalLM needs the field '{field}', which is missing"):
        from_hf(doc, "c.json")


def test_an_unknown_architecture_lists_the_accepted_ones():
    with pytest.raises(ValueError, match="architectures = \\['BertModel'\\]; accepted: one of "
                                         + ", ".join(ARCHITECTURES)):
        from_hf({"architectures": ["BertModel"]})


def _file(tmp_path, doc) -> str:
    p = tmp_path / "config.json"
    p.write_text(json.dumps(doc))
    return str(p)


@pytest.mark.parametrize("change,named", [
    ({"num_key_value_heads": 5}, "num_attention_heads 32 is not divisible by num_key_value_heads 5"),
    ({"vocab_size": None}, "needs the field 'vocab_size'"),
    ({"architectures": ["T5"]}, "accepted: one of LlamaForCausalLM"),
    ({"hidden_size": 4100}, "n_embd=4100 must be divisible by n_head=32"),
    ({"attention_bias": "yes"}, "attention_bias = 'yes'; accepted: true or false"),
    ({"rope_theta": float("inf")}, "rope_theta = inf; accepted: a finite number"),
])
def test_bad_config_json_is_one_line_exit_2(capsys, tmp_path, change, named):
    """`plan --explain --hf-config`: a bad file exits 2 with one line naming the field."""
    path = _file(tmp_path, {**LLAMA3_8B, **change})
    assert_usage_error(capsys, "plan", "--explain", "--hf-config", path, "--stage", "3",
                       named=f"{path}: " if "accepted" not in named else named)
    assert_usage_error(capsys, "plan", "--explain", "--hf-config", path, "--stage", "3", named=named)


def test_explain_of_a_config_json_is_the_presets(capsys, tmp_path):
    """The step explained from Llama-3-8B's config.json has the preset's peak, byte for byte."""
    runs = []
    for model in (("--hf-config", _file(tmp_path, LLAMA3_8B)), ("--preset", "llama-3-8b")):
        rc, out, _ = run_cli(capsys, "plan", "--explain", *model, "--gpus", "8", "--stage", "3",
                             "--seq", "128", "--format", "json")
        assert rc == 0
        runs.append({t["name"]: t for t in json.loads(out)["tables"]}["explain_buffers"]["rows"])
    assert runs[0] == runs[1]


@pytest.mark.parametrize("arch", ["LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"])
def test_llamas_family_without_the_tie_field_has_its_own_head(arch):
    """No tie_word_embeddings in a Llama-family file: an untied head, as transformers builds it
    (LlamaConfig, MistralConfig and Qwen2Config default ``tie_word_embeddings=False`` in their
    configuration_*.py __init__): Ψ holds the head's V·d weights beside the embedding's."""
    doc = {k: v for k, v in LLAMA3_8B.items() if k != "tie_word_embeddings"}
    doc["architectures"] = [arch]
    untied, tied = from_hf(doc), from_hf({**doc, "tie_word_embeddings": True})
    assert not untied.tie_embeddings
    assert untied.psi - tied.psi == 128256 * 4096                  # V·d: the head's own matrix
    if arch == "LlamaForCausalLM":
        assert untied.psi == 8_030_261_248                         # Llama-3-8B's published Ψ
