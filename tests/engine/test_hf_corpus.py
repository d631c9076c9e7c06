"""The corpus's config.json files (tests/data/corpus/hf) against transformers itself: the model
transformers builds from each file (on meta) has exactly Ψ parameters, and its largest single
module (DeepSpeed's model_to_params rule) is GPTConfig.largest_module. Marked ``hf`` and ``slow``
(tests/engine/test_hf.py says why)."""
from __future__ import annotations

import importlib.util
import json
import pathlib

import pytest

from zerospec.model import hf_config as hf

CORPUS = pathlib.Path(__file__).parents[1] / "data" / "corpus" / "hf"
pytestmark = [pytest.mark.hf, pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                                 reason="needs transformers (pip install -e '.[hf]')")]


def _accepted():
    out = []
    for path in sorted(CORPUS.glob("*.json")):
        doc = json.loads(path.read_text())
        try:
            hf.parse(doc)
        except ValueError:
            continue
        out.append(pytest.param(doc, id=path.stem))
        if doc["architectures"][0] in ("LlamaForCausalLM", "MistralForCausalLM") and \
                doc["hidden_size"] <= 4096:   # the bias keys, as each modelling code reads them
            out.append(pytest.param({**doc, "attention_bias": True, "mlp_bias": True},
                                    id=f"{path.stem}+biases"))
    # a shape where the fused q/k/v would be the largest module: HF keeps them apart
    out.append(pytest.param({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                             "hidden_size": 64, "intermediate_size": 16, "num_hidden_layers": 1,
                             "num_attention_heads": 4, "vocab_size": 16,
                             "attention_bias": True}, id="tiny-llama-qkv"))
    return out


def _built(doc):
    import torch
    import transformers as tf
    cfg = tf.CONFIG_MAPPING[doc["model_type"]].from_dict(doc)
    with torch.device("meta"):
        return tf.AutoModelForCausalLM.from_config(cfg)


@pytest.mark.parametrize("doc", _accepted())
def test_transformers_builds_psi_parameters_and_the_same_largest_module(doc):
    """Ψ (head_dim, biases, tied head, position table as the reader takes them) equals the
    parameters of transformers' own model; DeepSpeed's L equals its largest module."""
    model = _built(doc)
    cfg = hf.from_hf(doc)
    assert sum(p.numel() for p in model.parameters()) == cfg.psi
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    assert largest == cfg.largest_module()
