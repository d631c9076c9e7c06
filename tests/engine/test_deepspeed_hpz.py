"""DeepSpeed's hpZ as a peer on CPU, and what DeepSpeed 0.19 says of MiCS (spec/mics.md).

Marked ``deepspeed`` (left out of the default run; ``pytest -m deepspeed``), skipped without it.
DeepSpeed's CPU accelerator runs ZeRO-3 with ``zero_hpz_partition_size`` on gloo (fp32 here; the
peer refuses fp16, which DeepSpeed's CPU accelerator does not run). N = 4 as 2 nodes × 2, h = 2.

Tolerance, derived as in tests/engine/test_deepspeed.py: at N = 4 the engines add four ranks'
gradients in different orders (gloo's order depends on an element's offset, and the engines'
buffers differ), so zerospec's hpZ and DeepSpeed's agree bit for bit on step 1's losses and then
within 1e-6 relative (losses) and lr/10 (weights). hpZ itself does no arithmetic, in either
engine: each equals its own ZeRO-3 bit for bit — zerospec's in tests/unit/zero/test_hpz.py,
DeepSpeed's here. DeepSpeed's quantizer (qwZ, qgZ) has no CPU build: not run here.
"""
from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

from tests.engine.test_deepspeed import MISSING
from tests.engine.test_peers import assert_close_every_step
from zerospec.model.gpt import ODD
from zerospec.training.config import TrainConfig
from zerospec.training.sections import MeshOptions, OptimOptions

pytestmark = [pytest.mark.deepspeed, pytest.mark.skipif(MISSING is not None, reason=MISSING or "")]

CFG = TrainConfig(stage=3, n_d=4, model=ODD, steps=3, timeout=300,
                  optim=OptimOptions(precision="fp32"), mesh=MeshOptions(gpus_per_node=2, hpz=2))
RUN = ("zerospec", "paper")     # zerospec's Adam arithmetic; nothing kept whole or gathered ahead


@functools.lru_cache(maxsize=None)
def rows(hpz: int, weights: bool = True) -> dict:
    from zerospec.testing.deepspeed_peer import compare
    return compare(CFG.replace(hpz=hpz), (3,), runs=(RUN,), weights=weights)[0]


def test_deepspeed_hpz_matches_zerospec_hpz_within_the_derived_tolerance():
    """Step 1's losses equal bit for bit; every step within 1e-6 relative and lr/10."""
    row = rows(2)
    ds = row["deepspeed"][RUN]
    assert row["losses"][0] == ds["losses"][0]
    assert_close_every_step(row, ds, CFG.adam.lr)


def test_deepspeed_hpz_is_deepspeeds_zero3_bit_for_bit():
    """DeepSpeed's hpZ (h = 2) and its plain ZeRO-3 train the same weights, every step: hpZ
    moves no arithmetic, in DeepSpeed too."""
    a, b = rows(2)["deepspeed"][RUN]["weights"], rows(1)["deepspeed"][RUN]["weights"]
    assert all(a[s].keys() == b[s].keys() and all(torch.equal(a[s][k], b[s][k]) for k in a[s])
               for s in range(CFG.steps))


def test_deepspeed_hpz_gathers_backwards_parameters_from_a_1_over_h_shard():
    """DeepSpeed's comms logger records an all-gather's input: in backward, with h = 2 of N = 4,
    each is twice ZeRO-3's (a secondary shard is 1/h of a unit, a primary 1/N), forward's are
    unchanged — zerospec's ledger the same for its hpZ."""
    def inputs(row, phase):
        return sorted(size for op, size, c in row["deepspeed"][RUN]["comms"][0][-1][phase]
                      for _ in range(c) if op == "all_gather")
    h2, h1 = rows(2, weights=False), rows(1, weights=False)
    assert inputs(h2, "forward") == inputs(h1, "forward")
    assert inputs(h2, "backward") == [2 * s for s in inputs(h1, "backward")]
    ours = [r.group for r in h2["records"][0] if r.phase == "backward" and r.op == "all_gather"]
    assert ours and set(ours) == {"hpz"}


def test_deepspeed_019_rejects_mics_shard_size_naming_its_removal():
    """DeepSpeed 0.19 removed MiCS: a config with ``mics_shard_size`` is refused, so FSDP2's HSDP
    is MiCS's peer here (tests/engine/test_hsdp.py)."""
    from zerospec.testing.deepspeed_peer import available
    assert available() is None
    from deepspeed.runtime.config import DeepSpeedConfigError, _reject_removed_config_keys
    with pytest.raises(DeepSpeedConfigError, match="MiCS ZeRO-3 sharding has been removed"):
        _reject_removed_config_keys({"zero_optimization": {"stage": 3, "mics_shard_size": 2}})
