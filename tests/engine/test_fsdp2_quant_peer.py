"""qwZ and qgZ under the FSDP2 flavour against ``fully_shard`` with custom collectives
(tests/engine/fsdp2_quant_comms.py) written from the owner's protocol (torch 2.13
``_fsdp_api.py``: ``AllGather``, ``ReduceScatter``; ``FSDPModule.set_custom_all_gather`` /
``set_custom_reduce_scatter``), on gloo, with a quantizer written there too (DeepSpeed's
block-symmetric rule, ``csrc/includes/quantization_utils.h``).

Why groups of one element (``quant_group_size`` 1): FSDP2 shards each parameter on dim 0, so a
rank's flat copy-in holds each parameter's rows r·⌈d/N⌉…; zerospec shards each unit's flat vector
in N contiguous chunks. The two rows hold different elements, so with larger groups their scales
differ and the values with them: only groups of one element are laid out alike on both sides
(each element's own scale). Where groups lie in the flavour is
tests/unit/zero/test_fsdp2_quant.py's, from the rule, on the run's own rows.

Tolerance, derived: **N = 2, one node → equal bits.** Per element, both sides compute
s = 2^b/(2|x|) in fp32, q = round(x·s) clamped, and q·(1/s) in fp32; qwZ casts it to bf16 (the
parameters' dtype, as FSDP2's all-gather output); qgZ's one hop (one node: the hop across nodes
moves nothing) sums two dequantized fp32 terms, one order, and halves them, exact. The rest is
tests/engine/test_fsdp2_flavour.py's argument. With hpZ (h = 2 on N = 4) FSDP2 hands the same
custom all-gather the post-forward mesh's gathers too, and the reduce-scatter sums four terms:
equal for this model and data, as test_fsdp2_flavour.py's hpZ case. Marked ``slow``: gloo
processes.
"""
from __future__ import annotations

import pytest

from tests.engine.test_peers import assert_equal_every_step
from zerospec.model.gpt import ODD
from zerospec.testing.fsdp2_peer import compare
from zerospec.training.config import TrainConfig
from zerospec.training.run import train

pytestmark = pytest.mark.slow

CFG = TrainConfig.of(stage=3, n_d=2, model=ODD, steps=3, timeout=120, precision="bf16",
                     flavour="fsdp2", quant_group_size=1)


@pytest.mark.parametrize("kw, comms", [
    ({"qwz": True}, ("Int8AllGather", None)),
    ({"qgz": True}, (None, "Int4ReduceScatter")),
    ({"qwz": True, "qgz": True}, ("Int8AllGather", "Int4ReduceScatter")),
    ({"qwz": True, "n_d": 4, "gpus_per_node": 4, "hpz": 2}, ("Int8AllGather", None)),
], ids=["qwZ", "qgZ", "qwZ+qgZ", "qwZ+hpZ"])
def test_quantized_flavour_trains_as_fully_shard_with_custom_quantized_comms_bit_for_bit(kw, comms):
    """Losses and every fp32 weight after every step equal FSDP2's with the custom comms
    (module docstring), and the quantization moved them off the unquantized run's."""
    from tests.engine import fsdp2_quant_comms   # here: collecting would import FSDP2 (its doc)
    comms = tuple(getattr(fsdp2_quant_comms, name)() if name else None for name in comms)
    row = compare(CFG.replace(**kw), comms)
    assert_equal_every_step(row["zerospec"], row["peer"])
    assert row["zerospec"]["losses"][-1] != train(CFG).losses[-1]
