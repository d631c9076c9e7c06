"""Presets of published models (zerospec/model/presets.py): Ψ exact, and at the headline size."""
from __future__ import annotations

import math

import pytest

from zerospec.model.presets import PAPER, PUBLISHED, TABLE4

# the exact count of each published checkpoint's weights (the sum of its tensors' sizes)
PUBLISHED_PSI = {
    "llama-2-7b": 6_738_415_616, "llama-2-13b": 13_015_864_320, "llama-2-70b": 68_976_648_192,
    "llama-3-8b": 8_030_261_248, "llama-3.1-8b": 8_030_261_248, "llama-3-70b": 70_553_706_496,
    "llama-3.1-405b": 405_853_388_800, "mistral-7b-v0.1": 7_241_732_096,
    "qwen2.5-7b": 7_615_616_512, "qwen2.5-72b": 72_706_203_648,
    "gpt-3-175b": 174_604_259_328,   # no published count: 12·L·d² + 13·L·d + (V + T)·d + 2·d
}


@pytest.mark.parametrize("name", PUBLISHED)
def test_a_published_presets_psi_is_its_checkpoints_exact_parameter_count(name):
    """Ψ from the config equals the published weights' count and the units' element count."""
    p = PUBLISHED[name]
    assert p.psi == PUBLISHED_PSI[name]
    assert p.psi == sum(math.prod(s) for _, ps in p.model.unit_spec() for _, s in ps)


@pytest.mark.parametrize("name", PUBLISHED)
def test_a_published_presets_psi_is_within_4_percent_of_its_headline_size(name):
    """Ψ is the size the model is named by, to 4%: names round loosely (Llama-2-7B is 6.74B,
    Llama-2-70B 68.98B, Mistral's "7.3B" 7.24B); Qwen2.5's cards truncate exactly (7.61B, 72.7B)."""
    p = PUBLISHED[name]
    assert abs(p.psi - p.label) <= 0.04 * p.label
    if name.startswith("qwen"):
        digits = len(f"{p.label / 1e9:g}".partition(".")[2])
        assert math.floor(p.psi / 1e9 * 10 ** digits) / 10 ** digits == p.label / 1e9


def test_gpt3_is_gpt2s_block_at_96_layers_of_width_12288():
    """GPT-3 175B: 96 layers, d 12288, 96 heads, vocab 50257, context 2048, tied: Ψ ≈ 175B."""
    m = PUBLISHED["gpt-3-175b"].model
    assert (m.n_layer, m.n_embd, m.n_head, m.vocab_size, m.block_size, m.tie_embeddings) == \
        (96, 12288, 96, 50257, 2048, True) and m.gpt2_only == []
    d, L = 12288, 96
    assert m.psi == 12 * L * d * d + 13 * L * d + (50257 + 2048) * d + 2 * d


def test_the_paper_presets_keep_their_psi():
    """Adding the family changed no paper or Table 4 preset's Ψ."""
    assert [PAPER[n].psi for n in ("1.5B", "7.5B", "128B", "1T")] == \
        [1_557_611_200, 7_499_274_240, 128_480_755_712, 1_007_988_403_200]
    assert TABLE4["t4-60B-75x8192"].psi == 60_826_075_136


def test_llama3_8b_measures_a_stage3_step_on_64_gpus_on_meta():
    """One ZeRO-3 step of Llama-3-8B on meta tensors at N_d = 64: 16Ψ/N_d model-state bytes per rank."""
    from zerospec.training.scale import measure
    from zerospec.training.config import TrainConfig
    p = PUBLISHED["llama-3-8b"]
    r = measure(TrainConfig(stage=3, n_d=64, model=p.model))
    assert r.psi == p.psi
    assert r.model_states(0) == 16 * sum(u.chunk for u in r.units)   # (2 + 2 + 12)·Ψ_p/N_d
