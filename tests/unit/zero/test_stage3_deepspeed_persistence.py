"""DeepSpeed's ``stage3_param_persistence_threshold`` at its boundary (zerospec/zero/stage3_deepspeed.py).

DeepSpeed keeps a parameter whole when ``param.ds_numel <= param_threshold``
(``DeepSpeedZeRoOffload.mark_persistent_parameters``, deepspeed/runtime/zero/parameter_offload.py):
at most the threshold, in elements as the model has them, before any padding. A persistent unit is
never gathered in forward and is all-gathered once per step, in param_sync.

ODD on N_d = 2: units embed (735 elements, padded 736), two blocks (2895, padded 2896), ln_f (30).
"""
from __future__ import annotations

import pytest

from zerospec.model.gpt import ODD
from zerospec.training.config import TrainConfig
from zerospec.training.sections import VariantOptions
from zerospec.training.run import train


def gathered(threshold: int) -> tuple[list[int], list[int]]:
    """One step of ODD at stage 3 on 2 GPUs: (the elements rank 0 all-gathers in param_sync,
    in forward)."""
    r = train(TrainConfig(stage=3, n_d=2, model=ODD, steps=1,
                          variants=VariantOptions(stage3_persistence_threshold=threshold)))
    return ([x.numel for x in r.comm.records(0, op="all_gather", phase="param_sync")],
            [x.numel for x in r.comm.records(0, op="all_gather", phase="forward")])


@pytest.mark.parametrize("threshold,persistent,forward", [
    (29, [], [736, 2896, 2896, 30, 736]),
    (30, [30], [736, 2896, 2896, 736]),
    (2894, [736, 30], [2896, 2896]),
    (2895, [736, 2896, 2896, 30], []),
], ids=["29-one-below-ln_f", "30-ln_f", "2894-one-below-the-blocks", "2895-the-blocks"])
def test_a_unit_of_exactly_threshold_elements_is_kept_whole(threshold, persistent, forward):
    """A threshold equal to a unit's element count keeps it whole (all-gathered only in
    param_sync, never in forward); one less does not. The blocks' 2895 elements, not their
    padded 2896, are compared: at 2895 they persist."""
    assert gathered(threshold) == (persistent, forward)
