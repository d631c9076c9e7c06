"""ZeRO++'s quantizer and a paper-scale meta step with hpZ + qwZ + qgZ (issue 49): speed as ratios
to baselines timed in the same run.

* Quantize + dequantize 16M fp16 elements in int8 groups of 4096 (comm/quantize.py) ≤ 1.5× torch's
  own per-channel int8 quantize and dequantize of the same tensor in the same grouping
  (``torch.quantize_per_channel`` over the (groups, 4096) view, its scales from the same absmax,
  back to fp16), both on one thread.
* One meta step of the 100B shape (Table 4's 125 × 8192) on 384 GPUs as 48 nodes × 8 with hpZ,
  qwZ and qgZ ≤ 2× the plain stage-3 meta step (training/scale.py), each in a fresh meta-kernel
  cache, alternating round by round.

Run: ``pytest -o addopts="" benchmarks/test_zeropp_bench.py``.
"""
from __future__ import annotations

import warnings

import torch

from zerospec.cluster.threads import torch_threads
from zerospec.comm.quantize import dequantize, quantize
from zerospec.model.presets import PRESETS
from zerospec.runtime import metacache
from zerospec.training.scale import measure
from zerospec.training.config import TrainConfig
from zerospec.training.sections import MeshOptions, QuantOptions

NUMEL, GROUP = 1 << 24, 4096


def test_quantize_dequantize_16m_fp16_vs_torch_per_channel_int8(ratio_to, benchmark):
    """int8 block quantization there and back ≤ 1.5× torch's per-channel qint8 of the same
    groups, one thread each (module doc)."""
    x = torch.randn(NUMEL, generator=torch.Generator().manual_seed(0)).half()
    zero_points = torch.zeros(NUMEL // GROUP, dtype=torch.int64)

    def ours():
        with torch_threads(1):
            codes, inv = quantize(x, GROUP, 8)
            dequantize(codes, inv, GROUP, 8, dtype=torch.float16)

    def baseline():
        with torch_threads(1), warnings.catch_warnings():
            warnings.simplefilter("ignore")            # torch's quantized tensors: deprecated
            v = x.float().view(-1, GROUP)
            scales = (v.abs().amax(dim=1) / 127.5).double()
            q = torch.quantize_per_channel(v, scales, zero_points, 0, torch.qint8)
            q.dequantize().view(-1).half()

    ratio = ratio_to(ours, baseline, rounds=5)
    benchmark.extra_info.update(target=1.5, numel=NUMEL, group=GROUP)
    assert ratio <= 1.5


def test_meta_step_100b_on_384_gpus_with_hpz_qwz_qgz_vs_stage3(ratio_to, benchmark):
    """hpZ + qwZ + qgZ on meta ≤ 2× the plain stage-3 meta step, same model and cluster."""
    model = PRESETS["t4-100B-125x8192"].model

    def ours():
        metacache.forget()                   # each step from cold, as a process's first
        measure(TrainConfig(stage=3, n_d=384, model=model,
                            mesh=MeshOptions(gpus_per_node=8, hpz=8),
                            quant=QuantOptions(qwz=True, qgz=True)))

    def baseline():
        metacache.forget()
        measure(TrainConfig(stage=3, n_d=384, model=model, mesh=MeshOptions(gpus_per_node=8)))

    ratio = ratio_to(ours, baseline, rounds=2)
    benchmark.extra_info.update(target=2.0)
    assert ratio <= 2.0
